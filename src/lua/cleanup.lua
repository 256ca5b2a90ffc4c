-- cleanup.lua: delete what is left of an instance that holds no slice any more.
--
-- KEYS[1] slices  ZSet  registry of slice numbers (must be empty)
-- KEYS[2..]       the instance's other keys (meta, seen, result, members, ranked, refs, totals)
--
-- Runs atomically with respect to apply: an event applied before this call left a
-- registered slice, so nothing is deleted; one applied after it starts a fresh instance.
-- Returns 1 when the instance was deleted, 0 when it still holds slices.
if redis.call('ZCARD', KEYS[1]) > 0 then return 0 end
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
