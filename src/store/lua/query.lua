-- query.lua: read one consistent snapshot of an instance's ranking, or of one member in
-- every window of an instance.
--
-- KEYS: one group per window read, each
--   meta    Hash  expired_through; and what `as_of` is made of: last_roll (roll),
--                 changed_ms (apply), summed_ms (resummarize run)
--   result  ZSet  zmember -> exact total
--   lookup  Hash  member -> the tie-break time of its ZSet member: `members` on
--                 incremental boards, `ranked` (as last resummarized) on resummarize
--   dense   ZSet  the distinct totals above 0, each scored by itself (dense_rank
--                 boards only; absent elsewhere, and no dense rank is read)
-- One group for 'top', 'rank', 'around' and 'ranks'; one per window of the board for
-- 'windows' (the windows of one instance share its hash tag).
--
-- ARGV[1] 'top' | 'rank' | 'around' | 'ranks' | 'windows' | 'above' | 'near'
-- ARGV[2] the board's tie-break: 'e' | 'l' | 'n'
-- top:     ARGV[3] offset, ARGV[4] limit
-- rank:    ARGV[3] member
-- around:  ARGV[3] member, ARGV[4] radius
-- ranks:   ARGV[3..] members (each at most once)
-- windows: ARGV[3] member, ARGV[4] the keys of each group (3, or 4 with dense)
-- above:   ARGV[3..] pairs (score, zmember) of entries of other shards of the board
-- near:    ARGV[3] score, ARGV[4] zmember, ARGV[5] radius
--
-- Only totals above 0 are ranked; they sort before every other entry of the ZSet, so
-- index positions below `count` are exactly the ranked members. A dense rank is 1 + the
-- number of distinct totals strictly above the member's (ZCOUNT on `dense`).
-- Returns { expired_through | false, count, 0-based rank of the member | -1,
--           competition rank of the first row | 0, 0-based index of the first row,
--           rows, last_roll | false, changed_ms | false, summed_ms | false,
--           dense rank of the first row | 0 }.
-- rows: top, rank, around: { zmember, score, zmember, score, ... }; ranks: per member
-- asked, in order, { 0-based rank | -1, zmember | false, score | false,
-- competition rank | 0, dense rank | 0 }, flattened.
-- windows: one such answer of `rank` per group, in the order of the groups.
--
-- The shards of a sharded board are instances of one ranking; a query of the board asks
-- each where an entry of another shard would rank in it ('above': per pair given, rows
-- { entries ranked above it, entries with a greater total }; the member of the answer -1)
-- and the entries nearest it ('near': the member of the answer is the position it would
-- take, the first row's competition rank field the entries with a greater total, and
-- the rows those from `radius` above that position to `radius` below it).
local meta, result, lookup, dense, stamps, expired, count

-- Reads the group of keys from KEYS[first] (`size` keys): what every answer from it says.
local function open(first, size)
  meta, result, lookup = KEYS[first], KEYS[first + 1], KEYS[first + 2]
  dense = nil
  if size > 3 then dense = KEYS[first + 3] end
  stamps = redis.call('HMGET', meta, 'expired_through', 'last_roll', 'changed_ms', 'summed_ms')
  expired = stamps[1]
  count = redis.call('ZCOUNT', result, '(0', '+inf')
end

local function answer(rank, first, start, rows, first_dense)
  return { expired, count, rank, first, start, rows, stamps[2], stamps[3], stamps[4],
    first_dense or 0 }
end
local tie = ARGV[2]

-- The ZSet member of `member` as the lookup records it (nil: not recorded), or an error.
-- A lookup value is the tie-break time, or (written by an older version) the member's
-- whole ZSet member. Anything else is refused: it would rank the member wrongly, or as
-- another member.
local function zmember(member)
  local v = redis.call('HGET', lookup, member)
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
    return nil, redis.error_reply('ROLLBOARD corrupt: ' .. lookup .. ' holds ' .. v .. ' for ' ..
      member)
  end
  return z
end

