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
-- the S slice Hashes and the S forget logs, then the change stream on a board with a
-- feed, then `dense` on dense_rank boards only).
--
-- ARGV[1] now (epoch ms)      ARGV[2] slices per window N   ARGV[3] slice width (ms)
-- ARGV[4] 'i' incremental | 'r' resummarize                 ARGV[5] tie: 'e' | 'l' | 'n'
-- ARGV[6] '1' if negative amounts are allowed
-- ARGV[7] settings fingerprint of the caller's board definition
-- ARGV[8] S slices   ARGV[9] M members   ARGV[10] G groups
-- ARGV[11] the newest slice whose ids may be forgotten at `now` (Board::forgettable_through)
-- ARGV[12] the size of the top the change feed watches (0: no feed)
-- ARGV[13] the change stream's cap (entries)
-- ARGV[14] the digests: 16 bytes per event, concatenated, the events of slice 1 first
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
-- describe the checks); a call writes all or nothing. The digest table and the forget
-- logs are described in digest.lua; the checks and writes shared with `apply.lua` are in
-- gate.lua, digest.lua, members.lua and write_back.lua.
local meta, result, members, slices, seen, refs, totals, table_key,
  incremental, tie, negative, settings = shared_args(KEYS, ARGV)
-- The globals used per slice, group or member, held in locals: a function reaches the
-- library's globals through a metatable, a local directly.
local tonumber, abs, sub, format = tonumber, math.abs, string.sub, string.format
local S, M, G = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local feed, dense = tail_keys(KEYS, ARGV, S, tie)
local forgotten_through = tonumber(ARGV[11]) % WRAP
local blob = ARGV[14]
local slice_base, member_base = 14, 14 + 3 * S
local group_base = member_base + M
local after, token = ARGV[group_base + 5 * G + 1] or '', ARGV[group_base + 5 * G + 2] or ''

-- Phase 1: read and check.
local stored = read_meta(meta)
if after ~= '' and stored[CHAIN] ~= after then return { 3 } end
local now, watermark, gen, refused = gate(meta, stored, settings, tonumber(ARGV[1]), tonumber(ARGV[3]),
  tonumber(ARGV[2]))
if refused then return refused end

-- Slices: number, whether late (a slice that is not is live: its ids are remembered), its
-- digests' range.
local slice_no, late, first, last = {}, {}, {}, {}
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
  if n <= watermark or tonumber(ARGV[b + 2]) <= now then
    late[i] = true
    out[#out + 1] = i
  else
    live_count = live_count + count
  end
end
if #blob ~= at - 1 then return fail('the digests are ' .. #blob .. ' bytes, not ' .. (at - 1)) end
-- A call whose events are judged leaves its chain token (here, and for outcome 1 below).
if live_count == 0 then
  if token ~= '' then redis.call('HSET', meta, 'chain', token) end
  return out
end

if legacy_held(seen) then
  out[1] = 2
  return out
end

-- The digest table: its state and every bucket the live digests address.
local L, p, held, table_refused = table_state(table_key, 0)
if table_refused then return table_refused end
-- addr[k]: the bucket of the k-th digest of the blob (at byte DIGEST * (k - 1) + 1).
local wanted, listed_bucket, addr = {}, {}, {}
local remembered = 0
for s = 1, S do
  if not late[s] then
    remembered = remembered + (last[s] - first[s] + 1) / DIGEST
    locate(blob, first[s], last[s], DIGEST, L, p, addr, wanted, listed_bucket)
  end
end
-- The forget logs that will be appended to, read so that their type is checked too.
for s = 1, S do
  if not late[s] then redis.call('LLEN', KEYS[8 + S + s]) end
end
-- The buckets the inserts would split.
splits_ahead(L, p, held + remembered, wanted, listed_bucket)
local bucket_field = {}
local buckets, buckets_refused = read_buckets(table_key, wanted, bucket_field)
if not buckets then return buckets_refused end

-- The duplicates among the live events.
local dups = 0
for s = 1, S do
  if not late[s] then
    dups = dups + held_of(blob, first[s], last[s], addr, buckets, forgotten_through)
  end
end
if dups > 0 then
  if dups == live_count then
    out[1] = 1
    if token ~= '' then redis.call('HSET', meta, 'chain', token) end
    return out
  end
  out[1] = 2
  return out
end

-- Member state: z0, each known member's ZSet member, and t0, its tie-break time (none
-- under tie 'n'); totals and slice counts.
local names = {}
for i = 1, M do names[i] = ARGV[member_base + i] end
local z0, t0, total0, refs0, members_refused = member_state(members, result, totals, refs, names,
  tie, incremental, negative)
if members_refused then return members_refused end
-- bound[i]: the sum of the absolute amounts of member i's live groups.
local bound = {}
for i = 1, M do bound[i] = 0 end

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
        if abs(old) + g_abs[g] > LIMIT then
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
  if abs(total0[i]) + bound[i] > LIMIT then
    out[1] = 2
    return out
  end
end
local listed = variadic('ZMSCORE', slices, numbers)
local old, old_totals
if feed then old, old_totals = recorded_top(feed) end

-- Phase 2: write. Every key's type and every value were checked above.
pin_settings(meta, stored, settings)
if remembered > 0 then
  -- dirty[a]: the new value of bucket a.
  local dirty = {}
  for s = 1, S do
    if not late[s] then
      local tag = tag_of(slice_no[s])
      local log = {}
      for i = first[s], last[s], DIGEST do
        local a = addr[(i - 1) / DIGEST + 1]
        dirty[a] = (dirty[a] or buckets[a]) .. sub(blob, i, i + DIGEST - 1) .. tag
        log[#log + 1] = sub(blob, i, i + 3)
      end
      variadic('RPUSH', KEYS[8 + S + s], log)
    end
  end
  write_table(table_key, L, p, held + remembered, dirty, buckets, bucket_field, forgotten_through)
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
  write_slice(KEYS[8 + s], pairs_out, listed[k], numbers[k], registered)
end
variadic('ZADD', slices, registered)

-- A member whose events are all late (no newest time) is left as it is.
write_members(members, result, totals, refs, incremental, tie, negative, names, z0, t0, nil,
  newest, total0, total, refs0, refs_new, dense)
if feed then record_changes(feed, old, old_totals, result, 'tip', now) end
write_meta(meta, gen, now, token)
return out
