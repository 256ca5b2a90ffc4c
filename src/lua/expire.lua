-- expire.lua: expire one chunk of a dead slice of one instance, exactly once.
--
-- KEYS[1] meta     Hash  gen (bumped when anything changes)
-- KEYS[2] result   ZSet  zmember -> exact total (incremental boards)
-- KEYS[3] members  Hash  member -> zmember
-- KEYS[4] refs     Hash  member -> live slices holding it (allow_negative boards)
-- KEYS[5] totals   Hash  member -> exact live total (resummarize boards)
-- KEYS[6] slice    Hash  the dead slice: member -> amount
--
-- ARGV[1] 'i' incremental | 'r' resummarize   ARGV[2] '1' if negatives are allowed
-- ARGV[3..] pairs: member, amount, as found in the slice by the caller's HSCAN
--
-- A dead slice is frozen: the watermark was raised before the caller scanned it, so the
-- apply script rejects every event for it and the amounts cannot change. The HDEL of a
-- field is the claim: it answers 1 to exactly one caller, which then subtracts the
-- amount, so a member already handled by a concurrent or crashed roller is skipped.
-- Scores stay integers below 2^53, so ZINCRBY on them is exact.
-- Returns { fields expired, members that left the instance }.
local meta, result, members, refs, totals, slice = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local incremental = ARGV[1] == 'i'
local negative = ARGV[2] == '1'

local function negate(amount)
  if string.sub(amount, 1, 1) == '-' then return string.sub(amount, 2) end
  return '-' .. amount
end

local expired, removed = 0, 0
for i = 3, #ARGV, 2 do
  local m, minus = ARGV[i], negate(ARGV[i + 1])
  if redis.call('HDEL', slice, m) == 1 then
    expired = expired + 1
    local gone = false
    if negative then gone = redis.call('HINCRBY', refs, m, -1) <= 0 end
    if incremental then
      local z = redis.call('HGET', members, m)
      if z then
        local total = tonumber(redis.call('ZINCRBY', result, minus, z))
        if not negative then gone = total <= 0 end
        if gone then redis.call('ZREM', result, z) end
      else
        gone = true
      end
    else
      local total = redis.call('HINCRBY', totals, m, minus)
      if not negative then gone = total <= 0 end
      if gone then redis.call('HDEL', totals, m) end
    end
    if gone then
      redis.call('HDEL', members, m)
      if negative then redis.call('HDEL', refs, m) end
      removed = removed + 1
    end
  end
end
if expired > 0 then redis.call('HINCRBY', meta, 'gen', 1) end
return { expired, removed }
