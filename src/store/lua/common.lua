-- common.lua: the helpers the scripts below use: exact integers, error replies, the
-- bounded variadic call and the checks of a stored setting or counter. The shared pieces
-- sit once at the top of rollboard's function library, before every script's function
-- (`src/store/lua.rs`).
-- Used by: fold.lua, expire.lua, stage.lua, trim_seen.lua, watermark.lua,
-- floor.lua, query.lua.
--
-- Numbers stay below 2^53 in magnitude, so Lua's doubles hold them exactly.
local LIMIT = 9007199254740991
local BATCH = 1000 -- values per variadic command (well under Lua's unpack limit)

local function fail(what)
  return redis.error_reply('ROLLBOARD ' .. what .. ' (nothing was written)')
end

-- Runs `cmd key [prefix] values...` over `list` in pieces of BATCH values. For a command
-- that answers an array: the replies concatenated (an empty table when `list` is empty:
-- one table for every call, as the library lives on between calls, so never written to).
-- The commonest case, one piece, allocates nothing of its own.
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

-- The error for a caller whose board definition has settings fingerprint `settings` when
-- the instance was created with `stored` (nil: none pinned yet); nil when they agree.
local function settings_refused(stored, settings)
  if stored and stored ~= settings then
    return fail('settings: the board was created with ' .. stored .. ', this process has ' .. settings)
  end
  return nil
end

-- The error naming the first of `fields` of Hash `key` (read into `stored`, in that order)
-- whose value is not written as the scripts write a number; nil when none is. Such a value
-- is corrupt and fails the call, never taken for "not rolled yet".
local function counters_refused(key, stored, fields)
  for i, field in ipairs(fields) do
    if stored[i] and not counter(stored[i]) then
      return fail('corrupt: ' .. key .. ' ' .. field .. ' is not an integer')
    end
  end
  return nil
end
