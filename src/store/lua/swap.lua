-- swap.lua: replace live keys by their scratch copies in one atomic step, so readers see
-- either the old or the new ranking, never a half.
--
-- KEYS[1] meta    Hash    gen (bumped by every apply and expiry chunk), expired_through,
--                         summed_through, summed_gen, summed_ms
-- KEYS[2] marker  String  written by stage.lua for this run; gone once the run swapped
-- KEYS[3]  changes Stream  the change feed of the top, when the board has one and the
--                         ranking is swapped (absent otherwise: changes.lua)
-- then triples: scratch key, live key, trash key (where the live value is moved); the
-- ranking's first when it is swapped
--
-- ARGV[1] the `gen` read before the recomputation started, or '' not to check it
-- ARGV[2] the watermark the recomputation summed above, or '' not to check it
-- ARGV[3] time to live of the trash keys (ms), should the caller die before freeing them
-- ARGV[4] with ARGV[2]: the `gen` read before the live slices were summed, or '' for none.
--         Recorded as `summed_gen` beside `summed_through`: while `gen` still equals it,
--         nothing has changed since the sum and the next run may leave the ranking as it is.
--         A gen-checked swap (ARGV[1], rebuild's) that gives none summed at ARGV[1], which is
--         still current: that is its sum's `gen`, checked and recorded the same way.
-- ARGV[5] with ARGV[4]: the time of the run (epoch ms), recorded as `summed_ms`; '' records
--         none, so the next run sums again all the same.
-- ARGV[6] the size of the top the change feed watches (0: no feed)
-- ARGV[7] the change stream's cap (entries)   ARGV[8] tie: 'e' | 'l' | 'n'
--
-- Refuses (returns 0) when the marker is gone (this run already swapped, e.g. a command
-- resent after a reconnect, or its scratch keys expired), when `gen` moved, when the
-- watermark (`expired_through`) was raised above ARGV[2], when another run already swapped
-- in a sum above a higher watermark, or one above the same watermark read at a later `gen`
-- (time never goes back: two replicas' runs race, and the one that summed first may swap
-- last). A scratch key that does not exist means "empty": the live key goes away.
--
-- No value is freed here: a RENAME over an existing key, like DEL, frees the old value
-- synchronously (Redis 7.0 with the default `lazyfree-lazy-server-del no`), which takes
-- tens of milliseconds for a 1M-member ranking. The live value is renamed to its trash
-- key instead (O(1)) and the caller UNLINKs the trash keys after this call, so they are
-- freed in Redis's background thread.
-- Returns 1 when swapped.
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
if ARGV[1] ~= '' and (redis.call('HGET', KEYS[1], 'gen') or '0') ~= ARGV[1] then
  return 0
end
local feed = feed_of(KEYS[3], KEYS[1], tonumber(ARGV[6]), ARGV[7], ARGV[8])
local first = feed and 4 or 3
local old, old_totals
if feed then old, old_totals = recorded_top(feed) end
if ARGV[2] ~= '' then
  local state = redis.call('HMGET', KEYS[1], 'summed_through', 'summed_gen', 'expired_through')
  local summed, summed_gen = tonumber(state[1]), tonumber(state[2])
  -- A watermark raised past the sum's since it was read made some of the slices it summed
  -- dead: another replica may have expired them part way under its HSCANs. That replica's
  -- run, or the next one, sums above the new watermark.
  local current = tonumber(state[3])
  if current and current > tonumber(ARGV[2]) then return 0 end
  -- Without this, a run that summed before a rebuild and swaps after it would not be
  -- refused, and its older sum would replace the rebuilt ranking until the next run.
  local read_at = ARGV[4] ~= '' and ARGV[4] or ARGV[1]
  local watermark, gen = tonumber(ARGV[2]), tonumber(read_at)
  if summed and summed > watermark then return 0 end
  if gen and summed == watermark and summed_gen and summed_gen > gen then return 0 end
  if gen then
    redis.call('HSET', KEYS[1], 'summed_through', ARGV[2], 'summed_gen', read_at)
    if ARGV[5] ~= '' then
      redis.call('HSET', KEYS[1], 'summed_ms', ARGV[5])
    else
      redis.call('HDEL', KEYS[1], 'summed_ms')
    end
  else
    -- A sum whose `gen` is not known: no later run may take the ranking for current.
    redis.call('HSET', KEYS[1], 'summed_through', ARGV[2])
    redis.call('HDEL', KEYS[1], 'summed_gen', 'summed_ms')
  end
end
for i = first, #KEYS, 3 do
  if redis.call('EXISTS', KEYS[i + 1]) == 1 then
    redis.call('RENAME', KEYS[i + 1], KEYS[i + 2])
    redis.call('PEXPIRE', KEYS[i + 2], ARGV[3])
  end
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('RENAME', KEYS[i], KEYS[i + 1])
    redis.call('PERSIST', KEYS[i + 1])
  end
end
redis.call('DEL', KEYS[2])
if feed then record_changes(feed, old, old_totals, KEYS[first + 1], 'roll') end
return 1
