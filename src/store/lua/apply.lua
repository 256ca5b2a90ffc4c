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
-- KEYS[8] seen:ids  Hash  the digest table (layout in digest.lua)
-- KEYS[9..8+S]     the slice Hashes of the chunk, in the order of the slice table below
-- KEYS[9+S..8+2S]  the forget logs `seen:<n>` (Lists) of the same slices
-- KEYS[9+2S]       changes  Stream  the change feed of the top (boards with a feed only;
--                        absent elsewhere: changes.lua)
-- then             dense  ZSet  distinct totals above 0 (dense_rank boards only; absent
--                        elsewhere), kept in step with `result` (members.lua dense_update)
-- then, on a board with several windows, for each narrower window (the instance's keys of
-- that window): meta, result, members, slices, refs, totals, its S slice Hashes, then its
-- change stream and its dense ZSet where the board has them.
--
-- ARGV[1] now (epoch ms)      ARGV[2] slices per window N   ARGV[3] slice width (ms)
-- ARGV[4] 'i' incremental | 'r' resummarize                 ARGV[5] tie: 'e' | 'l' | 'n'
-- ARGV[6] '1' if negative amounts are allowed
-- ARGV[7] settings fingerprint of the caller's board definition
-- ARGV[8] S slices   ARGV[9] M members   ARGV[10] E events
-- ARGV[11] the newest slice whose ids may be forgotten at `now` (Board::forgettable_through)
-- ARGV[12] the size of the top the change feed watches (0: no feed)
-- ARGV[13] the change stream's cap (entries)
-- ARGV[14] V, the board's windows narrower than the widest (0 on a board with one)
-- ARGV[15] '1' on a dense_rank board
-- then V pairs (slices per window, settings fingerprint), one per narrower window;
-- then S pairs (slice number, forget-at epoch ms), slice i stored at KEYS[8 + i];
-- then M member names;
-- then E events of 5 values: digest, slice index (1..S), member index (1..M), ts, amount;
-- then, only while the instance still holds a legacy `seen` ZSet, the E raw ids.
--
-- Several windows: the first KEYS are the instance of the widest window, which alone
-- remembers idempotency keys and decides what is late (forget-at and ARGV[11] are its);
-- an event that is not late there is deduplicated once and added to every window whose
-- watermark it is above, each window's slices, members and ranking its own. An event
-- that would take a total in any of them past 2^53 - 1 is an overflow for all.
--
-- Idempotency keys are remembered in the instance's digest table (layout in digest.lua),
-- and each remembered key's bucket hash in its slice's forget log. An entry counts while
-- its slice is newer than ARGV[11]. Events of a slice that may already be forgotten (a
-- short dedup_window) are checked but not remembered.
--
-- While the legacy ZSet exists its entries stay authoritative (legacy_seen.lua): a call
-- without the raw ids fails with `ROLLBOARD legacy-seen` (nothing written) and the caller
-- repeats it with them.
--
-- Returns one status per event: 0 applied, 1 duplicate, 2 late, 3 overflow.
--
-- Redis does not roll back a script that fails half-way, so this one is in two phases.
-- Phase 1 only reads: the stored settings, the watermark, the digest table's state and
-- every bucket the chunk's digests address (two HMGETs; the legacy ZSet's existence unless
-- the table's `#c` rules it out,
-- and while it exists the chunk's raw ids in it), every member's state (HMGET, ZMSCORE),
-- every slice field it touches (one HMGET per slice) and the slice registry (one
-- ZMSCORE). Each read also proves its key has the right type, and every stored value is
-- parsed and checked; whatever is wrong raises an error before anything was written. The
-- events are then judged one by one, in order, against that state in Lua. Phase 2 writes
-- the outcome with a handful of variadic commands whose keys and values are known to be
-- valid, so a call either writes all of it or nothing. The function carries no flag, so
-- Redis refuses the whole call up front when it is out of memory, instead of failing at
-- the first write. The checks and writes it shares with fold.lua are in gate.lua, digest.lua,
-- members.lua and write_back.lua.
local meta, result, members, slices, seen, refs, totals, table_key,
  incremental, tie, negative, settings = shared_args(KEYS, ARGV)
local S, M, E = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local V = tonumber(ARGV[14])
local forgotten_through = tonumber(ARGV[11]) % WRAP
local width, top, cap = tonumber(ARGV[3]), tonumber(ARGV[12]), ARGV[13]
local with_dense = ARGV[15] == '1'
local slice_base = 15 + 2 * V
local member_base = slice_base + 2 * S
local event_base = member_base + M
local with_ids = #ARGV >= event_base + 6 * E

-- The windows: views[1] the widest (the fixed KEYS), then the narrower ones.
local views = {}
views[1] = { meta = meta, result = result, members = members, slices = slices, refs = refs,
  totals = totals, settings = settings, per_window = tonumber(ARGV[2]), slice_key = {} }
