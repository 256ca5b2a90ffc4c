-- write_back.lua: the end of phase 2 of apply.lua and fold.lua, once the events are judged
-- and the digest table written: the slice fields and the slice registry, each changed
-- member's `members` entry, ranking or total and slice count, then `meta`.
-- Used by: apply.lua, fold.lua.

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

-- The member writes of one call, collected by member_changed and written by
-- write_members.
local function member_writes()
  return { moved = {}, removed = {}, added = {}, totals = {}, refs = {}, left = {}, entered = {} }
end

-- Collects in `w` the writes of member `name`, from ZSet member `z0`, total `total0` and
-- slice count `refs0` to `z`, `total` and `refs`; `stored` is what `members` records for
-- `z` (used only when it is not `z0`).
local function member_changed(w, incremental, name, z0, z, stored, total0, total, refs0, refs)
  if z ~= z0 then
    w.moved[#w.moved + 1] = name
    w.moved[#w.moved + 1] = stored
  end
  if incremental then
    if z0 and z ~= z0 then w.removed[#w.removed + 1] = z0 end
    if z ~= z0 or total ~= total0 then
      w.added[#w.added + 1] = string.format('%d', total)
      w.added[#w.added + 1] = z
    end
    -- For dense_update: the distinct totals a member left and entered.
    if total ~= total0 then
      if total0 > 0 then w.left[#w.left + 1] = string.format('%d', total0) end
      if total > 0 then w.entered[#w.entered + 1] = string.format('%d', total) end
    end
  elseif total ~= total0 or not z0 then
    w.totals[#w.totals + 1] = name
    w.totals[#w.totals + 1] = string.format('%d', total)
  end
  if refs ~= refs0 then
    w.refs[#w.refs + 1] = name
    w.refs[#w.refs + 1] = string.format('%d', refs)
  end
end

-- Writes what member_changed collected in `w`; with `dense` (a dense_rank board's distinct
-- totals, nil otherwise), keeps it in step with `result` (dense_update).
local function write_members(w, members, result, totals, refs, negative, dense)
  variadic('HSET', members, w.moved)
  variadic('ZREM', result, w.removed)
  variadic('ZADD', result, w.added)
  dense_update(dense, result, w.left, w.entered)
  variadic('HSET', totals, w.totals)
  if negative then variadic('HSET', refs, w.refs) end
end

-- The last write: `gen` was checked in phase 1, so one HSET both bumps it and records when
-- the ranking last changed (`changed_ms`, the `as_of` of a query) at no extra command,
-- and leaves the chain `token` (fold.lua) when there is one.
local function write_meta(meta, stored, now, token)
  local gen = string.format('%d', (counter(stored.gen) or 0) + 1)
  if token and token ~= '' then
    redis.call('HSET', meta, 'gen', gen, 'changed_ms', string.format('%d', now), 'chain', token)
  else
    redis.call('HSET', meta, 'gen', gen, 'changed_ms', string.format('%d', now))
  end
end