-- 1 + the number of distinct totals above `score` (0 on a board without dense rank).
local function dense_rank(score)
  if not dense then return 0 end
  return redis.call('ZCOUNT', dense, '(' .. score, '+inf') + 1
end

-- The answer of 'top' (`a` the offset, `b` the limit), 'rank' (`a` the member) or
-- 'around' (`a` the member, `b` the radius) from the group opened; nil and an error reply
-- when the lookup holds what rollboard never writes.
local function read(op, a, b)
  local rank = -1
  local start, stop
  if op == 'top' then
    start = tonumber(a)
    stop = start + tonumber(b) - 1
  else
    local z, refused = zmember(a)
    if refused then return nil, refused end
    local score = z and redis.call('ZSCORE', result, z)
    if not score or tonumber(score) <= 0 then
      return answer(-1, 0, 0, {})
    end
    rank = redis.call('ZREVRANK', result, z)
    if op == 'rank' then
      start, stop = rank, rank
    else
      start = math.max(0, rank - tonumber(b))
      stop = rank + tonumber(b)
    end
  end
  if stop >= count then stop = count - 1 end
  if start > stop then return answer(rank, 0, start, {}) end
  local rows = redis.call('ZREVRANGE', result, start, stop, 'WITHSCORES')
  local first = redis.call('ZCOUNT', result, '(' .. rows[2], '+inf') + 1
  return answer(rank, first, start, rows, dense_rank(rows[2]))
end

-- Whether ZSet member `a` sorts after `b` (byte by byte, as the ZSet orders them; Lua's
-- own comparison follows the server's locale).
local function after(a, b)
  local byte = string.byte
  for i = 1, math.min(#a, #b) do
    local x, y = byte(a, i), byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end

-- How many entries rank above an entry of total `score` and ZSet member `z` (which need
-- not be in this instance), and how many have a greater total. Entries of equal total
-- follow one another, by ZSet member descending: a binary search over their positions.
local function position(score, z)
  local greater = redis.call('ZCOUNT', result, '(' .. score, '+inf')
  local lo, hi = greater, greater + redis.call('ZCOUNT', result, score, score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if after(redis.call('ZREVRANGE', result, mid, mid)[1], z) then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo, greater
end

local op = ARGV[1]
if op == 'windows' then
  local size = tonumber(ARGV[4])
  local all = {}
  for first = 1, #KEYS, size do
    open(first, size)
    local one, refused = read('rank', ARGV[3])
    if refused then return refused end
    all[#all + 1] = one
  end
  return all
end
open(1, #KEYS)
if op == 'above' then
  local rows = {}
  for i = 3, #ARGV - 1, 2 do
    local above, greater = position(ARGV[i], ARGV[i + 1])
    rows[#rows + 1] = above
    rows[#rows + 1] = greater
  end
  return answer(-1, 0, 0, rows)
end
if op == 'near' then
  local at, greater = position(ARGV[3], ARGV[4])
  local radius = tonumber(ARGV[5])
  local start, stop = math.max(0, at - radius), math.min(count - 1, at + radius)
  if start > stop then return answer(at, greater, start, {}) end
  return answer(at, greater, start, redis.call('ZREVRANGE', result, start, stop, 'WITHSCORES'))
end
if op == 'ranks' then
  local rows = {}
  for i = 3, #ARGV do
    local z, refused = zmember(ARGV[i])
    if refused then return refused end
    local score = z and redis.call('ZSCORE', result, z)
    if score and tonumber(score) > 0 then
      rows[#rows + 1] = redis.call('ZREVRANK', result, z)
      rows[#rows + 1] = z
      rows[#rows + 1] = score
      rows[#rows + 1] = redis.call('ZCOUNT', result, '(' .. score, '+inf') + 1
      rows[#rows + 1] = dense_rank(score)
    else
      rows[#rows + 1] = -1
      rows[#rows + 1] = false
      rows[#rows + 1] = false
      rows[#rows + 1] = 0
      rows[#rows + 1] = 0
    end
  end
  return answer(-1, 0, 0, rows)
end
local one, refused = read(op, ARGV[3], ARGV[4])
if refused then return refused end
return one
