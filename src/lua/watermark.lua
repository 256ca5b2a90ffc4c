-- watermark.lua: raise an instance's expiry watermark and list the slices to expire.
--
-- KEYS[1] meta    Hash  expired_through, last_roll, layout
-- KEYS[2] slices  ZSet  registry of slice numbers
--
-- ARGV[1] target watermark (slice number: slice_of(now) - N)
-- ARGV[2] now (epoch ms) of the roll
--
-- The watermark never goes back: a roll at an earlier time changes nothing. Raising it
-- before expiring means the apply script rejects events for those slices as late, so no
-- event lands in a slice being expired.
-- Returns { watermark, slice numbers at or below it that still exist, oldest first }.
local cur = tonumber(redis.call('HGET', KEYS[1], 'expired_through'))
local w = tonumber(ARGV[1])
if cur and cur >= w then
  w = cur
else
  redis.call('HSET', KEYS[1], 'expired_through', ARGV[1])
end
local last = tonumber(redis.call('HGET', KEYS[1], 'last_roll'))
if not last or last < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'last_roll', ARGV[2])
end
redis.call('HSETNX', KEYS[1], 'layout', '1')
return { w, redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', w) }
