-- fold.lua: fold a chunk of events into one board instance, pre-aggregated by the caller,
-- atomically; the fast path of `apply.lua`, for the common case.
--
-- The caller sends each event's idempotency digest, and the events' amounts summed per
-- (member, slice) ("groups"), so the work here is one digest check per event and one update
-- per group and per member, not one per event. That holds only while no event of the chunk
-- can be judged differently one at a time: when some but not all of its events are
-- duplicates, when a total could pass 2^53 - 1, or while the instance still holds a legacy
-- `seen` ZSet, the call writes nothing and answers `slow`: the caller then sends the same
-- events, in stream order, to `apply.lua`, which judges them one by one. The caller sends no
-- id twice in one chunk (a chunk with a repeated id goes to `apply.lua` directly).
--
-- KEYS: as `apply.lua` (meta, result, members, slices, seen, refs, totals, seen:ids, then
-- the S slice Hashes and the S forget logs).
--
-- ARGV[1] now (epoch ms)      ARGV[2] slices per window N   ARGV[3] slice width (ms)
-- ARGV[4] 'i' incremental | 'r' resummarize                 ARGV[5] tie: 'e' | 'l' | 'n'
-- ARGV[6] '1' if negative amounts are allowed
-- ARGV[7] settings fingerprint of the caller's board definition
-- ARGV[8] S slices   ARGV[9] M members   ARGV[10] G groups
-- ARGV[11] the newest slice whose ids may be forgotten at `now` (Board::forgettable_through)
-- ARGV[12] the digests: 16 bytes per event, concatenated, the events of slice 1 first
-- then S triples (slice number, forget-at epoch ms, events in the slice), slice i stored at
-- KEYS[8 + i]; then the M member names; then G groups of five: member index 1..M, slice
-- index 1..S, the sum of the group's amounts, the sum of their absolute values, and the
-- newest event time among them. Then, optionally, two chain tokens (below).
--
-- Returns { outcome, late slice indices... }: outcome 0 when every event of a slice that is
-- not late was applied, 1 when every such event was a duplicate (nothing written), 2 `slow`
-- (nothing written), 3 `not run` (nothing written). Events of the listed slices are late
-- in every case but 3.
--
-- Chain tokens: the caller sends an instance's calls for one batch at once, on one
-- connection, and each must run only after the one before it was judged (in stream order:
-- the first of two events with one id wins). The two optional ARGV after the groups are the
-- token the previous call leaves in `meta` `chain` (this call answers 3 without reading
-- further unless it is there; '' for none), and the token this call leaves there once its
-- events are judged, outcomes 0 and 1 ('' for none). A call answering 2 or failing leaves
-- none, so the calls after it do not run; the caller sends them again in turn.
--
-- Phase 1 only reads and checks, phase 2 only writes, as in `apply.lua` (whose comments
-- describe the digest table, the forget logs and the checks); a call writes all or nothing.
local LOAD = 16
local DIGEST, ENTRY = 16, 20
local WRAP, HALF = 4294967296, 2147483648
local meta, result, members, slices, seen, refs, totals, table_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local now = tonumber(ARGV[1])
local incremental = ARGV[4] == 'i'
local tie = ARGV[5]
local negative = ARGV[6] == '1'
local settings = ARGV[7]
local S, M, G = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local forgotten_through = tonumber(ARGV[11]) % WRAP
local blob = ARGV[12]
local slice_base, member_base = 12, 12 + 3 * S
local group_base = member_base + M
local after, token = ARGV[group_base + 5 * G + 1] or '', ARGV[group_base + 5 * G + 2] or ''
local byte, sub, find, format = string.byte, string.sub, string.find, string.format

-- Phase 1: read and check.
local stored = redis.call('HMGET', meta, 'expired_through', 'settings', 'gen', 'chain', 'last_roll')
if after ~= '' and stored[4] ~= after then return { 3 } end
-- Time never goes back: a roll at a later time (a forced `roll --at`, or a replica whose
-- measure of Redis's clock is a little ahead of this caller's) already expired and forgot
-- what was due then, so the events are judged at that time at least.
if stored[5] then
  local rolled = counter(stored[5])
  if not rolled then return fail('corrupt: ' .. meta .. ' last_roll is not an integer') end
  if rolled > now then now = rolled end
