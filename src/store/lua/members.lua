-- members.lua: the `members` map and the state kept beside it per member: how a stored
-- value names a ZSet member, and the reads of members, totals, slice counts and slice
-- fields, each value checked.
-- Used by: fold.lua, expire.lua, stage.lua.
--
-- `members` holds each member's tie-break time (ms, as an integer: 16 B of Redis memory
-- where the 16-digit prefix took 32) or '' on boards without tie-break (`tie` 'n'); an
-- entry written by an older version holds the whole ZSet member, prefix included. `tie`:
-- 'e' earliest first, 'l' latest first, 'n' none.

-- The ZSet member of `name` with tie-break time `t`.
local function zmember_at(name, t, tie)
  if tie == 'n' then return name end
  return string.format('%016d:%s', tie == 'e' and LIMIT - t or t, name)
end

-- The tie-break time of ZSet member `z` (on a board with tie-break).
local function time_of(z, tie)
  local prefix = tonumber(string.sub(z, 1, 16))
  if tie == 'e' then return LIMIT - prefix end
  return prefix
end

-- The ZSet member a `members` value `v` stands for and the tie-break time (nil under 'n'),
-- or nil when the value is neither form (or names another member, or a time out of range).
local function zmember_of(v, name, tie)
  if tie == 'n' then return name end
  if #v <= 16 and string.find(v, '^%d+$') then
    local t = tonumber(v)
    if t > LIMIT then return nil end
    -- zmember_at, written out: this runs for every member of a call.
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
  return string.format('%d', time_of(z, tie))
end

-- The ZSet member and tie-break time of each of `names` as `members` records them, in one
-- HMGET: two lists by name index, nil for a member it does not know; or nil, nil and the
-- error naming the first value that is neither form.
local function zmembers_of(members, names, tie)
  local values = variadic('HMGET', members, names)
  local zs, ts = {}, {}
  for i = 1, #names do
    local v = values[i]
    if v then
      local z, t = zmember_of(v, names[i], tie)
      if not z then return nil, nil, fail('corrupt: ' .. members .. ' holds ' .. v .. ' for ' .. names[i]) end
      zs[i], ts[i] = z, t
    end
  end
  return zs, ts
end

-- The integers Hash `key` holds for `names`, in one HMGET: a list by name index, `absent`
-- for a name without a field; or nil and the error naming the first value that is not an
-- integer.
local function integers_of(key, names, absent)
  local values = variadic('HMGET', key, names)
  local out = {}
  for i = 1, #names do
    local v = values[i]
    if v then
      local n = integer(v)
      if not n then return nil, fail('corrupt: ' .. key .. ' holds ' .. v .. ' for ' .. names[i]) end
      out[i] = n
    else
      out[i] = absent
    end
  end
  return out
end

