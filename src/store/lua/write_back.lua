-- write_back.lua: the end of phase 2 of fold.lua, once the events are judged
-- and the digest table written: the slice fields and the slice registry, each changed
-- member's `members` entry, ranking or total and slice count, then `meta`.
-- Used by: fold.lua.

-- Writes `pairs_out` (member, amount, ...) to the slice Hash `key`; when the registry did
-- not list the slice (`listed`), adds slice `number` to `registered`, the ZADD arguments
-- of the registry. Nothing for no pairs.
local function write_slice(key, pairs_out, listed, number, registered)
  if #pairs_out == 0 then return end
  variadic('HSET', key, pairs_out)
  if not listed then
    registered[#registered + 1] = number
    registered[#registered + 1] = number
  end
end

-- For fold.lua: writes one window's groups (as members.lua group_fields reads them: the
-- slices `touched`, with their numbers, `by_slice`, each group's field before the call
-- old[g], and group g adding gs[gb + 5 * g - 2] to member index gs[gb + 5 * g - 4]) to its
-- slice Hashes (slice i at keys[slice_at + i]) and its slice registry `registry` (`listed`:
-- its ZMSCORE of `numbers`). Returns each member's total and slice count after the call, by member
-- index, from total0 and refs0 before it.
local function write_groups(keys, slice_at, registry, touched, numbers, listed, by_slice, old,
                            names, gs, gb, total0, refs0)
  local format = string.format
  local total, refs_new = {}, {}
  for i = 1, #names do total[i], refs_new[i] = total0[i], refs0[i] end
  local registered = {}
  for k, s in ipairs(touched) do
    local pairs_out = {}
    for _, g in ipairs(by_slice[s]) do
      local m, was, sum = gs[gb + 5 * g - 4], old[g], gs[gb + 5 * g - 2]
      total[m] = total[m] + sum
      if not was then refs_new[m] = refs_new[m] + 1 end
      pairs_out[#pairs_out + 1] = names[m]
      pairs_out[#pairs_out + 1] = format('%d', (was or 0) + sum)
    end
    write_slice(keys[slice_at + s], pairs_out, listed[k], numbers[k], registered)
  end
  variadic('ZADD', registry, registered)
  return total, refs_new
end

-- Writes the members' changes, each member i by its index in `names`: for each that has
-- a ZSet member zi after the call (none: left as it is), from ZSet member z0[i], total
-- total0[i] and slice count refs0[i] to zi, total[i] and refs[i]; when zi is not z0[i],
-- `members` records t[i], its tie-break time ('' under tie 'n'). zi is z[i] when `z` is
-- given; else t[i] is the time of the member's newest event, if it
-- has one, and zi its ZSet member at that time when that is later than t0[i], its time
-- before (zmember_at, written out). With `dense` (a dense_rank board's distinct totals,
-- nil otherwise) it is kept in step with `result` (dense_update). One loop over the
-- members, then one command per key.
local function write_members(members, result, totals, refs, incremental, tie, negative, names,
                             z0, t0, z, t, total0, total, refs0, refs_new, dense)
  local format = string.format
  -- Only the lists this board writes are made: ZSet changes on an incremental board, else
  -- totals; slice counts where negative amounts are allowed; distinct totals on dense ones.
  local moved, removed, added, totals_out, refs_out, left, entered = {}, nil, nil, nil, nil, nil, nil
  if incremental then
    removed, added = {}, {}
    if dense then left, entered = {}, {} end
  else
    totals_out = {}
  end
  if negative then refs_out = {} end
  for i = 1, #names do
    local old, zi = z0[i], nil
    if z then
      zi = z[i]
    elseif t[i] then
      local ti = t[i]
      if tie == 'n' then
        zi = names[i]
      elseif not old or ti > t0[i] then
        zi = format('%016d:%s', tie == 'e' and LIMIT - ti or ti, names[i])
      else
        zi = old
      end
    end
    if zi then
      if zi ~= old then
        moved[#moved + 1] = names[i]
        moved[#moved + 1] = tie == 'n' and '' or format('%d', t[i])
      end
      if incremental then
        if old and zi ~= old then removed[#removed + 1] = old end
        if zi ~= old or total[i] ~= total0[i] then
          added[#added + 1] = format('%d', total[i])
          added[#added + 1] = zi
        end
        -- For dense_update: the distinct totals a member left and entered.
        if dense and total[i] ~= total0[i] then
          if total0[i] > 0 then left[#left + 1] = format('%d', total0[i]) end
          if total[i] > 0 then entered[#entered + 1] = format('%d', total[i]) end
        end
      elseif total[i] ~= total0[i] or not old then
        totals_out[#totals_out + 1] = names[i]
        totals_out[#totals_out + 1] = format('%d', total[i])
      end
      if negative and refs_new[i] ~= refs0[i] then
        refs_out[#refs_out + 1] = names[i]
        refs_out[#refs_out + 1] = format('%d', refs_new[i])
      end
    end
  end
  variadic('HSET', members, moved)
  if incremental then
    variadic('ZREM', result, removed)
    variadic('ZADD', result, added)
    if dense then dense_update(dense, result, left, entered) end
  else
    variadic('HSET', totals, totals_out)
  end
  if negative then variadic('HSET', refs, refs_out) end
end

-- The last write: `gen` was checked in phase 1 (gate, which gives it as a number), so one
-- HSET both bumps it and records when the ranking last changed (`changed_ms`, the `as_of`
-- of a query) at no extra command, leaves the chain `token` (fold.lua) when there is one,
-- and pins the caller's settings fingerprint on an instance that has none yet (`stored`,
-- read_meta's reply; see gate.lua).
local function write_meta(meta, gen, now, token, stored, settings)
  local format = string.format
  local out = { 'gen', format('%d', gen + 1), 'changed_ms', format('%d', now) }
  if token and token ~= '' then out[5], out[6] = 'chain', token end
  if not stored[SETTINGS] then
    out[#out + 1], out[#out + 2] = 'settings', settings
  end
  redis.call('HSET', meta, unpack(out))
end
