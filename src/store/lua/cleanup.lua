-- cleanup.lua: delete what is left of an instance that holds no slice and no
-- idempotency key any more.
--
-- KEYS[1] slices  ZSet  registry of slice numbers (must be empty)
-- KEYS[2] seen    ZSet  legacy raw idempotency keys (must be empty: the roll trims them)
-- KEYS[3] result  ZSet  the ranking: must rank no member (no total above 0)
-- KEYS[4] changes Stream  the change stream: kept for ARGV[1] ms more, then gone
-- KEYS[5..]       the instance's other derived keys (members, ranked, refs, totals, the
--                 digest table `seen:ids`, and `dense` on dense_rank boards)
--
-- ARGV[1] how long the change stream stays (ms)
--
-- A ranking that still ranks members is one a resummarize run has not yet replaced by
-- the empty sum (its swap was refused: another roller raised the watermark meanwhile). Only
-- that swap writes their `left` entries in the change feed, so the instance waits for
-- it: the next roll swaps the empty ranking in and cleans up. (An incremental instance's
-- expiry removes every member with its last slice field.)
--
-- The digest table holds nothing more once the registry is empty: fold.lua logs every
-- digest it remembers in the forget log of a slice it registers in the same call, and the
-- roll drains a slice's log before it drops the slice, so no log outlives its slice.
--
-- The change stream stays for ARGV[1] ms, so that its readers still read its last
-- entries (the `left` of the members the instance held), then Redis deletes it; an
-- instance that takes events again before then writes to it again (changes.lua ends its
-- time to live).
--
-- `meta` is kept: its watermark keeps judging late events for the instance, so a copy of
-- an old event sent after the cleanup is still late, never counted again.
-- Runs atomically with respect to apply: an event applied before this call left a
-- registered slice, so nothing is deleted; one applied after it starts afresh.
-- Returns 1 when the instance was cleaned up, 0 when it still holds data.
if redis.call('ZCARD', KEYS[1]) > 0 or redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
if redis.call('ZCOUNT', KEYS[3], '(0', '+inf') > 0 then return 0 end
redis.call('DEL', KEYS[3])
if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('PEXPIRE', KEYS[4], ARGV[1]) end
for i = 5, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