end
-- Answers `reply` for a call whose events are judged, leaving its chain token.
local function judged(reply)
  if token ~= '' then redis.call('HSET', meta, 'chain', token) end
  return reply
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

-- Slices: number, whether late, whether its ids are remembered, its digests' range.
local slice_no, late, keep, first, last = {}, {}, {}, {}, {}
local out = { 0 }
local at, live_count = 1, 0
for i = 1, S do
  local b = slice_base + 3 * (i - 1)
  local n, count = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 3])
  slice_no[i] = n
  first[i] = at
  at = at + DIGEST * count
  last[i] = at - 1
  -- Late too once the slice's ids may be forgotten (a `dedup_window` duration): an id is
  -- forgotten only once events of its slice can no longer be applied.
  if n <= horizon or tonumber(ARGV[b + 2]) <= now then
    late[i] = true
    out[#out + 1] = i
  else
    keep[i] = true
    live_count = live_count + count
  end
end
if #blob ~= at - 1 then return fail('the digests are ' .. #blob .. ' bytes, not ' .. (at - 1)) end
if live_count == 0 then return judged(out) end

if redis.call('EXISTS', seen) == 1 then
  out[1] = 2
  return out
end

-- The digest table: its state and every bucket the live digests address.
local state = redis.call('HMGET', table_key, '#L', '#p', '#n')
local L, p, held = 0, 0, 0
if state[1] or state[2] or state[3] then
  L, p, held = integer(state[1]), integer(state[2]), integer(state[3])
  if not L or not p or not held or L < 0 or L > 40 or p < 0 or p >= 2 ^ L or held < 0 then
    return fail('corrupt: ' .. table_key .. ' state #L/#p/#n')
  end
end
local size = 2 ^ L
local size2 = 2 * size
-- addr[k]: the bucket of the k-th digest of the blob (at byte DIGEST * (k - 1) + 1).
local addr, wanted, wanted_at = {}, {}, {}
local remembered = 0
for s = 1, S do
  if not late[s] then
    if keep[s] then remembered = remembered + (last[s] - first[s] + 1) / DIGEST end
    for i = first[s], last[s], DIGEST do
      local a, b, c, d = byte(blob, i, i + 3)
      local h = ((a * 256 + b) * 256 + c) * 256 + d
      local x = h % size
      if x < p then x = h % size2 end
      addr[(i - 1) / DIGEST + 1] = x
      if not wanted_at[x] then
        wanted[#wanted + 1] = x
        wanted_at[x] = #wanted
      end
    end
  end
end
-- The forget logs that will be appended to, read so that their type is checked too.
for s = 1, S do
  if keep[s] then redis.call('LLEN', KEYS[8 + S + s]) end
end
-- The buckets the inserts would split.
do
  local sp, sz, n = p, size, held + remembered
  while n > LOAD * (sz + sp) do
    if not wanted_at[sp] then
      wanted[#wanted + 1] = sp
      wanted_at[sp] = #wanted
    end
    sp = sp + 1
    if sp == sz then sp, sz = 0, 2 * sz end
  end
end
-- field[a]: the Hash field of bucket a, for the buckets read here (written back below).
local fields, field = {}, {}
for i, a in ipairs(wanted) do
  fields[i] = format('%d', a)
  field[a] = fields[i]
end
local values = variadic('HMGET', table_key, fields)
local buckets = {}
for i, a in ipairs(wanted) do
  local v = values[i] or ''
  if #v % ENTRY ~= 0 then
    return fail('corrupt: ' .. table_key .. ' bucket ' .. fields[i] .. ' is ' .. #v .. ' bytes')
  end
  buckets[a] = v
end

-- Whether the entry at byte `at` of `bucket` belongs to a slice not yet forgotten.
local function counts(bucket, at)
  local a, b, c, d = byte(bucket, at + DIGEST, at + DIGEST + 3)
  local x = ((((a * 256 + b) * 256 + c) * 256 + d) - forgotten_through) % WRAP
  return x > 0 and x < HALF
end

-- The duplicates among the live events.
local dups = 0
for s = 1, S do
  if not late[s] then
    for i = first[s], last[s], DIGEST do
      local bucket = buckets[addr[(i - 1) / DIGEST + 1]]
      if #bucket > 0 then
        local d = sub(blob, i, i + DIGEST - 1)
        local j = 1
        while true do
          local hit = find(bucket, d, j, true)
          if not hit then break end
          if (hit - 1) % ENTRY == 0 and counts(bucket, hit) then
            dups = dups + 1
            break
          end
          j = hit + 1
        end
      end
    end
  end
end
if dups > 0 then
  if dups == live_count then
    out[1] = 1
    return judged(out)
  end
  out[1] = 2
  return out
end

-- Member state.
local names = {}
for i = 1, M do names[i] = ARGV[member_base + i] end
local zs = variadic('HMGET', members, names)
-- z0: each known member's ZSet member; t0: its tie-break time (none under tie 'n').
local z0, t0, total0, refs0, bound = {}, {}, {}, {}, {}
local scored, scored_at = {}, {}
for i = 1, M do
  local v = zs[i]
  if v then
    local z, t = zmember_of(v, names[i], tie)
    if not z then return fail('corrupt: ' .. members .. ' holds ' .. v .. ' for ' .. names[i]) end
    z0[i], t0[i] = z, t
    scored[#scored + 1] = z
    scored_at[#scored_at + 1] = i
  end
  total0[i], refs0[i], bound[i] = 0, 0, 0
end
if incremental then
  if #scored == 0 then redis.call('ZCARD', result) end
  local scores = variadic('ZMSCORE', result, scored)
  for k, i in ipairs(scored_at) do
    local v = scores[k]
    if v then
      local t = integer(v)
      if not t then return fail('corrupt: ' .. result .. ' score of ' .. names[i]) end
      total0[i] = t
    end
  end
else
  local ts = variadic('HMGET', totals, names)
  for i = 1, M do
    local v = ts[i]
    if v then
      local t = integer(v)
      if not t then return fail('corrupt: ' .. totals .. ' holds ' .. v .. ' for ' .. names[i]) end
      total0[i] = t
    end
  end
end
if negative then
  local rs = variadic('HMGET', refs, names)
  for i = 1, M do
    local v = rs[i]
    if v then
      local r = integer(v)
      if not r then return fail('corrupt: ' .. refs .. ' holds ' .. v .. ' for ' .. names[i]) end
      refs0[i] = r
    end
  end
end

-- Groups of the live slices, per slice: the fields they touch. A member of late slices
-- only is left as it is.
local by_slice, newest = {}, {}
local g_member, g_sum, g_abs = {}, {}, {}
for g = 1, G do
  local b = group_base + 5 * (g - 1)
  local m, s = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  if not late[s] then
    g_member[g], g_sum[g], g_abs[g] = m, tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
    bound[m] = bound[m] + g_abs[g]
    local t = tonumber(ARGV[b + 5])
    if not newest[m] or t > newest[m] then newest[m] = t end
    local list = by_slice[s]
    if not list then
      list = {}
      by_slice[s] = list
    end
    list[#list + 1] = g
  end
end
local touched, numbers = {}, {}
local g_old = {}
for s = 1, S do
  local list = by_slice[s]
  if list then
    local wanted_names = {}
    for k, g in ipairs(list) do wanted_names[k] = names[g_member[g]] end
    local vs = variadic('HMGET', KEYS[8 + s], wanted_names)
    for k, g in ipairs(list) do
      local v = vs[k]
      if v then
        local old = integer(v)
        if not old then
          return fail('corrupt: ' .. KEYS[8 + s] .. ' holds ' .. v .. ' for ' .. wanted_names[k])
        end
        g_old[g] = old
        -- A field that could pass 2^53 - 1 part-way: judged event by event instead.
        if math.abs(old) + g_abs[g] > LIMIT then
          out[1] = 2
          return out
        end
      elseif g_abs[g] > LIMIT then
        out[1] = 2
        return out
      end
    end
    touched[#touched + 1] = s
    numbers[#numbers + 1] = format('%d', slice_no[s])
  end
end
for i = 1, M do
  if math.abs(total0[i]) + bound[i] > LIMIT then
    out[1] = 2
    return out
  end
end
local listed = variadic('ZMSCORE', slices, numbers)

-- Phase 2: write. Every key's type and every value were checked above.
if not stored[2] then redis.call('HSET', meta, 'settings', settings) end
if remembered > 0 then
  -- dirty[a]: the new value of bucket a.
  local dirty = {}
  for s = 1, S do
    if keep[s] then
      local n = slice_no[s] % WRAP
      local tag = string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
        math.floor(n / 256) % 256, n % 256)
      local log = {}
      for i = first[s], last[s], DIGEST do
        local a = addr[(i - 1) / DIGEST + 1]
        dirty[a] = (dirty[a] or buckets[a]) .. sub(blob, i, i + DIGEST - 1) .. tag
        log[#log + 1] = sub(blob, i, i + 3)
      end
      variadic('RPUSH', KEYS[8 + S + s], log)
    end
  end
  held = held + remembered
  local function get(a)
    local v = dirty[a]
    if v == nil then v = buckets[a] end
    if v == nil then v = redis.call('HGET', table_key, format('%d', a)) or '' end
    return v
  end
  while held > LOAD * (size + p) do
    local v = get(p)
    local stay, move = {}, {}
    for i = 1, #v, ENTRY do
      if not counts(v, i) then
        held = held - 1
      else
        local a, b, c, d = byte(v, i, i + 3)
        if (((a * 256 + b) * 256 + c) * 256 + d) % (2 * size) == p then
          stay[#stay + 1] = sub(v, i, i + ENTRY - 1)
        else
          move[#move + 1] = sub(v, i, i + ENTRY - 1)
        end
      end
    end
    dirty[p] = table.concat(stay)
    dirty[p + size] = table.concat(move)
    p = p + 1
    if p == size then
      L, p, size = L + 1, 0, 2 * size
    end
  end
  local set, gone = { '#L', format('%d', L), '#p', format('%d', p), '#n', format('%d', held) }, {}
  for a, v in pairs(dirty) do
    if v == '' then
      gone[#gone + 1] = field[a] or format('%d', a)
    else
      set[#set + 1] = field[a] or format('%d', a)
      set[#set + 1] = v
    end
  end
  variadic('HSET', table_key, set)
  variadic('HDEL', table_key, gone)
end

local total, refs_new = {}, {}
for i = 1, M do total[i], refs_new[i] = total0[i], refs0[i] end
local registered = {}
for k, s in ipairs(touched) do
  local pairs_out = {}
  for _, g in ipairs(by_slice[s]) do
    local m, old = g_member[g], g_old[g]
    total[m] = total[m] + g_sum[g]
    if not old then refs_new[m] = refs_new[m] + 1 end
    pairs_out[#pairs_out + 1] = names[m]
    pairs_out[#pairs_out + 1] = format('%d', (old or 0) + g_sum[g])
  end
  variadic('HSET', KEYS[8 + s], pairs_out)
  if not listed[k] then
    registered[#registered + 1] = numbers[k]
    registered[#registered + 1] = numbers[k]
  end
end
variadic('ZADD', slices, registered)

local moved, removed, added, totals_out, refs_out = {}, {}, {}, {}, {}
for i = 1, M do
  local t = newest[i]
  -- A member whose events are all late is left as it is.
  if t then
    local old = z0[i]
    local z = old
    if tie == 'n' then
      z = names[i]
    elseif not old or t > t0[i] then
      z = format('%016d:%s', tie == 'e' and LIMIT - t or t, names[i])
    end
    if z ~= old then
      moved[#moved + 1] = names[i]
      moved[#moved + 1] = tie == 'n' and '' or format('%d', t)
    end
    if incremental then
      if old and z ~= old then removed[#removed + 1] = old end
      if z ~= old or total[i] ~= total0[i] then
        added[#added + 1] = format('%d', total[i])
        added[#added + 1] = z
      end
    elseif total[i] ~= total0[i] or not old then
      totals_out[#totals_out + 1] = names[i]
      totals_out[#totals_out + 1] = format('%d', total[i])
    end
    if refs_new[i] ~= refs0[i] then
      refs_out[#refs_out + 1] = names[i]
      refs_out[#refs_out + 1] = format('%d', refs_new[i])
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
local gen = format('%d', (counter(stored[3]) or 0) + 1)
if token ~= '' then
  redis.call('HSET', meta, 'gen', gen, 'changed_ms', format('%d', now), 'chain', token)
else
  redis.call('HSET', meta, 'gen', gen, 'changed_ms', format('%d', now))
end
return out
