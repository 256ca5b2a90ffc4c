-- floor.lua: raise a board's own watermark, the floor of every instance's watermark.
--
-- KEYS[1] window  Hash  expired_through (watermark slice), last_roll (epoch ms); a board
--                       with several windows keeps each narrower window's watermark in a
--                       field of its own, `expired_through:<width>`
--
-- ARGV[1] target watermark (slice number: slice_of(now) - N)
-- ARGV[2] now (epoch ms) of the roll
-- ARGV[3] the watermark's field (`expired_through`, or a narrower window's)
--
-- Runs before a roll touches any instance. The watermark never goes back: a roll at an
-- earlier time changes nothing. Queries and applies of a scoped board's instances take
-- max(instance watermark, this one), so an instance that no roll visits any more (its
-- scope emptied and left the registry) still follows every roll.
-- Returns the board's watermark after the call.
local field = ARGV[3]
local stored = redis.call('HMGET', KEYS[1], field, 'last_roll')
local refused = counters_refused(KEYS[1], stored, { field, 'last_roll' })
if refused then return refused end
local cur, w = tonumber(stored[1]), tonumber(ARGV[1])
if cur and cur >= w then w = cur else redis.call('HSET', KEYS[1], field, string.format('%d', w)) end
local last = tonumber(stored[2])
if not last or last < tonumber(ARGV[2]) then redis.call('HSET', KEYS[1], 'last_roll', ARGV[2]) end
return w