for i = 1, S do views[1].slice_key[i] = KEYS[8 + i] end
local at
views[1].feed, views[1].dense, at = tail_keys(KEYS, 9 + 2 * S, meta, top, cap, tie, with_dense)
for v = 1, V do
  local view = { meta = KEYS[at], result = KEYS[at + 1], members = KEYS[at + 2],
    slices = KEYS[at + 3], refs = KEYS[at + 4], totals = KEYS[at + 5],
    per_window = tonumber(ARGV[14 + 2 * v]), settings = ARGV[15 + 2 * v], slice_key = {} }
  for i = 1, S do view.slice_key[i] = KEYS[at + 5 + i] end
  view.feed, view.dense, at = tail_keys(KEYS, at + 6 + S, view.meta, top, cap, tie, with_dense)
  views[v + 1] = view
end

-- Phase 1: read and check.
-- Every window's meta; the events are judged at the latest of `now` and their last rolls.
local now = tonumber(ARGV[1])
for _, view in ipairs(views) do
  view.stored = read_meta(view.meta)
  local later, _, _, refused = gate(view.meta, view.stored, view.settings, now, width, view.per_window)
  if refused then return refused end
  if later > now then now = later end
end
for _, view in ipairs(views) do
  local _, watermark, gen = gate(view.meta, view.stored, view.settings, now, width, view.per_window)
  view.watermark, view.gen = watermark, gen
end
local watermark = views[1].watermark

local slice_no, forget, log_key = {}, {}, {}
for i = 1, S do
  slice_no[i] = tonumber(ARGV[slice_base + 2 * i - 1])
  forget[i] = tonumber(ARGV[slice_base + 2 * i])
  log_key[i] = KEYS[8 + S + i]
end
-- live_in[v][s]: slice s is above window v's watermark (every slice that is not late is
-- above the widest's).
for _, view in ipairs(views) do
  view.live_in = {}
  for i = 1, S do view.live_in[i] = slice_no[i] > view.watermark end
end
local names = {}
for i = 1, M do names[i] = ARGV[member_base + i] end

