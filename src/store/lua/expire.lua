-- expire.lua: expire one chunk of a dead slice of one instance, exactly once.
--
-- KEYS[1] meta     Hash  settings, gen (bumped when anything changes)
-- KEYS[2] result   ZSet  zmember -> exact total (incremental boards)
-- KEYS[3] members  Hash  member -> its tie-break time (the ZSet member is prefix:member)
-- KEYS[4] refs     Hash  member -> live slices holding it (allow_negative boards)
-- KEYS[5] totals   Hash  member -> exact live total (resummarize boards)
-- KEYS[6] slice    Hash  the dead slice: member -> amount
-- KEYS[7] changes  Stream  the change feed of the top (incremental boards with a feed
--                         only; absent elsewhere: changes.lua)
-- then    dense    ZSet  distinct totals above 0 (dense_rank boards only; absent elsewhere)
--
-- ARGV[1] 'i' incremental | 'r' resummarize   ARGV[2] '1' if negatives are allowed
-- ARGV[3] settings fingerprint of the caller's board definition
-- ARGV[4] tie: 'e' | 'l' | 'n'
-- ARGV[5] the size of the top the change feed watches (0: no feed)
-- ARGV[6] the change stream's cap (entries)
-- ARGV[7..] member names, as listed by the caller's HSCAN of the slice
--
-- A dead slice is frozen: the watermark was raised before the caller scanned it, so the
-- apply script rejects every event for it and the amounts cannot change. A field still in
-- the slice is the claim: the amount is read here, subtracted and the field deleted in
-- this one call, so a member already handled by a concurrent or crashed roller is gone
-- from the slice and skipped.
--
-- Like fold.lua, the script reads and checks everything first (types, stored settings,
-- every value) and writes only after that, so a call that fails has written nothing.
-- Scores stay integers below 2^53, so they are exact in Lua's doubles.
-- Returns { fields expired, members that left the instance }.
local meta, result, members, refs, totals, slice = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local incremental = ARGV[1] == 'i'
local negative = ARGV[2] == '1'
local tie = ARGV[4]
local feed = feed_of(KEYS[7], KEYS[1], tonumber(ARGV[5]), ARGV[6], tie)
local dense = KEYS[feed and 8 or 7]

-- Phase 1: read and check.
local stored = redis.call('HMGET', meta, 'settings', 'gen')
local refused = settings_refused(stored[1], ARGV[3])
if refused then return refused end
if stored[2] and not counter(stored[2]) then
  return fail('corrupt: ' .. meta .. ' gen is not an integer')
end
local names, unique = {}, {}
for i = 7, #ARGV do
  if not unique[ARGV[i]] then
    unique[ARGV[i]] = true
    names[#names + 1] = ARGV[i]
  end
end
local amounts, slice_refused = integers_of(slice, names, nil)
if not amounts then return slice_refused end
local claimed, amount = {}, {}
for i, m in ipairs(names) do
  if amounts[i] then
    claimed[#claimed + 1] = m
    amount[#claimed] = amounts[i]
  end
end
if #claimed == 0 then return { 0, 0 } end

local zs, _, total, count, members_refused = member_state(members, result, totals, refs, claimed,
  tie, incremental, negative)
if members_refused then return members_refused end

-- Work out each member's new state.
local gone_names, gone_z = {}, {}
local scores_out, totals_out, refs_out = {}, {}, {}
local dense_left, dense_entered = {}, {}
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
  if incremental and zs[i] and (gone or left ~= total[i]) then
    if total[i] > 0 then dense_left[#dense_left + 1] = string.format('%d', total[i]) end
    if not gone and left > 0 then dense_entered[#dense_entered + 1] = string.format('%d', left) end
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

local old, old_totals
if feed then old, old_totals = recorded_top(feed) end
if incremental then dense_checked(dense) end

-- Phase 2: write.
variadic('HDEL', slice, claimed)
if incremental then
  variadic('ZADD', result, scores_out)
  variadic('ZREM', result, gone_z)
  dense_update(dense, result, dense_left, dense_entered)
else
  variadic('HSET', totals, totals_out)
  variadic('HDEL', totals, gone_names)
end
if negative then
  variadic('HSET', refs, refs_out)
  variadic('HDEL', refs, gone_names)
end
variadic('HDEL', members, gone_names)
if feed then record_changes(feed, old, old_totals, result, 'roll') end
redis.call('HINCRBY', meta, 'gen', 1)
return { #claimed, #gone_names }
