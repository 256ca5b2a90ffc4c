-- apply.lua: fold a bounded chunk of events into one board instance, atomically.
--
-- KEYS[1] meta     Hash  expired_through (watermark slice), settings, gen (bumped on change),
--                        changed_ms (`now` of the last call that wrote)
-- KEYS[2] result   ZSet  zmember -> exact total (incremental boards)
-- KEYS[3] members  Hash  member -> its tie-break time (the ZSet member is prefix:member)
-- KEYS[4] slices   ZSet  registry of slice numbers that exist
-- KEYS[5] seen     ZSet  legacy idempotency keys: raw id -> epoch ms from which it may be
--                        forgotten (the layout before digests: read while it exists, never
--                        written, drained by the roll)
-- KEYS[6] refs     Hash  member -> number of slices holding it (allow_negative boards)
-- KEYS[7] totals   Hash  member -> exact live total (resummarize boards)
-- KEYS[8] seen:ids  Hash  the digest table (below)
-- KEYS[9..8+S]     the slice Hashes of the chunk, in the order of the slice table below
-- KEYS[9+S..8+2S]  the forget logs `seen:<n>` (Lists) of the same slices
--
-- ARGV[1] now (epoch ms)      ARGV[2] slices per window N   ARGV[3] slice width (ms)
-- ARGV[4] 'i' incremental | 'r' resummarize                 ARGV[5] tie: 'e' | 'l' | 'n'
-- ARGV[6] '1' if negative amounts are allowed
-- ARGV[7] settings fingerprint of the caller's board definition
-- ARGV[8] S slices   ARGV[9] M members   ARGV[10] E events
-- ARGV[11] the newest slice whose ids may be forgotten at `now` (Board::forgettable_through)
-- then S pairs (slice number, forget-at epoch ms), slice i stored at KEYS[8 + i];
-- then M member names;
-- then E events of 5 values: digest, slice index (1..S), member index (1..M), ts, amount;
-- then, only while the instance still holds a legacy `seen` ZSet, the E raw ids.
--
-- Idempotency keys. An event's key is remembered as its digest (16 bytes: a 128-bit hash
-- of the id, computed by the caller) tagged with its slice number mod 2^32 (4 bytes,
-- big-endian), in one Hash per instance organised by linear hashing, so it stays compact
-- at any size and every call's work is bounded: fields `#L` (level), `#p` (split pointer),
-- `#n` (entries held), and buckets named by their decimal address whose value is the
-- concatenation of their 20-byte entries. With h the first 4 bytes of a digest as a
-- big-endian number, its bucket is h mod 2^L, or h mod 2^(L+1) when that is below p.
-- After the inserts, while #n > LOAD * (2^L + p), bucket p is split: its entries with
-- h mod 2^(L+1) ~= p move to bucket p + 2^L (entries whose slice may be forgotten are
-- dropped on the way), and p advances, wrapping to 0 with L + 1. An entry counts while
-- its slice is newer than ARGV[11]: a key is one instance-wide set, so a repeat is a
-- duplicate whatever slice it falls in (the first applied wins). Each remembered entry
-- also appends h to its slice's forget log, from which the roll (trim_seen.lua) removes
-- the slice's entries when they may be forgotten. Events of a slice that may already be
-- forgotten (a short dedup_window) are checked but not remembered.
--
-- While the legacy ZSet exists its entries stay authoritative: a call without the raw
-- ids fails with `ROLLBOARD legacy-seen` (nothing written) and the caller repeats it with
-- them.
--
-- Returns one status per event: 0 applied, 1 duplicate, 2 late, 3 overflow.
--
-- Redis does not roll back a script that fails half-way, so this one is in two phases.
-- Phase 1 only reads: the stored settings, the watermark, the digest table's state and
-- every bucket the chunk's digests address (two HMGETs; the legacy ZSet's existence,
-- and while it exists the chunk's raw ids in it), every member's state (HMGET, ZMSCORE), every slice field it
-- touches (one HMGET per slice) and the slice registry (one ZMSCORE). Each read also
-- proves its key has the right type, and every stored value is parsed and checked;
-- whatever is wrong raises an error before anything was written. The events are then
-- judged one by one, in order, against that state in Lua. Phase 2 writes the outcome
-- with a handful of variadic commands whose keys and values are known to be valid, so
-- a call either writes all of it or nothing. The `#!lua` line makes Redis refuse the
-- whole call up front when it is out of memory, instead of failing at the first write.
-- Numbers stay below 2^53 in magnitude, so Lua's doubles hold them exactly.
local LOAD = 16 -- entries per bucket, on average, before a split
local DIGEST, ENTRY = 16, 20 -- bytes per digest, and per table entry (digest and slice tag)
local WRAP, HALF = 4294967296, 2147483648
local meta, result, members, slices, seen, refs, totals, table_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local now = tonumber(ARGV[1])
local incremental = ARGV[4] == 'i'
local tie = ARGV[5]
local negative = ARGV[6] == '1'
local settings = ARGV[7]
local S, M, E = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local forgotten_through = tonumber(ARGV[11]) % WRAP
local slice_base, member_base, event_base = 11, 11 + 2 * S, 11 + 2 * S + M
local with_ids = #ARGV >= event_base + 6 * E

