-- watermark.lua: raise an instance's expiry watermark and list the slices to expire.
--
-- KEYS[1] meta    Hash  expired_through, last_roll, layout, settings
-- KEYS[2] slices  ZSet  registry of slice numbers
--
-- ARGV[1] target watermark (slice number: slice_of(now) - N)
-- ARGV[2] now (epoch ms) of the roll
-- ARGV[3] settings fingerprint of the caller's board definition
--
-- The watermark never goes back: a roll at an earlier time changes nothing. Raising it
-- before expiring means the apply script rejects events for those slices as late, so no
-- event lands in a slice being expired. Everything is read and checked before the first
-- write, so a call that fails has written nothing.
-- Returns { watermark, slice numbers at or below it that still exist, oldest first }.
local stored = redis.call('HMGET', KEYS[1], 'expired_through', 'last_roll', 'settings')
local refused = settings_refused(stored[3], ARGV[3])
  or counters_refused(KEYS[1], stored, { 'expired_through', 'last_roll' })
if refused then return refused end
local cur = tonumber(stored[1])
local w = tonumber(ARGV[1])
if cur and cur >= w then w = cur end
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', w)
if not cur or cur < w then redis.call('HSET', KEYS[1], 'expired_through', string.format('%d', w)) end
local last = tonumber(stored[2])
if not last or last < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'last_roll', ARGV[2])
end
redis.call('HSETNX', KEYS[1], 'layout', '1')
if not stored[3] then redis.call('HSET', KEYS[1], 'settings', ARGV[3]) end
return { w, dead }
