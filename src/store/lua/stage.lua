-- stage.lua: write one chunk of a recomputed instance into scratch keys.
--
-- KEYS[1] members  Hash  member -> its tie-break time (the ZSet member is prefix:member)
-- KEYS[2] result   ZSet  scratch ranking:        zmember -> total  (flag 'r')
-- KEYS[3] ranked   Hash  scratch lookup:         member -> tie-break time (flag 'n')
-- KEYS[4] refs     Hash  scratch slice counts:   member -> count   (flag 'f')
-- KEYS[5] totals   Hash  scratch live totals:    member -> total   (flag 't')
-- KEYS[6] marker   String  this run's marker, checked and removed by swap.lua
-- KEYS[7] meta     Hash  the instance's `gen`, bumped by a repair (below)
-- KEYS[8] dense    ZSet  scratch distinct totals above 0 of the scratch ranking (flag 'r'
--                        on dense_rank boards only; absent elsewhere)
--
-- ARGV[1] flags: any of 'r', 'n', 'f', 't'; 'p' writes result/ranked only for totals > 0
-- ARGV[2] time to live of the scratch keys (ms), so a crashed run leaves nothing behind
-- ARGV[3] tie: 'e' | 'l' | 'n'
-- ARGV[4..] quadruples: member, exact total, number of live slices holding it, and the
--           zmember to use (and record in `members`) when `members` does not know the
--           member, or '' to skip such a member
--
-- Reads every member's zmember before the first write. Only scratch keys are written,
-- except for a member that `members` lacks and the caller gave a zmember for (rebuild's
-- repair of an instance whose `members` entry was lost): it is recorded there, which
-- is true whatever happens to this run, since the member holds slice data. Such a repair
-- bumps `gen`: a resummarize run that summed before it (and skipped the member) must not
-- be taken for current, and this run's own gen-checked swap is refused once (its retry
-- finds nothing left to repair).
-- Returns { members skipped because `members` does not know them (they left the
-- instance while the caller was summing), { members given their fallback zmember } }.
local flags = ARGV[1]
local function has(f) return string.find(flags, f, 1, true) ~= nil end
local positive_only = has('p')
local tie = ARGV[3]

local rows, names = {}, {}
for i = 4, #ARGV, 4 do
  rows[#rows + 1] = { m = ARGV[i], total = ARGV[i + 1], refs = ARGV[i + 2], fallback = ARGV[i + 3] }
  names[#names + 1] = ARGV[i]
end
-- One read and one write per key (not per row): the call's cost is a few µs per row.
local zs, _, refused = zmembers_of(KEYS[1], names, tie)
if not zs then return refused end
local skipped, repaired = 0, {}
local fixed, ranking, ranked, refs, totals, distinct = {}, {}, {}, {}, {}, {}
for i, r in ipairs(rows) do r.z = zs[i] end
for _, r in ipairs(rows) do
  if not r.z and r.fallback ~= '' then
    r.z = r.fallback
    fixed[#fixed + 1] = r.m
    fixed[#fixed + 1] = stored_of(r.z, tie)
    repaired[#repaired + 1] = r.m
  end
  if not r.z then
    skipped = skipped + 1
  else
    if not positive_only or tonumber(r.total) > 0 then
      ranking[#ranking + 1] = r.total
      ranking[#ranking + 1] = r.z
      ranked[#ranked + 1] = r.m
      ranked[#ranked + 1] = stored_of(r.z, tie)
      if tonumber(r.total) > 0 then
        distinct[#distinct + 1] = r.total
        distinct[#distinct + 1] = r.total
      end
    end
    refs[#refs + 1] = r.m
    refs[#refs + 1] = r.refs
    totals[#totals + 1] = r.m
    totals[#totals + 1] = r.total
  end
end
if #fixed > 0 then
  redis.call('HINCRBY', KEYS[7], 'gen', 1)
  redis.call('HSET', KEYS[1], unpack(fixed))
end
if has('r') and #ranking > 0 then redis.call('ZADD', KEYS[2], unpack(ranking)) end
if has('n') and #ranked > 0 then redis.call('HSET', KEYS[3], unpack(ranked)) end
if has('f') and #refs > 0 then redis.call('HSET', KEYS[4], unpack(refs)) end
if has('t') and #totals > 0 then redis.call('HSET', KEYS[5], unpack(totals)) end
local dense = has('r') and KEYS[8]
if dense and #distinct > 0 then redis.call('ZADD', dense, unpack(distinct)) end
local scratch = { KEYS[2], KEYS[3], KEYS[4], KEYS[5], dense or nil }
for _, key in ipairs(scratch) do
  if redis.call('EXISTS', key) == 1 then redis.call('PEXPIRE', key, ARGV[2]) end
end
redis.call('SET', KEYS[6], '1', 'PX', ARGV[2])
return { skipped, repaired }