-- Phase 1: read and check.
local stored = redis.call('HMGET', meta, 'expired_through', 'settings', 'gen', 'last_roll')
-- Time never goes back: see fold.lua.
if stored[4] then
  local rolled = counter(stored[4])
  if not rolled then return fail('corrupt: ' .. meta .. ' last_roll is not an integer') end
  if rolled > now then now = rolled end
end
if stored[3] and not counter(stored[3]) then
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

local slice_no, forget, slice_key, log_key = {}, {}, {}, {}
for i = 1, S do
  slice_no[i] = tonumber(ARGV[slice_base + 2 * i - 1])
  forget[i] = tonumber(ARGV[slice_base + 2 * i])
  slice_key[i] = KEYS[8 + i]
  log_key[i] = KEYS[8 + S + i]
end
local names = {}
for i = 1, M do names[i] = ARGV[member_base + i] end

-- The events that are not late, and their raw ids (legacy callers only).
local status = {}
local live, ids = {}, {}
for e = 1, E do
  local b = event_base + (e - 1) * 5
  local s = tonumber(ARGV[b + 2])
  -- Late too once the slice's ids may be forgotten: see fold.lua.
  if slice_no[s] <= horizon or forget[s] <= now then
    status[e] = 2
  else
    if #ARGV[b + 1] ~= DIGEST then return fail('bad digest for event ' .. e) end
    live[#live + 1] = e
    if with_ids then ids[#ids + 1] = ARGV[event_base + 5 * E + e] end
  end
end
if #live == 0 then return status end

-- The legacy ZSet of raw ids, while it exists.
local remembered = {}
if redis.call('EXISTS', seen) == 1 then
  if not with_ids then return fail('legacy-seen: ' .. seen .. ' still holds raw ids') end
  remembered = variadic('ZMSCORE', seen, ids)
end

-- The digest table: its state and every bucket the chunk's digests address.
local function field_of(a) return string.format('%d', a) end
local function tag_of(n)
  local t = n % WRAP
  return string.char(math.floor(t / 16777216) % 256, math.floor(t / 65536) % 256,
    math.floor(t / 256) % 256, t % 256)
end
-- Whether the entry at byte `at` of `bucket` belongs to a slice not yet forgotten.
local function counts(bucket, at)
  local d = (hash32(bucket, at + DIGEST) - forgotten_through) % WRAP
  return d > 0 and d < HALF
end
local state = redis.call('HMGET', table_key, '#L', '#p', '#n')
local L, p, held = 0, 0, 0
if state[1] or state[2] or state[3] then
  L, p, held = integer(state[1]), integer(state[2]), integer(state[3])
  if not L or not p or not held or L < 0 or L > 40 or p < 0 or p >= 2 ^ L or held < 0 then
    return fail('corrupt: ' .. table_key .. ' state #L/#p/#n')
  end
end
local buckets, wanted, addr = {}, {}, {}
for k, e in ipairs(live) do
  local h = hash32(ARGV[event_base + (e - 1) * 5 + 1], 1)
  local a = h % (2 ^ L)
  if a < p then a = h % (2 ^ (L + 1)) end
  addr[k] = a
  if not buckets[a] then
    buckets[a] = true
    wanted[#wanted + 1] = a
  end
end
-- The forget logs that may be appended to, read so that their type is checked too.
local logged = {}
for _, e in ipairs(live) do
  local s = tonumber(ARGV[event_base + (e - 1) * 5 + 2])
  if forget[s] > now and not logged[s] then
    logged[s] = true
    redis.call('LLEN', log_key[s])
  end
end
-- The buckets that inserting every event of the chunk would split, read (and checked)
-- now too: the splits of phase 2 are a prefix of these.
do
  local candidates = 0
  for _, e in ipairs(live) do
    if forget[tonumber(ARGV[event_base + (e - 1) * 5 + 2])] > now then candidates = candidates + 1 end
  end
  local sp, size, n = p, 2 ^ L, held + candidates
  while n > LOAD * (size + sp) do
    if not buckets[sp] then
      buckets[sp] = true
      wanted[#wanted + 1] = sp
    end
    sp = sp + 1
    if sp == size then sp, size = 0, 2 * size end
  end
end
local wanted_fields = {}
for i, a in ipairs(wanted) do wanted_fields[i] = field_of(a) end
local bucket_values = variadic('HMGET', table_key, wanted_fields)
for i, a in ipairs(wanted) do
  local v = bucket_values[i] or ''
  if #v % ENTRY ~= 0 then
    return fail('corrupt: ' .. table_key .. ' bucket ' .. wanted_fields[i] .. ' is ' .. #v .. ' bytes')
  end
  buckets[a] = v
end

-- Whether `bucket` holds digest `d` in an entry that still counts.
local function holds(bucket, d)
  local i = 1
  while true do
    local at = string.find(bucket, d, i, true)
    if not at then return false end
    if (at - 1) % ENTRY == 0 and counts(bucket, at) then return true end
    i = at + 1
  end
end

-- Member state: zmember, total, live slice count.
local zs = variadic('HMGET', members, names)
local state = {}
local scored, scored_at = {}, {}
for i = 1, M do
  local z = nil
  if zs[i] then
    z = zmember_of(zs[i], names[i], tie)
    if not z then return fail('corrupt: ' .. members .. ' holds ' .. zs[i] .. ' for ' .. names[i]) end
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
local any, added = false, {}
for k, e in ipairs(live) do
  local b = event_base + (e - 1) * 5
  local id = ARGV[b + 1]
  local seen_until = remembered[k] and tonumber(remembered[k])
  if applied[id] or (seen_until and seen_until > now) or holds(buckets[addr[k]], id) then
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
      any = true
      -- An id whose slice may already be forgotten is not remembered, not even for the
      -- rest of this call: the outcome does not depend on how a batch is cut into calls.
      if forget[s] > now then
        applied[id] = true
        added[#added + 1] = k
      end
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
if not any then return status end

-- Phase 2: write. Every key's type and every value were checked above.
if not stored[2] then redis.call('HSET', meta, 'settings', settings) end
if #added > 0 then
  -- Inserts, then splits (bounded: at most #added / LOAD + 1 of them, every bucket they
  -- touch read and checked in phase 1).
  local dirty, logs = {}, {}
  local function get(a)
    local v = dirty[a]
    if v == nil then v = buckets[a] end
    if v == nil or v == true then v = redis.call('HGET', table_key, field_of(a)) or '' end
    return v
  end
  for _, k in ipairs(added) do
    local b = event_base + (live[k] - 1) * 5
    local d, s = ARGV[b + 1], tonumber(ARGV[b + 2])
    dirty[addr[k]] = get(addr[k]) .. d .. tag_of(slice_no[s])
    logs[s] = logs[s] or {}
    logs[s][#logs[s] + 1] = string.sub(d, 1, 4)
  end
  held = held + #added
  local size = 2 ^ L
  while held > LOAD * (size + p) do
    local v = get(p)
    local stay, move = {}, {}
    for i = 1, #v, ENTRY do
      if not counts(v, i) then
        held = held - 1
      elseif hash32(v, i) % (2 * size) == p then
        stay[#stay + 1] = string.sub(v, i, i + ENTRY - 1)
      else
        move[#move + 1] = string.sub(v, i, i + ENTRY - 1)
      end
    end
    dirty[p] = table.concat(stay)
    dirty[p + size] = table.concat(move)
    p = p + 1
    if p == size then
      L, p, size = L + 1, 0, 2 * size
    end
  end
  local set, gone = { '#L', field_of(L), '#p', field_of(p), '#n', field_of(held) }, {}
  for a, v in pairs(dirty) do
    if v == '' then
      gone[#gone + 1] = field_of(a)
    else
      set[#set + 1] = field_of(a)
      set[#set + 1] = v
    end
  end
  variadic('HSET', table_key, set)
  variadic('HDEL', table_key, gone)
  for s, entries in pairs(logs) do variadic('RPUSH', log_key[s], entries) end
end
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
      moved[#moved + 1] = stored_of(st.z, tie)
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
-- `gen` was checked in phase 1, so one HSET both bumps it and records when the ranking
-- last changed (`changed_ms`, the `as_of` of a query) at no extra command.
redis.call('HSET', meta, 'gen', string.format('%d', (counter(stored[3]) or 0) + 1),
  'changed_ms', string.format('%d', now))
return status
