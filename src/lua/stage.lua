#!lua
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
-- ARGV[3..] quadruples: member, exact total, number of live slices holding it, and the
--           zmember to use (and record in `members`) when `members` does not know the
--           member, or '' to skip such a member
--
-- Reads every member's zmember before the first write. Only scratch keys are written,
-- except for a member that `members` lacks and the caller gave a zmember for (rebuild's
-- repair of an instance whose `members` entry was lost): it is recorded there, which
-- is true whatever happens to this run, since the member holds slice data.
-- Returns { members skipped because `members` does not know them (they left the
-- instance while the caller was summing), { members given their fallback zmember } }.
local flags = ARGV[1]
local function has(f) return string.find(flags, f, 1, true) ~= nil end
local positive_only = has('p')
local rows = {}
for i = 3, #ARGV, 4 do
  rows[#rows + 1] = { m = ARGV[i], total = ARGV[i + 1], refs = ARGV[i + 2], fallback = ARGV[i + 3] }
end
for _, r in ipairs(rows) do r.z = redis.call('HGET', KEYS[1], r.m) end
local skipped, repaired = 0, {}
for _, r in ipairs(rows) do
  if not r.z and r.fallback ~= '' then
    r.z = r.fallback
    redis.call('HSET', KEYS[1], r.m, r.z)
    repaired[#repaired + 1] = r.m
  end
  if not r.z then
    skipped = skipped + 1
  else
    local ranked = not positive_only or tonumber(r.total) > 0
    if has('r') and ranked then redis.call('ZADD', KEYS[2], r.total, r.z) end
    if has('n') and ranked then redis.call('HSET', KEYS[3], r.m, r.z) end
    if has('f') then redis.call('HSET', KEYS[4], r.m, r.refs) end
    if has('t') then redis.call('HSET', KEYS[5], r.m, r.total) end
  end
end
for k = 2, 5 do
  if redis.call('EXISTS', KEYS[k]) == 1 then redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
end
redis.call('SET', KEYS[6], '1', 'PX', ARGV[2])
return { skipped, repaired }
