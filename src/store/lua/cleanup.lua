-- cleanup.lua: delete what is left of an instance that holds no slice and no
-- idempotency key any more.
--
-- KEYS[1] slices  ZSet  registry of slice numbers (must be empty)
-- KEYS[2] seen    ZSet  legacy raw idempotency keys (must be empty: the roll trims them)
-- KEYS[3..]       the instance's derived keys (result, members, ranked, refs, totals, the
--                 digest table `seen:ids`, and `dense` on dense_rank boards)
--
-- The digest table holds nothing more once the registry is empty: apply.lua logs every
-- digest it remembers in the forget log of a slice it registers in the same call, and the
-- roll drains a slice's log before it drops the slice, so no log outlives its slice.
--
-- `meta` is kept: its watermark keeps judging late events for the instance, so a copy of
-- an old event sent after the cleanup is still late, never counted again.
-- Runs atomically with respect to apply: an event applied before this call left a
-- registered slice, so nothing is deleted; one applied after it starts afresh.
-- Returns 1 when the instance was cleaned up, 0 when it still holds data.
if redis.call('ZCARD', KEYS[1]) > 0 or redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
for i = 3, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
