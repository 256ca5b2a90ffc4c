-- common.lua: what apply.lua, fold.lua, expire.lua, stage.lua, trim_seen.lua, watermark.lua
-- and floor.lua share.
-- Redis receives each of them as one text: a `#!lua` line, this file, then the script
-- (`src/store/lua.rs`); a script cannot call another's functions.
--
-- Numbers stay below 2^53 in magnitude, so Lua's doubles hold them exactly.
local LIMIT = 9007199254740991
local BATCH = 1000 -- values per variadic command (well under Lua's unpack limit)

local function fail(what)
  return redis.error_reply('ROLLBOARD ' .. what .. ' (nothing was written)')
end

-- Runs `cmd key [prefix] values...` over `list` in pieces of BATCH values. For a command
-- that answers an array: the replies concatenated (an empty table, not to be written to,
-- when `list` is empty). The commonest case, one piece, allocates nothing of its own.
local NOTHING = {}
local function variadic(cmd, key, list, prefix)
  local n = #list
  if n == 0 then return NOTHING end
  if n <= BATCH then
    if prefix then return redis.call(cmd, key, prefix, unpack(list)) end
    return redis.call(cmd, key, unpack(list))
  end
  local out = {}
  for i = 1, n, BATCH do
    local j = math.min(i + BATCH - 1, n)
    local reply
    if prefix then
      reply = redis.call(cmd, key, prefix, unpack(list, i, j))
    else
      reply = redis.call(cmd, key, unpack(list, i, j))
    end
    if type(reply) == 'table' then
      for _, v in ipairs(reply) do out[#out + 1] = v end
    end
  end
  return out
end

-- `v` as an exact integer, or nil.
local function integer(v)
  local n = tonumber(v)
  if n == nil or n ~= math.floor(n) or math.abs(n) > LIMIT then return nil end
  return n
end

-- `v` as an exact integer written as Redis writes one (the form HINCRBY takes: digits, an
-- optional '-', no leading zero, no '+', exponent or point), or nil. For a counter a script
-- increments after its other writes: one that is not in this form must fail the script
-- before it writes anything.
local function counter(v)
  local n = integer(v)
  if n == nil or string.format('%d', n) ~= v then return nil end
  return n
end

-- The 32-bit number in the four bytes of `d` from `at` on (a digest's bucket hash).
local function hash32(d, at)
  local a, b, c, e = string.byte(d, at, at + 3)
  return ((a * 256 + b) * 256 + c) * 256 + e
end

-- `members` holds each member's tie-break time (ms, as an integer: 16 B of Redis memory
-- where the 16-digit prefix took 32) or '' on boards without tie-break (`tie` 'n'); an
-- entry written by an older version holds the whole ZSet member, prefix included. Returns
-- the ZSet member a value stands for and the tie-break time (nil under 'n'), or nil when
-- the value is neither (or names another member, or a time out of range). `tie`: 'e'
-- earliest first, 'l' latest first, 'n' none.
local function zmember_of(v, name, tie)
  if tie == 'n' then return name end
  if #v <= 16 and string.find(v, '^%d+$') then
    local t = tonumber(v)
    if t > LIMIT then return nil end
    return string.format('%016d:%s', tie == 'e' and LIMIT - t or t, name), t
  end
  -- An older version's value: this member's own ZSet member, its prefix in range.
  if string.sub(v, 17) == ':' .. name and string.find(v, '^%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d:') then
    local prefix = tonumber(string.sub(v, 1, 16))
    if prefix <= LIMIT then return v, tie == 'e' and LIMIT - prefix or prefix end
  end
  return nil
end

-- What `members` stores for ZSet member `z`: its tie-break time.
local function stored_of(z, tie)
  if tie == 'n' then return '' end
  local t = tonumber(string.sub(z, 1, 16))
  if tie == 'e' then t = LIMIT - t end
  return string.format('%d', t)
end

