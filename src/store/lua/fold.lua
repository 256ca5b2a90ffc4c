-- fold.lua: fold a chunk of events into one board instance, pre-aggregated by the caller,
-- atomically: the one script that applies events.
--
-- The caller sends each event's idempotency digest, and the events' amounts summed per
-- (member, slice) ("groups"), so the work here is one digest check per event and one update
-- per group and per member, not one per event. That holds only while no event of the chunk
-- can be judged differently one at a time: when some but not all of its events are
-- duplicates, when a total could pass 2^53 - 1, or while the instance still holds a legacy
-- `seen` ZSet, the call writes nothing and answers `slow`: the caller then sends the same
-- events, in stream order, as a call judging each event on its own ('each', below), the
-- degenerate case of a group of one event. The caller sends no id twice in one grouped
-- chunk (a chunk with a repeated id is judged each event on its own directly).
--
-- KEYS[1] meta     Hash  expired_through (watermark slice), settings, gen (bumped on change),
--                        changed_ms (`now` of the last call that wrote), chain (below)
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
-- then             changes  Stream  the change feed of the top (boards with a feed only;
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
-- ARGV[8] S slices   ARGV[9] M members   ARGV[10] G groups
-- ARGV[11] the newest slice whose ids may be forgotten at `now` (Board::forgettable_through)
-- ARGV[12] the size of the top the change feed watches (0: no feed)
-- ARGV[13] the change stream's cap (entries)
-- ARGV[14] the digests: 16 bytes per event, concatenated, the events of slice 1 first
-- ARGV[15] the numbers, one MessagePack array of 3S + 5G integers (one `cmsgpack.unpack`
-- instead of a `tonumber` each): S triples (slice number, forget-at epoch ms, events in
-- the slice), slice i stored at KEYS[8 + i]; then G groups of five: member index 1..M,
-- slice index 1..S, the sum of the group's amounts, the sum of their absolute values, and
-- the newest event time among them. Then the M member names. Then, optionally, two chain
-- tokens (below). Then, on a
-- board with several windows only (the two chain tokens then always sent, '' for none):
-- V, the board's windows narrower than the widest, '1' on a dense_rank board, and V pairs
-- (slices per window, settings fingerprint), one per narrower window. A board with one
-- window sends nothing after the chain tokens, and its call makes no read, write or table
-- for other windows.
--
-- Several windows: the first KEYS (and ARGV[2], ARGV[7]) are the
-- instance of the widest window, which alone remembers idempotency keys, decides what is
-- late (the reply's slices are late in every window) and holds the chain token; a group
-- of a slice that is not late counts in every window whose watermark its slice is above.
-- The call answers `slow` when a total or slice field could pass 2^53 - 1 in any window,
-- and writes each window that a group counts in (its `meta` `gen` and `changed_ms` too).
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
-- Judging each event on its own ('each': where a grouped call answered `slow`, or its chunk
-- repeats an id): ARGV[1] 'each', then the ARGV above with each event a group of its own,
-- in stream order (G events, the k-th digest of ARGV[14] the k-th event's, not grouped by
-- slice), always followed by the two chain tokens ('': never chained), V and the dense
-- flag, then, only while the instance still holds a legacy `seen` ZSet, the G events' raw
-- ids (without them such a call fails with `ROLLBOARD legacy-seen`, writing nothing, and
-- the caller sends it again with them). The events are judged one by one, in order: late
-- (its slice has left the window, or its ids may already be forgotten), else duplicate
-- (by the table, an earlier event of the call, or the legacy ZSet), else overflow (a total
-- or slice field would pass 2^53 - 1 in a window it counts in), else applied; the applied
-- events are then written as a grouped call's groups would be. Returns one status per
-- event: 0 applied, 1 duplicate, 2 late, 3 overflow.
--
-- Redis does not roll back a script that fails half-way, so each call is in two phases.
-- Phase 1 only reads: the stored settings, the watermark, the digest table's state and
-- every bucket the live digests address (two HMGETs; the legacy ZSet's existence unless the
-- table's `#c` rules it out), every member's state (HMGET, ZMSCORE), every slice field the
-- groups touch (one HMGET per slice), the slice registry (one ZMSCORE) and the forget logs
-- (LLEN). Each read also proves its key has the right type, and every stored value is
-- parsed and checked; whatever is wrong raises an error before anything was written.
-- Phase 2 writes the outcome with a handful of variadic commands whose keys and values are
-- known to be valid, so a call either writes all of it or nothing, in every window. The
-- function carries no flag, so Redis refuses the whole call up front when it is out of
-- memory, instead of failing at the first write. The digest table and the forget logs are
-- described in digest.lua; the checks and writes are in gate.lua, digest.lua,
-- members.lua and write_back.lua.
-- Several instances in one call ("packed", on a server that is not a cluster, where keys
-- of several hash tags may meet in one call): ARGV[1] 'many', ARGV[2] P, the instances,
-- then P pairs (the instance's KEYS count, its ARGV count), then each instance's ARGV as
-- above, one after the other, as its KEYS are in KEYS. Each instance is judged as by a
-- call of its own, and only its writes are all or nothing: the reply holds P replies, in
-- order, each the one a call of its own would give, or { -1, error } for one that would
-- have failed (what it wrote before failing stays, as for a call of its own). A packed
-- instance is never chained: its two chain tokens are ''; on a board with one window too
-- it sends them, then V (0) and the dense flag, so that its counts can be checked.
-- A call judging each event on its own ('each', below): the groups are single events in
-- stream order, the k-th digest of the blob the k-th group's. Judges them one by one as
-- stream order would: late when its slice is (`late`); else a duplicate when the table holds
-- its digest (`found`), an event applied earlier in the call had it, or the legacy ZSet
-- remembers its raw id until after `now` (`legacy`, by group, nil for none); else an
-- overflow when it would take a total or a slice field past 2^53 - 1 in a window it counts
-- in; else applied. `windows[w]`: the slices counting there (`counts`: slice index ->
-- true), its members' totals before the call (`total0`, by member index), its groups'
-- fields before the call (`before`, by group, as group_fields reads them) and the slices it
-- touches (`touched`). Returns the statuses (0 applied, 1 duplicate, 2 late, 3 overflow)
-- and the applied groups, in order; and sets in each window the applied events summed per
-- (member, slice) as groups of their own (`by_slice`, `before` by those groups' indices, and
-- `newest`, each member's newest applied event time), indices in `sums`: groups of five
-- numbers as the caller's (member, slice, sum, 0, newest time), so that the writes are a
-- grouped call's.
local function judge_each(G, S, nums, gb, blob, late, found, legacy, windows, now, sums)
  local abs, sub = math.abs, string.sub
  local status, applied, first_of, sum_at, seen_here = {}, {}, {}, {}, {}
  local total, field = {}, {}
  for w = 1, #windows do total[w], field[w] = {}, {} end
  for g = 1, G do
    local b = gb + 5 * (g - 1)
    local m, s, amount, ts = nums[b + 1], nums[b + 2], nums[b + 3], nums[b + 5]
    if late[s] then
      status[g] = 2
    else
      local d = sub(blob, DIGEST * (g - 1) + 1, DIGEST * g)
      local until_ms = legacy and legacy[g]
      if seen_here[d] or found[g] or (until_ms and tonumber(until_ms) > now) then
        status[g] = 1
      else
        local key = (m - 1) * S + s
        local fits = true
        for w, win in ipairs(windows) do
          if win.counts[s] then
            local t, f = total[w][m] or win.total0[m], field[w][key] or win.before[g] or 0
            if abs(t + amount) > LIMIT or abs(f + amount) > LIMIT then fits = false end
          end
        end
        if not fits then
          status[g] = 3
        else
          status[g] = 0
          seen_here[d] = true
          applied[#applied + 1] = g
          for w, win in ipairs(windows) do
            if win.counts[s] then
              total[w][m] = (total[w][m] or win.total0[m]) + amount
              field[w][key] = (field[w][key] or win.before[g] or 0) + amount
            end
          end
          local a = sum_at[key]
          if not a then
            a = #first_of + 1
            sum_at[key], first_of[a] = a, g
            sums[5 * a - 4], sums[5 * a - 3], sums[5 * a - 2], sums[5 * a - 1], sums[5 * a] = m, s, 0, 0, ts
          end
          sums[5 * a - 2] = sums[5 * a - 2] + amount
          if ts > sums[5 * a] then sums[5 * a] = ts end
        end
      end
    end
  end
  for _, win in ipairs(windows) do
    local by_slice, old, newest = {}, {}, {}
    for _, s in ipairs(win.touched) do by_slice[s] = {} end
    for a, g in ipairs(first_of) do
      local m, s, t = sums[5 * a - 4], sums[5 * a - 3], sums[5 * a]
      if win.counts[s] then
        local list = by_slice[s]
        list[#list + 1] = a
        old[a] = win.before[g]
        if not newest[m] or t > newest[m] then newest[m] = t end
        win.any = true
      end
    end
    win.by_slice, win.before, win.newest = by_slice, old, newest
  end
  return status, applied
end

local function fold_one(KEYS, ARGV, each)
  local meta, result, members, slices, seen, refs, totals, table_key,
    incremental, tie, negative, settings = shared_args(KEYS, ARGV)
  -- The globals used per slice, group or member, held in locals: a function reaches the
  -- library's globals through a metatable, a local directly.
  local tonumber, abs, sub, format = tonumber, math.abs, string.sub, string.format
  local S, M, G = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
  local forgotten_through = tonumber(ARGV[11]) % WRAP
  local width, top, cap = tonumber(ARGV[3]), tonumber(ARGV[12]), ARGV[13]
  local blob = ARGV[14]
  local unpacked, nums = pcall(cmsgpack.unpack, ARGV[15])
  if not unpacked or type(nums) ~= 'table' or #nums ~= 3 * S + 5 * G then
    return fail('the numbers are not ' .. (3 * S + 5 * G) .. ' integers')
  end
  local member_base, group_base = 15, 3 * S
  local tail = member_base + M
  local after, token = ARGV[tail + 1] or '', ARGV[tail + 2] or ''
  -- V, the narrower windows; a board with one window sends neither V nor the dense flag:
  -- its call ends with `dense` when it has one.
  local V, with_dense = 0, nil
  if ARGV[tail + 3] then
    V, with_dense = tonumber(ARGV[tail + 3]), ARGV[tail + 4] == '1'
  else
    with_dense = #KEYS > 8 + 2 * S + (top > 0 and 1 or 0)
  end
  -- Judging each event on its own: never chained, V and the dense flag always sent, then,
  -- for an instance still holding the legacy `seen` ZSet, the G events' raw ids; each
  -- slice's count the number of events in it. All checked before anything is read.
  local ids
  if each then
    if not V or V < 0 or V % 1 ~= 0 then return fail('each: no window count') end
    if after ~= '' or token ~= '' then return fail('each: a call judging each event is not chained') end
    local tail_end = tail + 4 + 2 * V
    if #ARGV ~= tail_end and #ARGV ~= tail_end + G then
      return fail('each: ' .. #ARGV .. ' ARGV is neither ' .. tail_end .. ' nor ' .. (tail_end + G))
    end
    if #ARGV > tail_end then ids = { unpack(ARGV, tail_end + 1, tail_end + G) } end
    local in_slice = {}
    for g = 1, G do
      local s = nums[group_base + 5 * g - 3]
      in_slice[s] = (in_slice[s] or 0) + 1
    end
    for i = 1, S do
      if nums[3 * i] ~= (in_slice[i] or 0) then
        return fail('each: slice ' .. i .. ' does not count its events')
      end
    end
  end
  local feed, dense, at = tail_keys(KEYS, 9 + 2 * S, meta, top, cap, tie, with_dense)
  -- The narrower windows (none on a board with one), each one's state in a table of its
  -- own; the widest's is in locals, so that a board with one window pays for no table. A
  -- window's slice i is KEYS[slice_at + i] (the widest's: KEYS[8 + i]).
  local narrower = V > 0 and {} or nil
  for v = 1, V do
    local view = { meta = KEYS[at], result = KEYS[at + 1], members = KEYS[at + 2],
      slices = KEYS[at + 3], refs = KEYS[at + 4], totals = KEYS[at + 5], slice_at = at + 5,
      per_window = tonumber(ARGV[tail + 3 + 2 * v]), settings = ARGV[tail + 4 + 2 * v] }
    view.feed, view.dense, at = tail_keys(KEYS, at + 6 + S, view.meta, top, cap, tie, with_dense)
    narrower[v] = view
  end

  -- Phase 1: read and check.
  local stored = read_meta(meta)
  if after ~= '' and stored[CHAIN] ~= after then return { 3 } end
  local per_window = tonumber(ARGV[2])
  local now, watermark, gen, refused = gate(meta, stored, settings, tonumber(ARGV[1]), width, per_window)
  if refused then return refused end
  if V > 0 then
    -- Every window's meta; the events are judged at the latest of `now` and their last
    -- rolls, every window's watermark at that time.
    local later = now
    for v = 1, V do
      local view = narrower[v]
      view.stored = read_meta(view.meta)
      local at_least, _, _, window_refused = gate(view.meta, view.stored, view.settings, now, width,
        view.per_window)
      if window_refused then return window_refused end
      if at_least > later then later = at_least end
    end
    if later > now then now, watermark, gen = gate(meta, stored, settings, later, width, per_window) end
    for v = 1, V do
      local view = narrower[v]
      local _, w, g = gate(view.meta, view.stored, view.settings, now, width, view.per_window)
      view.watermark, view.gen = w, g
    end
  end

  -- Slices: number, whether late (a slice that is not is live: its ids are remembered), its
  -- digests' range.
  local slice_no, late, first, last = {}, {}, {}, {}
  local out = { 0 }
  local digest_at, live_count = 1, 0
  for i = 1, S do
    local b = 3 * (i - 1)
    local n, count = nums[b + 1], nums[b + 3]
    slice_no[i] = n
    first[i] = digest_at
    digest_at = digest_at + DIGEST * count
    last[i] = digest_at - 1
    -- Late too once the slice's ids may be forgotten (a `dedup_window` duration): an id is
    -- forgotten only once events of its slice can no longer be applied.
    if n <= watermark or nums[b + 2] <= now then
      late[i] = true
      out[#out + 1] = i
    else
      live_count = live_count + count
    end
  end
  if #blob ~= digest_at - 1 or each and #blob ~= DIGEST * G then
    return fail('the digests are ' .. #blob .. ' bytes, not ' .. (digest_at - 1))
  end
  -- A call whose events are judged leaves its chain token (here, and for outcome 1 below).
  if live_count == 0 then
    if token ~= '' then redis.call('HSET', meta, 'chain', token) end
    if each then
      local status = {}
      for g = 1, G do status[g] = 2 end
      return status
    end
    return out
  end
  -- Judging each event on its own: the live groups (in order), their slices.
  local live_groups
  if each then
    live_groups = {}
    for g = 1, G do
      if not late[nums[group_base + 5 * g - 3]] then live_groups[#live_groups + 1] = g end
    end
  end

  -- The digest table: its state and every bucket the live digests address. Its `#c` says
  -- the instance holds no legacy ZSet; without it, that is looked up (and `#c` written with
  -- the table when there is none).
  local L, p, held, table_refused, clean, bucket0, stated = table_state(table_key, 0)
  if table_refused then return table_refused end
  local mark_clean, legacy = false, nil
  if not clean and each then
    -- Its raw ids stay authoritative while it exists: a call without them fails
    -- (`legacy-seen`) and the caller sends it again with them.
    local live_ids = {}
    for k, g in ipairs(live_groups) do live_ids[k] = ids and ids[g] end
    local remembered_until, legacy_refused
    remembered_until, legacy_refused, mark_clean = legacy_remembered(seen, ids ~= nil, live_ids)
    if legacy_refused then return legacy_refused end
    legacy = {}
    for k, g in ipairs(live_groups) do legacy[g] = remembered_until[k] end
  elseif not clean then
    if legacy_held(seen) then
      out[1] = 2
      return out
    end
    mark_clean = true
  end
  -- addr[k]: the bucket of the k-th digest of the blob (at byte DIGEST * (k - 1) + 1); nil
  -- for a table of one bucket, where every digest is in bucket 0.
  local addr, buckets, bucket_field
  local remembered = live_count
  -- The forget logs that will be appended to, read so that their type is checked too; all
  -- but the first live slice's, whose RPUSH is phase 2's first write (below).
  local unchecked = nil
  for s = 1, S do
    if not late[s] then
      if unchecked or each then redis.call('LLEN', KEYS[8 + S + s]) else unchecked = s end
    end
  end
  if L == 0 and p == 0 and held + remembered <= LOAD then
    -- A table of one bucket that the inserts do not split (every small instance's): each
    -- digest is in bucket 0, which table_state read.
    buckets = { [0] = bucket0 or '' }
    if #buckets[0] % ENTRY ~= 0 then
      return fail('corrupt: ' .. table_key .. ' bucket 0 is ' .. #buckets[0] .. ' bytes')
    end
  else
    local wanted, listed_bucket = {}, {}
    addr = {}
    if each then
      for _, g in ipairs(live_groups) do
        locate(blob, DIGEST * (g - 1) + 1, DIGEST * (g - 1) + 1, DIGEST, L, p, addr, wanted, listed_bucket)
      end
    else
      for s = 1, S do
        if not late[s] then locate(blob, first[s], last[s], DIGEST, L, p, addr, wanted, listed_bucket) end
      end
    end
    -- The buckets the inserts would split.
    splits_ahead(L, p, held + remembered, wanted, listed_bucket)
    bucket_field = {}
    local buckets_refused
    buckets, buckets_refused = read_buckets(table_key, wanted, bucket_field, bucket0)
    if not buckets then return buckets_refused end
  end

  -- The duplicates among the live events (judging each on its own: which they are).
  local dups, found = 0, nil
  if each then
    found = {}
    for _, g in ipairs(live_groups) do
      local at = DIGEST * (g - 1) + 1
      held_of(blob, at, at, addr, buckets, forgotten_through, found)
    end
  else
    for s = 1, S do
      if not late[s] then
        dups = dups + held_of(blob, first[s], last[s], addr, buckets, forgotten_through)
      end
    end
  end
  if dups > 0 then
    if dups == live_count then
      -- Judged without a write: the first live forget log, which phase 2's first RPUSH
      -- would have checked, is checked here, as every other key the call names.
      if unchecked then redis.call('LLEN', KEYS[8 + S + unchecked]) end
      out[1] = 1
      if token ~= '' then redis.call('HSET', meta, 'chain', token) end
      return out
    end
    out[1] = 2
    return out
  end

  -- Member state: z0, each known member's ZSet member, and t0, its tie-break time (none
  -- under tie 'n'); totals and slice counts.
  local names = { unpack(ARGV, member_base + 1, member_base + M) }
  local z0, t0, total0, refs0, members_refused = member_state(members, result, totals, refs, names,
    tie, incremental, negative)
  if members_refused then return members_refused end
  -- bound[i]: the sum of the absolute amounts of member i's live groups.
  local bound = {}
  for i = 1, M do bound[i] = 0 end

  -- Groups of the live slices, per slice: the fields they touch. A member of late slices
  -- only is left as it is.
  local by_slice, newest = {}, {}
  -- Group g's numbers are nums[group_base + 5 * g - 4 ...]: its member index, slice index,
  -- sum, absolute amounts and newest time (read there, not copied to tables of their own).
  for g = 1, G do
    local b = group_base + 5 * (g - 1)
    local m, s = nums[b + 1], nums[b + 2]
    if not late[s] then
      bound[m] = bound[m] + nums[b + 4]
      local t = nums[b + 5]
      if not newest[m] or t > newest[m] then newest[m] = t end
      local list = by_slice[s]
      if not list then
        list = {}
        by_slice[s] = list
      end
      list[#list + 1] = g
    end
  end

  -- The fields the groups touch, read and checked (members.lua): `slow` when a field or a
  -- total could pass 2^53 - 1 part-way, as event by event the order would matter.
  local touched, numbers, g_old = group_fields(KEYS, 8, by_slice, names, nums, group_base, slice_no,
    not each and bound or nil, total0)
  if touched == false then
    out[1] = 2
    return out
  end
  if not touched then return numbers end
  -- The narrower windows: the same reads, for the groups of the slices above each one's
  -- watermark (every slice that is not late is above the widest's).
  for v = 1, V do
    local view = narrower[v]
    local vz0, vt0, vtotal0, vrefs0, refused_there = member_state(view.members, view.result,
      view.totals, view.refs, names, tie, incremental, negative)
    if refused_there then return refused_there end
    local vbound, vnewest, vby_slice = {}, {}, {}
    for i = 1, M do vbound[i] = 0 end
    for g = 1, G do
      local b = group_base + 5 * (g - 1)
      local s = nums[b + 2]
      if not late[s] and slice_no[s] > view.watermark then
        local m, t = nums[b + 1], nums[b + 5]
        vbound[m] = vbound[m] + nums[b + 4]
        if not vnewest[m] or t > vnewest[m] then vnewest[m] = t end
        local list = vby_slice[s]
        if not list then
          list = {}
          vby_slice[s] = list
        end
        list[#list + 1] = g
      end
    end
    local vtouched, vnumbers, vg_old = group_fields(KEYS, view.slice_at, vby_slice, names, nums,
      group_base, slice_no, not each and vbound or nil, vtotal0)
    if vtouched == false then
      out[1] = 2
      return out
    end
    if not vtouched then return vnumbers end
    view.z0, view.t0, view.total0, view.refs0 = vz0, vt0, vtotal0, vrefs0
    view.newest, view.by_slice = vnewest, vby_slice
    view.touched, view.numbers, view.g_old = vtouched, vnumbers, vg_old
  end
  -- The slice registries, recorded tops and distinct totals of the windows written (the
  -- widest always: every live slice counts there), read so that their types are checked too.
  local listed = variadic('ZMSCORE', slices, numbers)
  local old, old_totals
  if feed then old, old_totals = recorded_top(feed) end
  dense_checked(dense)
  for v = 1, V do
    local view = narrower[v]
    if #view.touched > 0 then
      view.listed = variadic('ZMSCORE', view.slices, view.numbers)
      if view.feed then view.old, view.old_totals = recorded_top(view.feed) end
      dense_checked(view.dense)
    end
  end

  -- Judging each event on its own: which are applied, and their sums per (member, slice),
  -- which the writes below take as a grouped call's groups (gs, from gb).
  local gs, gb, status, applied = nums, group_base, nil, nil
  if each then
    local windows = { { counts = {}, total0 = total0, before = g_old, touched = touched } }
    for s = 1, S do windows[1].counts[s] = not late[s] end
    for v = 1, V do
      local view = narrower[v]
      view.counts, view.before = {}, view.g_old
      for s = 1, S do view.counts[s] = not late[s] and slice_no[s] > view.watermark end
      windows[v + 1] = view
    end
    gs, gb = {}, 0
    status, applied = judge_each(G, S, nums, group_base, blob, late, found, legacy, windows, now, gs)
    if #applied == 0 then return status end
    by_slice, g_old, newest = windows[1].by_slice, windows[1].before, windows[1].newest
    for v = 1, V do
      local view = narrower[v]
      view.g_old = view.before
      if not view.any then view.touched = {} end
    end
  end

  -- Phase 2: write. Every key's type and every value were checked above, but the first
  -- live slice's forget log: its RPUSH comes first, so a key of the wrong type there fails
  -- the call before anything is written. Some slice is live here, so `remembered` > 0.
  -- dirty[a]: the new value of bucket a.
  local dirty = {}
  if each then
    -- The applied events' digests, each slice's log in the events' order.
    local logs = {}
    for _, g in ipairs(applied) do
      local i, s = DIGEST * (g - 1) + 1, nums[group_base + 5 * g - 3]
      local a = addr and addr[g] or 0
      dirty[a] = (dirty[a] or buckets[a]) .. sub(blob, i, i + DIGEST - 1) .. tag_of(slice_no[s])
      logs[s] = logs[s] or {}
      logs[s][#logs[s] + 1] = sub(blob, i, i + 3)
    end
    for s = 1, S do
      if logs[s] then variadic('RPUSH', KEYS[8 + S + s], logs[s]) end
    end
    remembered = #applied
  else
    for s = 1, S do
      if not late[s] then
        local tag = tag_of(slice_no[s])
        local log = {}
        for i = first[s], last[s], DIGEST do
          local a = addr and addr[(i - 1) / DIGEST + 1] or 0
          dirty[a] = (dirty[a] or buckets[a]) .. sub(blob, i, i + DIGEST - 1) .. tag
          log[#log + 1] = sub(blob, i, i + 3)
        end
        variadic('RPUSH', KEYS[8 + S + s], log)
      end
    end
  end
  write_table(table_key, L, p, held + remembered, dirty, buckets, bucket_field, forgotten_through,
    mark_clean, stated)

  local total, refs_new = write_groups(KEYS, 8, slices, touched, numbers, listed, by_slice, g_old,
    names, gs, gb, total0, refs0)
  -- A member whose events are all late (no newest time) is left as it is.
  write_members(members, result, totals, refs, incremental, tie, negative, names, z0, t0, nil,
    newest, total0, total, refs0, refs_new, dense)
  if feed then record_changes(feed, old, old_totals, result, 'tip', now) end
  write_meta(meta, gen, now, token, stored, settings)
  -- The narrower windows a group counts in, as the widest; the chain token stays on the
  -- widest's meta.
  for v = 1, V do
    local view = narrower[v]
    if #view.touched > 0 then
      local vtotal, vrefs_new = write_groups(KEYS, view.slice_at, view.slices, view.touched,
        view.numbers, view.listed, view.by_slice, view.g_old, names, gs, gb, view.total0,
        view.refs0)
      write_members(view.members, view.result, view.totals, view.refs, incremental, tie, negative,
        names, view.z0, view.t0, nil, view.newest, view.total0, vtotal, view.refs0, vrefs_new,
        view.dense)
      if view.feed then record_changes(view.feed, view.old, view.old_totals, view.result, 'tip', now) end
      write_meta(view.meta, view.gen, now, nil, view.stored, view.settings)
    end
  end
  return status or out
end

if ARGV[1] == 'each' then return fold_one(KEYS, { unpack(ARGV, 2) }, true) end
if ARGV[1] ~= 'many' then return fold_one(KEYS, ARGV) end
local P = tonumber(ARGV[2])
if not P or P < 1 or P % 1 ~= 0 or #ARGV < 2 + 2 * P then
  return fail('packed: the instance count is not a count of the ARGV')
end
local key_at, arg_at = 0, 2 + 2 * P
for i = 1, P do
  local nk, na = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  if not nk or not na or nk < 0 or na < 0 or nk % 1 ~= 0 or na % 1 ~= 0 then
    return fail('packed: instance ' .. i .. ' has no KEYS and ARGV counts')
  end
  key_at, arg_at = key_at + nk, arg_at + na
end
if key_at ~= #KEYS or arg_at ~= #ARGV then
  return fail('packed: the counts name ' .. key_at .. ' KEYS and ' .. arg_at .. ' ARGV, not '
    .. #KEYS .. ' and ' .. #ARGV)
end
-- Every instance's counts, against what its own ARGV say it holds (S slices, M members, a
-- feed when its top is above 0, V narrower windows and the dense flag, which a packed
-- instance always sends, after its two chain tokens), before any instance runs: counts
-- that add up but cut the instances in the wrong places are refused whole.
arg_at = 2 + 2 * P
for i = 1, P do
  local nk, na = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  local S, M, top = tonumber(ARGV[arg_at + 8]), tonumber(ARGV[arg_at + 9]), tonumber(ARGV[arg_at + 12])
  local V = M and tonumber(ARGV[arg_at + 15 + M + 3])
  if not (S and M and top and V) or S % 1 ~= 0 or M % 1 ~= 0 or V % 1 ~= 0 or S < 0 or M < 0
    or V < 0 then
    return fail('packed: instance ' .. i .. ' has no slice, member or window counts')
  end
  local per_window = (top > 0 and 1 or 0) + (ARGV[arg_at + 15 + M + 4] == '1' and 1 or 0)
  if na ~= 15 + M + 4 + 2 * V or nk ~= 8 + 2 * S + per_window + V * (6 + S + per_window) then
    return fail('packed: instance ' .. i .. ' is not cut where its counts say')
  end
  arg_at = arg_at + na
end
local out = {}
key_at, arg_at = 0, 2 + 2 * P
for i = 1, P do
  local nk, na = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  -- Each table made in one step, at its size (a request holds at most 3 999 arguments,
  -- within what `unpack` returns).
  local keys = { unpack(KEYS, key_at + 1, key_at + nk) }
  local args = { unpack(ARGV, arg_at + 1, arg_at + na) }
  key_at, arg_at = key_at + nk, arg_at + na
  -- A script's own refusal is returned as an error reply (fail); a `redis.call` that
  -- fails raises Redis's error (its code first: `WRONGTYPE ...`), and Lua's own errors
  -- are given the code Redis gives them, `ERR`.
  local ran, reply = pcall(fold_one, keys, args)
  if ran and not reply.err then
    out[i] = reply
  elseif ran then
    out[i] = { -1, reply.err }
  elseif type(reply) == 'table' and reply.err then
    out[i] = { -1, reply.err }
  elseif string.find(tostring(reply), '^%u+ ') then
    out[i] = { -1, tostring(reply) }
  else
    out[i] = { -1, 'ERR ' .. tostring(reply) }
  end
end
return out
