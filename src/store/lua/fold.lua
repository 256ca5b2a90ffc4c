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
-- feed, then `dense` on dense_rank boards only; then, on a board with several windows,
-- for each narrower window: meta, result, members, slices, refs, totals, its S slice
-- Hashes, then its change stream and its dense ZSet where the board has them).
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
-- Several windows: as in `apply.lua`, the first KEYS (and ARGV[2], ARGV[7]) are the
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
-- Phase 1 only reads and checks, phase 2 only writes, as in `apply.lua` (whose comments
-- describe the checks); a call writes all or nothing, in every window. The digest table
-- and the forget logs are described in digest.lua; the checks and writes shared with
-- `apply.lua` are in gate.lua, digest.lua, members.lua and write_back.lua.
-- Several instances in one call ("packed", on a server that is not a cluster, where keys
-- of several hash tags may meet in one call): ARGV[1] 'many', ARGV[2] P, the instances,
-- then P pairs (the instance's KEYS count, its ARGV count), then each instance's ARGV as
-- above, one after the other, as its KEYS are in KEYS. Each instance is judged as by a
-- call of its own, and only its writes are all or nothing: the reply holds P replies, in
-- order, each the one a call of its own would give, or { -1, error } for one that would
-- have failed (what it wrote before failing stays, as for a call of its own). A packed
-- instance is never chained: its two chain tokens are ''; on a board with one window too
-- it sends them, then V (0) and the dense flag, so that its counts can be checked.
local function fold_one(KEYS, ARGV)
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
  if #blob ~= digest_at - 1 then
    return fail('the digests are ' .. #blob .. ' bytes, not ' .. (digest_at - 1))
  end
  -- A call whose events are judged leaves its chain token (here, and for outcome 1 below).
  if live_count == 0 then
    if token ~= '' then redis.call('HSET', meta, 'chain', token) end
    return out
  end

  -- The digest table: its state and every bucket the live digests address. Its `#c` says
  -- the instance holds no legacy ZSet; without it, that is looked up (and `#c` written with
  -- the table when there is none).
  local L, p, held, table_refused, clean, bucket0, stated = table_state(table_key, 0)
  if table_refused then return table_refused end
  local mark_clean = false
  if not clean then
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
      if unchecked then redis.call('LLEN', KEYS[8 + S + s]) else unchecked = s end
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
    for s = 1, S do
      if not late[s] then locate(blob, first[s], last[s], DIGEST, L, p, addr, wanted, listed_bucket) end
    end
    -- The buckets the inserts would split.
    splits_ahead(L, p, held + remembered, wanted, listed_bucket)
    bucket_field = {}
    local buckets_refused
    buckets, buckets_refused = read_buckets(table_key, wanted, bucket_field, bucket0)
    if not buckets then return buckets_refused end
  end

  -- The duplicates among the live events.
  local dups = 0
  for s = 1, S do
    if not late[s] then
      dups = dups + held_of(blob, first[s], last[s], addr, buckets, forgotten_through)
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
    bound, total0)
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
      group_base, slice_no, vbound, vtotal0)
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

  -- Phase 2: write. Every key's type and every value were checked above, but the first
  -- live slice's forget log: its RPUSH comes first, so a key of the wrong type there fails
  -- the call before anything is written. Some slice is live here, so `remembered` > 0.
  -- dirty[a]: the new value of bucket a.
  local dirty = {}
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
  write_table(table_key, L, p, held + remembered, dirty, buckets, bucket_field, forgotten_through,
    mark_clean, stated)

  local total, refs_new = write_groups(KEYS, 8, slices, touched, numbers, listed, by_slice, g_old,
    names, nums, group_base, total0, refs0)
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
        view.numbers, view.listed, view.by_slice, view.g_old, names, nums, group_base, view.total0,
        view.refs0)
      write_members(view.members, view.result, view.totals, view.refs, incremental, tie, negative,
        names, view.z0, view.t0, nil, view.newest, view.total0, vtotal, view.refs0, vrefs_new,
        view.dense)
      if view.feed then record_changes(view.feed, view.old, view.old_totals, view.result, 'tip', now) end
      write_meta(view.meta, view.gen, now, nil, view.stored, view.settings)
    end
  end
  return out
end

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
