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
-- ARGV[3..] member names found in the slice by the caller's HSCAN
--
-- Each amount is read and deleted here, in the same atomic call that subtracts it, so a
-- member already handled by a concurrent or crashed roller is simply skipped.
-- Returns { fields expired, members that left the instance }.
local meta, result, members, refs, totals, slice = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local incremental = ARGV[1] == 'i'
local negative = ARGV[2] == '1'
local done, removed = {}, 0
for i = 3, #ARGV do
  local m = ARGV[i]
  local v = redis.call('HGET', slice, m)
  if v then
    done[#done + 1] = m
    local gone = false
    if negative then gone = redis.call('HINCRBY', refs, m, -1) <= 0 end
    if incremental then
      local z = redis.call('HGET', members, m)
      if z then
        local t = tonumber(redis.call('ZSCORE', result, z) or '0') - tonumber(v)
        if not negative then gone = t <= 0 end
        if gone then redis.call('ZREM', result, z) else redis.call('ZADD', result, t, z) end
      else
        gone = true
      end
    else
      local t = tonumber(redis.call('HGET', totals, m) or '0') - tonumber(v)
      if not negative then gone = t <= 0 end
      if gone then redis.call('HDEL', totals, m) else redis.call('HSET', totals, m, t) end
    end
    if gone then
      redis.call('HDEL', members, m)
      if negative then redis.call('HDEL', refs, m) end
      removed = removed + 1
    end
  end
end
if #done > 0 then
  redis.call('HDEL', slice, unpack(done))
  redis.call('HINCRBY', meta, 'gen', 1)
end
return { #done, removed }
