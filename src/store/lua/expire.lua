-- expire.lua: expire one chunk of a dead slice of one instance, exactly once.
--
-- KEYS[1] meta     Hash  settings, gen (bumped when anything changes)
-- KEYS[2] result   ZSet  zmember -> exact total (incremental boards)
-- KEYS[3] members  Hash  member -> its tie-break time (the ZSet member is prefix:member)
-- KEYS[4] refs     Hash  member -> live slices holding it (allow_negative boards)
-- KEYS[5] totals   Hash  member -> exact live total (resummarize boards)
-- KEYS[6] slice    Hash  the dead slice: member -> amount
--
-- ARGV[1] 'i' incremental | 'r' resummarize   ARGV[2] '1' if negatives are allowed
-- ARGV[3] settings fingerprint of the caller's board definition
-- ARGV[4] tie: 'e' | 'l' | 'n'
-- ARGV[5..] member names, as listed by the caller's HSCAN of the slice
--
-- A dead slice is frozen: the watermark was raised before the caller scanned it, so the
-- apply script rejects every event for it and the amounts cannot change. A field still in
-- the slice is the claim: the amount is read here, subtracted and the field deleted in
-- this one call, so a member already handled by a concurrent or crashed roller is gone
-- from the slice and skipped.
--
-- Like apply.lua, the script reads and checks everything first (types, stored settings,
-- every value) and writes only after that, so a call that fails has written nothing.
-- Scores stay integers below 2^53, so they are exact in Lua's doubles.
-- Returns { fields expired, members that left the instance }.
local meta, result, members, refs, totals, slice = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local incremental = ARGV[1] == 'i'
local negative = ARGV[2] == '1'
local tie = ARGV[4]

-- Phase 1: read and check.
local stored = redis.call('HMGET', meta, 'settings', 'gen')
if stored[1] and stored[1] ~= ARGV[3] then
  return fail('settings: the board was created with ' .. stored[1] .. ', this process has ' .. ARGV[3])
end
if stored[2] and not counter(stored[2]) then
  return fail('corrupt: ' .. meta .. ' gen is not an integer')
end
local names, unique = {}, {}
for i = 5, #ARGV do
  if not unique[ARGV[i]] then
    unique[ARGV[i]] = true
    names[#names + 1] = ARGV[i]
  end
end
local amounts = variadic('HMGET', slice, names)
local claimed, amount = {}, {}
for i, m in ipairs(names) do
  if amounts[i] then
    local a = integer(amounts[i])
    if not a then return fail('corrupt: ' .. slice .. ' holds ' .. amounts[i] .. ' for ' .. m) end
    claimed[#claimed + 1] = m
    amount[#claimed] = a
  end
end
if #claimed == 0 then return { 0, 0 } end

local zs = variadic('HMGET', members, claimed)
for i = 1, #claimed do
  if zs[i] then
    local z = zmember_of(zs[i], claimed[i], tie)
    if not z then return fail('corrupt: ' .. members .. ' holds ' .. zs[i] .. ' for ' .. claimed[i]) end
    zs[i] = z
  end
end
local total = {}
if incremental then
  local scored, at = {}, {}
  for i = 1, #claimed do
    total[i] = 0
    if zs[i] then
      scored[#scored + 1] = zs[i]
      at[#at + 1] = i
    end
  end
  -- Read even when no member has an entry: phase 2 may write `result` in any case.
  if #scored == 0 then redis.call('ZCARD', result) end
  local scores = variadic('ZMSCORE', result, scored)
  for k, i in ipairs(at) do
    if scores[k] then
      total[i] = integer(scores[k])
      if not total[i] then return fail('corrupt: ' .. result .. ' score of ' .. claimed[i]) end
    end
  end
else
  local ts = variadic('HMGET', totals, claimed)
  for i = 1, #claimed do
    total[i] = 0
    if ts[i] then
      total[i] = integer(ts[i])
      if not total[i] then return fail('corrupt: ' .. totals .. ' holds ' .. ts[i] .. ' for ' .. claimed[i]) end
    end
  end
end
local count = {}
if negative then
  local rs = variadic('HMGET', refs, claimed)
  for i = 1, #claimed do
    count[i] = 0
    if rs[i] then
      count[i] = integer(rs[i])
      if not count[i] then return fail('corrupt: ' .. refs .. ' holds ' .. rs[i] .. ' for ' .. claimed[i]) end
    end
  end
end

-- Work out each member's new state.
local gone_names, gone_z = {}, {}
local scores_out, totals_out, refs_out = {}, {}, {}
for i, m in ipairs(claimed) do
  local left = total[i] - amount[i]
  local gone
  if negative then
    gone = count[i] - 1 <= 0
  elseif incremental and not zs[i] then
    gone = true
  else
    gone = left <= 0
  end
  if gone then
    gone_names[#gone_names + 1] = m
    if zs[i] then gone_z[#gone_z + 1] = zs[i] end
  else
    if incremental then
      if zs[i] then
        scores_out[#scores_out + 1] = string.format('%d', left)
        scores_out[#scores_out + 1] = zs[i]
      end
    else
      totals_out[#totals_out + 1] = m
      totals_out[#totals_out + 1] = string.format('%d', left)
    end
    if negative then
      refs_out[#refs_out + 1] = m
      refs_out[#refs_out + 1] = string.format('%d', count[i] - 1)
    end
  end
end

-- Phase 2: write.
variadic('HDEL', slice, claimed)
if incremental then
  variadic('ZADD', result, scores_out)
  variadic('ZREM', result, gone_z)
else
  variadic('HSET', totals, totals_out)
  variadic('HDEL', totals, gone_names)
end
if negative then
  variadic('HSET', refs, refs_out)
  variadic('HDEL', refs, gone_names)
end
variadic('HDEL', members, gone_names)
redis.call('HINCRBY', meta, 'gen', 1)
return { #claimed, #gone_names }
