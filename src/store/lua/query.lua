-- query.lua: read one consistent snapshot of an instance's ranking.
--
-- KEYS[1] meta    Hash  expired_through; and what `as_of` is made of: last_roll (roll),
--                       changed_ms (apply), summed_ms (resummarize run)
-- KEYS[2] result  ZSet  zmember -> exact total
-- KEYS[3] lookup  Hash  member -> the tie-break time of its ZSet member: `members` on
--                       incremental boards, `ranked` (as last resummarized) on resummarize
--
-- ARGV[1] 'top' | 'rank' | 'around'
-- ARGV[2] the board's tie-break: 'e' | 'l' | 'n'
-- top:    ARGV[3] offset, ARGV[4] limit
-- rank:   ARGV[3] member
-- around: ARGV[3] member, ARGV[4] radius
--
-- Only totals above 0 are ranked; they sort before every other entry of the ZSet, so
-- index positions below `count` are exactly the ranked members.
-- Returns { expired_through | false, count, 0-based rank of the member | -1,
--           competition rank of the first row | 0, 0-based index of the first row,
--           { zmember, score, zmember, score, ... },
--           last_roll | false, changed_ms | false, summed_ms | false }.
local meta, result, lookup = KEYS[1], KEYS[2], KEYS[3]
local stamps = redis.call('HMGET', meta, 'expired_through', 'last_roll', 'changed_ms', 'summed_ms')
local expired = stamps[1]
local count = redis.call('ZCOUNT', result, '(0', '+inf')
local function answer(rank, first, start, rows)
  return { expired, count, rank, first, start, rows, stamps[2], stamps[3], stamps[4] }
end
local op = ARGV[1]
local rank = -1
local start, stop
if op == 'top' then
  start = tonumber(ARGV[3])
  stop = start + tonumber(ARGV[4]) - 1
else
  local member, tie = ARGV[3], ARGV[2]
  local LIMIT = 9007199254740991
  local v = redis.call('HGET', lookup, member)
  -- A lookup value is the tie-break time, or (written by an older version) the member's
  -- whole ZSet member. Anything else is refused: it would rank the member wrongly, or as
  -- another member.
  local z = v
  if v and tie == 'n' then
    z = member
  elseif v and #v <= 16 and string.find(v, '^%d+$') and tonumber(v) <= LIMIT then
    local t = tonumber(v)
    if tie == 'e' then t = LIMIT - t end
    z = string.format('%016d:%s', t, member)
  elseif v and not (string.sub(v, 17) == ':' .. member
      and string.find(v, '^%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d:')
      and tonumber(string.sub(v, 1, 16)) <= LIMIT) then
    return redis.error_reply('ROLLBOARD corrupt: ' .. lookup .. ' holds ' .. v .. ' for ' ..
      member)
  end
  local score = z and redis.call('ZSCORE', result, z)
  if not score or tonumber(score) <= 0 then
    return answer(-1, 0, 0, {})
  end
  rank = redis.call('ZREVRANK', result, z)
  if op == 'rank' then
    start, stop = rank, rank
  else
    local radius = tonumber(ARGV[4])
    start = math.max(0, rank - radius)
    stop = rank + radius
  end
end
if stop >= count then stop = count - 1 end
if start > stop then return answer(rank, 0, start, {}) end
local rows = redis.call('ZREVRANGE', result, start, stop, 'WITHSCORES')
local first = redis.call('ZCOUNT', result, '(' .. rows[2], '+inf') + 1
return answer(rank, first, start, rows)
