#!lua
-- apply.lua: fold a bounded chunk of events into one board instance, atomically.
--
-- KEYS[1] meta     Hash  expired_through (watermark slice), settings, gen (bumped on change)
-- KEYS[2] result   ZSet  zmember -> exact total (incremental boards)
-- KEYS[3] members  Hash  member -> zmember (tie-break prefix + member)
-- KEYS[4] slices   ZSet  registry of slice numbers that exist
-- KEYS[5] seen     ZSet  idempotency key -> epoch ms from which it may be forgotten
-- KEYS[6] refs     Hash  member -> number of slices holding it (allow_negative boards)
-- KEYS[7] totals   Hash  member -> exact live total (resummarize boards)
-- KEYS[8..]        the slice Hashes of the chunk, in the order of the slice table below
--
-- ARGV[1] now (epoch ms)      ARGV[2] slices per window N   ARGV[3] slice width (ms)
-- ARGV[4] 'i' incremental | 'r' resummarize                 ARGV[5] tie: 'e' | 'l' | 'n'
-- ARGV[6] '1' if negative amounts are allowed
-- ARGV[7] settings fingerprint of the caller's board definition
-- ARGV[8] S slices   ARGV[9] M members   ARGV[10] E events
-- then S pairs (slice number, forget-at epoch ms), slice i stored at KEYS[7 + i];
-- then M member names;
-- then E events of 5 values: id, slice index (1..S), member index (1..M), ts, amount.
--
-- Returns one status per event: 0 applied, 1 duplicate, 2 late, 3 overflow.
--
-- Redis does not roll back a script that fails half-way, so this one is in two phases.
-- Phase 1 only reads: the stored settings, the watermark, every idempotency key of the
-- chunk (one ZMSCORE), every member's state (HMGET, ZMSCORE), every slice field it
-- touches (one HMGET per slice) and the slice registry (one ZMSCORE). Each read also
-- proves its key has the right type, and every stored value is parsed and checked;
-- whatever is wrong raises an error before anything was written. The events are then
-- judged one by one, in order, against that state in Lua. Phase 2 writes the outcome
-- with a handful of variadic commands whose keys and values are known to be valid, so
-- a call either writes all of it or nothing. The `#!lua` line makes Redis refuse the
-- whole call up front when it is out of memory, instead of failing at the first write.
-- Numbers stay below 2^53 in magnitude, so Lua's doubles hold them exactly.
local LIMIT = 9007199254740991
local BATCH = 1000 -- values per variadic command (well under Lua's unpack limit)
local meta, result, members, slices, seen, refs, totals =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local now = tonumber(ARGV[1])
local incremental = ARGV[4] == 'i'
local tie = ARGV[5]
local negative = ARGV[6] == '1'
local settings = ARGV[7]
local S, M, E = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local slice_base, member_base, event_base = 10, 10 + 2 * S, 10 + 2 * S + M

local function fail(what)
  return redis.error_reply('ROLLBOARD ' .. what .. ' (nothing was written)')
end

-- Runs `cmd key args...` over `list` in bounded pieces; concatenates array replies.
local function variadic(cmd, key, list, prefix)
  local out = {}
  for i = 1, #list, BATCH do
    local args = { cmd, key }
    if prefix then args[#args + 1] = prefix end
    for j = i, math.min(i + BATCH - 1, #list) do args[#args + 1] = list[j] end
    local reply = redis.call(unpack(args))
    if type(reply) == 'table' then
      for _, v in ipairs(reply) do out[#out + 1] = v end
    end
  end
  return out
end

local function integer(v)
  local n = tonumber(v)
  if n == nil or n ~= math.floor(n) or math.abs(n) > LIMIT then return nil end
  return n
end

-- Phase 1: read and check.
local stored = redis.call('HMGET', meta, 'expired_through', 'settings', 'gen')
if stored[3] and not integer(stored[3]) then
  return fail('corrupt: ' .. meta .. ' gen is not an integer')
end
if stored[2] and stored[2] ~= settings then
  return fail('settings: the board was created with ' .. stored[2] .. ', this process has ' .. settings)
end
local horizon = math.floor(now / tonumber(ARGV[3])) - tonumber(ARGV[2])
if stored[1] then
  local w = integer(stored[1])
  if not w then return fail('corrupt: ' .. meta .. ' expired_through is not an integer') end
  if w > horizon then horizon = w end
end

local slice_no, forget, slice_key = {}, {}, {}
for i = 1, S do
  slice_no[i] = tonumber(ARGV[slice_base + 2 * i - 1])
  forget[i] = ARGV[slice_base + 2 * i]
  slice_key[i] = KEYS[7 + i]
end
local names = {}
for i = 1, M do names[i] = ARGV[member_base + i] end

-- The events that are not late, and their ids.
local status = {}
local live, ids = {}, {}
for e = 1, E do
  local b = event_base + (e - 1) * 5
  if slice_no[tonumber(ARGV[b + 2])] <= horizon then
    status[e] = 2
  else
    live[#live + 1] = e
    ids[#ids + 1] = ARGV[b + 1]
  end
end
if #live == 0 then return status end

local remembered = variadic('ZMSCORE', seen, ids)

-- Member state: zmember, total, live slice count.
local zs = variadic('HMGET', members, names)
local state = {}
local scored, scored_at = {}, {}
for i = 1, M do
  local z = zs[i]
  if not z then z = nil end
  if z and tie ~= 'n' then
    local prefix = string.sub(z, 1, 16)
    if not string.match(prefix, '^%d+$') or #prefix ~= 16 or string.sub(z, 17, 17) ~= ':' then
      return fail('corrupt: ' .. members .. ' holds ' .. z .. ' for ' .. names[i])
    end
  end
  state[i] = { z0 = z, z = z, total0 = 0, total = 0, refs0 = 0, refs = 0 }
  if z then
    scored[#scored + 1] = z
    scored_at[#scored_at + 1] = i
  end
end
if incremental then
  -- Read even when no member is known yet: phase 2 writes `result` in any case.
  if #scored == 0 then redis.call('ZCARD', result) end
  local scores = variadic('ZMSCORE', result, scored)
  for k, i in ipairs(scored_at) do
    if scores[k] then
      local t = integer(scores[k])
      if not t then return fail('corrupt: ' .. result .. ' score of ' .. names[i]) end
      state[i].total0, state[i].total = t, t
    end
  end
else
  local ts = variadic('HMGET', totals, names)
  for i = 1, M do
    if ts[i] then
      local t = integer(ts[i])
      if not t then return fail('corrupt: ' .. totals .. ' holds ' .. ts[i] .. ' for ' .. names[i]) end
      state[i].total0, state[i].total = t, t
    end
  end
end
if negative then
  local rs = variadic('HMGET', refs, names)
  for i = 1, M do
    if rs[i] then
      local r = integer(rs[i])
      if not r then return fail('corrupt: ' .. refs .. ' holds ' .. rs[i] .. ' for ' .. names[i]) end
      state[i].refs0, state[i].refs = r, r
    end
  end
end

-- Slice fields touched by live events: slice index -> member index -> { old, value }.
local fields = {}
for _, e in ipairs(live) do
  local b = event_base + (e - 1) * 5
  local s, m = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  fields[s] = fields[s] or { order = {} }
  if not fields[s][m] then
    fields[s][m] = true
    fields[s].order[#fields[s].order + 1] = m
  end
end
for s, f in pairs(fields) do
  local wanted = {}
  for k, m in ipairs(f.order) do wanted[k] = names[m] end
  local values = variadic('HMGET', slice_key[s], wanted)
  for k, m in ipairs(f.order) do
    local v = values[k]
    local old = nil
    if v then
      old = integer(v)
      if not old then return fail('corrupt: ' .. slice_key[s] .. ' holds ' .. v .. ' for ' .. names[m]) end
    end
    f[m] = { old = old, value = old or 0 }
  end
end

-- The slice registry, read so that its type is checked before the first write too.
local touched_slices = {}
for s in pairs(fields) do touched_slices[#touched_slices + 1] = s end
table.sort(touched_slices)
local numbers = {}
for k, s in ipairs(touched_slices) do numbers[k] = string.format('%d', slice_no[s]) end
local listed = variadic('ZMSCORE', slices, numbers)

local function time_of(z)
  local prefix = tonumber(string.sub(z, 1, 16))
  if tie == 'e' then return LIMIT - prefix end
  return prefix
end

local function zmember(name, ts)
  if tie == 'e' then return string.format('%016d:%s', LIMIT - ts, name) end
  if tie == 'l' then return string.format('%016d:%s', ts, name) end
  return name
end

-- Judge the live events in order against the state read above.
local applied = {}
local added_ids = {}
for k, e in ipairs(live) do
  local b = event_base + (e - 1) * 5
  local id = ARGV[b + 1]
  local seen_until = remembered[k] and tonumber(remembered[k])
  if applied[id] or (seen_until and seen_until > now) then
    status[e] = 1
  else
    local s, m = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    local ts, amount = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
    local st, field = state[m], fields[s][m]
    local new_total = st.total + amount
    local new_value = field.value + amount
    if math.abs(new_total) > LIMIT or math.abs(new_value) > LIMIT then
      status[e] = 3
    else
      status[e] = 0
      applied[id] = true
      added_ids[#added_ids + 1] = forget[s]
      added_ids[#added_ids + 1] = id
      st.total = new_total
      field.value = new_value
      if not field.touched then
        field.touched = true
        if not field.old then st.refs = st.refs + 1 end
      end
      if not st.z or (tie ~= 'n' and ts > time_of(st.z)) then st.z = zmember(names[m], ts) end
    end
  end
end
if #added_ids == 0 then return status end

-- Phase 2: write. Every key's type and every value were checked above.
if not stored[2] then redis.call('HSET', meta, 'settings', settings) end
variadic('ZADD', seen, added_ids)
local registered = {}
for k, s in ipairs(touched_slices) do
  local f = fields[s]
  local pairs_out = {}
  for _, m in ipairs(f.order) do
    local field = f[m]
    if field.touched then
      pairs_out[#pairs_out + 1] = names[m]
      pairs_out[#pairs_out + 1] = string.format('%d', field.value)
    end
  end
  if #pairs_out > 0 then
    variadic('HSET', slice_key[s], pairs_out)
    if not listed[k] then
      registered[#registered + 1] = numbers[k]
      registered[#registered + 1] = numbers[k]
    end
  end
end
variadic('ZADD', slices, registered)

local moved, removed, added, totals_out, refs_out = {}, {}, {}, {}, {}
for i = 1, M do
  local st = state[i]
  if st.z then
    if st.z ~= st.z0 then
      moved[#moved + 1] = names[i]
      moved[#moved + 1] = st.z
    end
    if incremental then
      if st.z0 and st.z ~= st.z0 then removed[#removed + 1] = st.z0 end
      if st.z ~= st.z0 or st.total ~= st.total0 then
        added[#added + 1] = string.format('%d', st.total)
        added[#added + 1] = st.z
      end
    elseif st.total ~= st.total0 or not st.z0 then
      totals_out[#totals_out + 1] = names[i]
      totals_out[#totals_out + 1] = string.format('%d', st.total)
    end
    if st.refs ~= st.refs0 then
      refs_out[#refs_out + 1] = names[i]
      refs_out[#refs_out + 1] = string.format('%d', st.refs)
    end
  end
end
variadic('HSET', members, moved)
variadic('ZREM', result, removed)
variadic('ZADD', result, added)
variadic('HSET', totals, totals_out)
if negative then variadic('HSET', refs, refs_out) end
redis.call('HINCRBY', meta, 'gen', 1)
return status
