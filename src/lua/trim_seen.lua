-- trim_seen.lua: forget one chunk of idempotency keys whose time has passed.
--
-- KEYS[1] seen  ZSet  idempotency key -> epoch ms from which it may be forgotten
--
-- ARGV[1] now (epoch ms)   ARGV[2] most keys to forget in this call
--
-- Returns how many keys were forgotten (less than ARGV[2]: nothing more is due).
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids > 0 then redis.call('ZREM', KEYS[1], unpack(ids)) end
return #ids
