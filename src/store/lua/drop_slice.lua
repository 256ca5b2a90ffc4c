-- drop_slice.lua: remove an emptied slice from the registry.
--
-- KEYS[1] slices  ZSet  registry of slice numbers
-- KEYS[2] slice   Hash  the slice (Redis deletes a Hash when its last field goes)
--
-- ARGV[1] the slice number
--
-- Returns 1 when the slice was empty and is now unregistered, 0 when fields remain.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