-- The events that are not late, and their raw ids (legacy callers only).
local status = {}
local live, digests, ids = {}, {}, {}
for e = 1, E do
  local b = event_base + (e - 1) * 5
  local s = tonumber(ARGV[b + 2])
  -- Late too once the slice's ids may be forgotten: see fold.lua.
  if slice_no[s] <= watermark or forget[s] <= now then
    status[e] = 2
  else
    if #ARGV[b + 1] ~= DIGEST then return fail('bad digest for event ' .. e) end
    live[#live + 1] = e
    digests[#live] = ARGV[b + 1]
    if with_ids then ids[#ids + 1] = ARGV[event_base + 5 * E + e] end
  end
end
if #live == 0 then return status end

-- The digest table: its state and every bucket the chunk's digests address; the legacy
-- ZSet looked up unless the table's `#c` says there is none (marked here as in fold.lua).
local L, p, held, table_refused, clean, bucket0, stated = table_state(table_key, 0)
if table_refused then return table_refused end
local remembered, mark_clean = {}, false
if not clean then
  local legacy_refused
  remembered, legacy_refused, mark_clean = legacy_remembered(seen, with_ids, ids)
  if legacy_refused then return legacy_refused end
end
-- The live events' digests, end to end: the k-th at byte DIGEST * (k - 1) + 1, its bucket
-- addr[k].
local live_digests = table.concat(digests)
local wanted, listed_bucket, addr = {}, {}, {}
locate(live_digests, 1, #live_digests, DIGEST, L, p, addr, wanted, listed_bucket)
-- The forget logs that may be appended to, read so that their type is checked too.
local logged = {}
local candidates = 0
for _, e in ipairs(live) do
  local s = tonumber(ARGV[event_base + (e - 1) * 5 + 2])
  if forget[s] > now then
    candidates = candidates + 1
    if not logged[s] then
      logged[s] = true
      redis.call('LLEN', log_key[s])
    end
  end
end
-- The buckets that inserting every event of the chunk would split.
splits_ahead(L, p, held + candidates, wanted, listed_bucket)
local bucket_field = {}
local buckets, buckets_refused = read_buckets(table_key, wanted, bucket_field, bucket0)
if not buckets then return buckets_refused end
-- found[k]: the table holds the k-th live event's digest.
local found = {}
held_of(live_digests, 1, #live_digests, addr, buckets, forgotten_through, found)

-- Per window: each member's state before the call (z0, total0, refs0) and as the events
-- change it (z, total, refs_new), by member index; and the slice fields the live events
-- touch there: slice index -> member index -> { old, value }.
for _, view in ipairs(views) do
  local z0, _, total0, refs0, members_refused = member_state(view.members, view.result, view.totals,
    view.refs, names, tie, incremental, negative)
  if members_refused then return members_refused end
  view.z0, view.total0, view.refs0 = z0, total0, refs0
  view.z, view.total, view.refs_new = {}, {}, {}
  for i = 1, M do view.z[i], view.total[i], view.refs_new[i] = z0[i], total0[i], refs0[i] end
  local fields = {}
  for _, e in ipairs(live) do
    local b = event_base + (e - 1) * 5
    local s, m = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    if view.live_in[s] then
      fields[s] = fields[s] or { order = {} }
      if not fields[s][m] then
        fields[s][m] = true
        fields[s].order[#fields[s].order + 1] = m
      end
    end
  end
  for s, f in pairs(fields) do
    local field_names = {}
    for k, m in ipairs(f.order) do field_names[k] = names[m] end
    local olds, slice_refused = integers_of(view.slice_key[s], field_names, nil)
    if not olds then return slice_refused end
    for k, m in ipairs(f.order) do f[m] = { old = olds[k], value = olds[k] or 0 } end
  end
  view.fields = fields
  -- The slice registry, read so that its type is checked before the first write too.
  local touched_slices = {}
  for s in pairs(fields) do touched_slices[#touched_slices + 1] = s end
  table.sort(touched_slices)
  local numbers = {}
  for k, s in ipairs(touched_slices) do numbers[k] = string.format('%d', slice_no[s]) end
  view.touched_slices, view.numbers = touched_slices, numbers
  view.listed = variadic('ZMSCORE', view.slices, numbers)
end

-- Judge the live events in order against the state read above.
local applied = {}
local any, added = false, {}
for k, e in ipairs(live) do
  local b = event_base + (e - 1) * 5
  local id = ARGV[b + 1]
  local seen_until = remembered[k] and tonumber(remembered[k])
  if applied[id] or (seen_until and seen_until > now) or found[k] then
    status[e] = 1
  else
    local s, m = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    local ts, amount = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
    local fits = true
    for _, view in ipairs(views) do
      if view.live_in[s] then
        if math.abs(view.total[m] + amount) > LIMIT or math.abs(view.fields[s][m].value + amount) > LIMIT then
          fits = false
        end
      end
    end
    if not fits then
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
      for _, view in ipairs(views) do
        if view.live_in[s] then
          view.any = true
          local field = view.fields[s][m]
          view.total[m] = view.total[m] + amount
          field.value = field.value + amount
          if not field.touched then
            field.touched = true
            if not field.old then view.refs_new[m] = view.refs_new[m] + 1 end
          end
          local z = view.z
          if not z[m] or (tie ~= 'n' and ts > time_of(z[m], tie)) then z[m] = zmember_at(names[m], ts, tie) end
        end
      end
    end
  end
end
if not any then return status end
for _, view in ipairs(views) do
  if view.any and view.feed then view.old, view.old_totals = recorded_top(view.feed) end
  if view.any then dense_checked(view.dense) end
end

-- Phase 2: write. Every key's type and every value were checked above.
if #added > 0 then
  local dirty, logs = {}, {}
  for _, k in ipairs(added) do
    local b = event_base + (live[k] - 1) * 5
    local d, s = ARGV[b + 1], tonumber(ARGV[b + 2])
    dirty[addr[k]] = (dirty[addr[k]] or buckets[addr[k]]) .. d .. tag_of(slice_no[s])
    logs[s] = logs[s] or {}
    logs[s][#logs[s] + 1] = string.sub(d, 1, 4)
  end
  write_table(table_key, L, p, held + #added, dirty, buckets, bucket_field, forgotten_through,
    mark_clean, stated)
  for s, entries in pairs(logs) do variadic('RPUSH', log_key[s], entries) end
end
for _, view in ipairs(views) do
  if view.any then
    local registered = {}
    for k, s in ipairs(view.touched_slices) do
      local f = view.fields[s]
      local pairs_out = {}
      for _, m in ipairs(f.order) do
        local field = f[m]
        if field.touched then
          pairs_out[#pairs_out + 1] = names[m]
          pairs_out[#pairs_out + 1] = string.format('%d', field.value)
        end
      end
      write_slice(view.slice_key[s], pairs_out, view.listed[k], view.numbers[k], registered)
    end
    variadic('ZADD', view.slices, registered)

    -- t[i]: the tie-break time `members` records for a member whose ZSet member changed.
    local t, z, z0 = {}, view.z, view.z0
    if tie ~= 'n' then
      for i = 1, M do
        if z[i] and z[i] ~= z0[i] then t[i] = time_of(z[i], tie) end
      end
    end
    write_members(view.members, view.result, view.totals, view.refs, incremental, tie, negative, names,
      z0, nil, z, t, view.total0, view.total, view.refs0, view.refs_new, view.dense)
    if view.feed then record_changes(view.feed, view.old, view.old_totals, view.result, 'tip', now) end
    write_meta(view.meta, view.gen, now, nil, view.stored, view.settings)
  end
end
return status