-- For fold.lua, whose caller sums the events' amounts per (member, slice), a "group": the
-- fields one window's groups touch and their checks. `by_slice` maps a slice index to the
-- window's groups there, group g of member index gs[gb + 5 * g - 4] with absolute amounts
-- gs[gb + 5 * g - 1] (fold.lua's numbers, `gb` where its groups begin); slice i's Hash is keys[slice_at + i] and its number slice_no[i]. Reads each
-- slice's fields (one HMGET per slice) and checks that no field, and no member's total
-- (total0[i], with bound[i] the absolute amounts of member i's groups there), could pass
-- 2^53 - 1 part-way (no check without `bound`: a call judging each event on its own checks
-- each). Returns the touched slices' indices and numbers and each group's field before the
-- call (old[g], nil for none); or false when a value could pass that bound (the events are
-- then judged one by one); or nil and the error naming a value that is not an integer.
local function group_fields(keys, slice_at, by_slice, names, gs, gb, slice_no, bound,
                            total0)
  local abs, format = math.abs, string.format
  local touched, numbers, old = {}, {}, {}
  for s = 1, #slice_no do
    local list = by_slice[s]
    if list then
      local key = keys[slice_at + s]
      local wanted = {}
      for k, g in ipairs(list) do wanted[k] = names[gs[gb + 5 * g - 4]] end
      local values = variadic('HMGET', key, wanted)
      for k, g in ipairs(list) do
        local v = values[k]
        if v then
          local n = integer(v)
          if not n then
            return nil, fail('corrupt: ' .. key .. ' holds ' .. v .. ' for ' .. wanted[k])
          end
          old[g] = n
          if bound and abs(n) + gs[gb + 5 * g - 1] > LIMIT then return false end
        elseif bound and gs[gb + 5 * g - 1] > LIMIT then
          return false
        end
      end
      touched[#touched + 1] = s
      numbers[#numbers + 1] = format('%d', slice_no[s])
    end
  end
  for i = 1, bound and #names or 0 do
    if abs(total0[i]) + bound[i] > LIMIT then return false end
  end
  return touched, numbers, old
end

-- The state of each of `names` before the call, read and checked in this order: `z` and
-- `t`, its ZSet member and tie-break time (as zmembers_of reads them), `total`, its exact
-- total (0 for none: its score in `result`, read by its ZSet member, on an incremental
-- board, else its field in `totals`) and `refs`, the number of slices holding it (0 for
-- none, and for every member on a board that does not allow negative amounts): the four
-- lists by name index, z, t, total and refs; or four nils and the error naming the first
-- value that is wrong. One loop over the members for what needs no more reads, and no
-- list made that the board does not use.
local function member_state(members, result, totals, refs, names, tie, incremental, negative)
  local values = variadic('HMGET', members, names)
  local zs, ts, total, held_by = {}, {}, nil, nil
  -- On an incremental board: the known members' ZSet members and their indices, whose
  -- scores are the totals.
  local scored, scored_at
  if incremental then total, scored, scored_at = {}, {}, {} end
  if not negative then held_by = {} end
  for i = 1, #names do
    local v = values[i]
    if v then
      local z, t = zmember_of(v, names[i], tie)
      if not z then
        return nil, nil, nil, nil, fail('corrupt: ' .. members .. ' holds ' .. v .. ' for ' .. names[i])
      end
      zs[i], ts[i] = z, t
      if incremental then
        scored[#scored + 1] = z
        scored_at[#scored_at + 1] = i
      end
    end
    if incremental then total[i] = 0 end
    if not negative then held_by[i] = 0 end
  end
  local refused
  if incremental then
    -- Read even when no member is known yet: phase 2 may write `result` in any case.
    if #scored == 0 then redis.call('ZCARD', result) end
    local scores = variadic('ZMSCORE', result, scored)
    for k, i in ipairs(scored_at) do
      if scores[k] then
        local n = integer(scores[k])
        if not n then return nil, nil, nil, nil, fail('corrupt: ' .. result .. ' score of ' .. names[i]) end
        total[i] = n
      end
    end
  else
    total, refused = integers_of(totals, names, 0)
    if not total then return nil, nil, nil, nil, refused end
  end
  if negative then
    held_by, refused = integers_of(refs, names, 0)
    if not held_by then return nil, nil, nil, nil, refused end
  end
  return zs, ts, total, held_by
end

-- Reads `dense` (nil: nothing), so that a key of another type fails the call in its
-- phase 1, before anything was written (dense_update writes it in phase 2).
local function dense_checked(dense)
  if dense then redis.call('ZCARD', dense) end
end

-- Keeps `dense` (dense_rank boards only, nil elsewhere: nothing is done) in step with
-- `result` once `result` is written: a ZSet of the distinct totals above 0 that members of
-- `result` hold, each scored by itself (member: the total in decimal, '%d'). Every total in
-- `entered` (held by a member now) is added; every one of `left` (held by a member before
-- the call) that no member of `result` holds any more is removed. Totals are exact
-- integers below 2^53, so a score and `ZCOUNT result t t` are exact too.
local function dense_update(dense, result, left, entered)
  if not dense then return end
  local added = {}
  for _, t in ipairs(entered) do
    added[#added + 1] = t
    added[#added + 1] = t
  end
  variadic('ZADD', dense, added)
  local gone = {}
  for _, t in ipairs(left) do
    if redis.call('ZCOUNT', result, t, t) == 0 then gone[#gone + 1] = t end
  end
  variadic('ZREM', dense, gone)
end
