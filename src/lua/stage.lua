-- stage.lua: write one chunk of a recomputed instance into scratch keys.
--
-- KEYS[1] members  Hash  member -> zmember (source of the tie-break time)
-- KEYS[2] result   ZSet  scratch ranking:        zmember -> total  (flag 'r')
-- KEYS[3] ranked   Hash  scratch lookup:         member -> zmember (flag 'n')
-- KEYS[4] refs     Hash  scratch slice counts:   member -> count   (flag 'f')
-- KEYS[5] totals   Hash  scratch live totals:    member -> total   (flag 't')
-- KEYS[6] marker   String  this run's marker, checked and removed by swap.lua
--
-- ARGV[1] flags: any of 'r', 'n', 'f', 't'; 'p' writes result/ranked only for totals > 0
-- ARGV[2] time to live of the scratch keys (ms), so a crashed run leaves nothing behind
-- ARGV[3..] triples: member, exact total, number of live slices holding it
--
-- Returns the number of members skipped because `members` does not know them (they left
-- the instance while the caller was summing).
local flags = ARGV[1]
local function has(f) return string.find(flags, f, 1, true) ~= nil end
local positive_only = has('p')
local skipped = 0
for i = 3, #ARGV, 3 do
  local m, total, refs = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local z = redis.call('HGET', KEYS[1], m)
  if not z then
    skipped = skipped + 1
  else
    local ranked = not positive_only or tonumber(total) > 0
    if has('r') and ranked then redis.call('ZADD', KEYS[2], total, z) end
    if has('n') and ranked then redis.call('HSET', KEYS[3], m, z) end
    if has('f') then redis.call('HSET', KEYS[4], m, refs) end
    if has('t') then redis.call('HSET', KEYS[5], m, total) end
  end
end
for k = 2, 5 do
  if redis.call('EXISTS', KEYS[k]) == 1 then redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
end
redis.call('SET', KEYS[6], '1', 'PX', ARGV[2])
return skipped
