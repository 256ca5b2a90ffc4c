-- lease.lua: the lease under which one replica runs a tick of a scheduled job.
--
-- KEYS[1] lease  String  `<holder token>@<tick>` while a replica runs the job; it expires
--                        (PX) unless renewed, so the lease of a dead holder lapses
-- KEYS[2] tick   String  the latest tick (epoch ms) a replica started the job for
--
-- ARGV[1] op: acquire, renew or release
-- ARGV[2] the holder's value, `<token>@<tick>` (the token is unique to the process)
-- ARGV[3] acquire, renew: the lease's time to live (ms)
-- ARGV[4] acquire: the tick (epoch ms of the cron fire time)
-- ARGV[5] acquire: how long the tick record is kept (ms)
-- ARGV[6] acquire: the holder's token alone
--
-- Replicas' cron ticks fire at the same wall second. acquire takes the lease only when no
-- replica holds it (a run of an earlier tick still going keeps it, so that tick's run is
-- the only one) and no replica started this tick or a later one (a run that ended before
-- a slower replica's tick fired released the lease, but recorded the tick). A lease held
-- under the caller's own token is taken back: the caller runs one tick of a job at a time,
-- so it is left from a call whose reply was lost (an acquire or a release), and would
-- otherwise keep every replica from the job until it expires.
-- Returns 1 when the op took effect: acquire took the lease, renew reset its time to live,
-- release deleted it; 0 otherwise (renew, release: the lease is not this holder's any more).
local op = ARGV[1]
if op == 'acquire' then
  local held = redis.call('GET', KEYS[1])
  local own = ARGV[6] .. '@'
  if held and string.sub(held, 1, #own) ~= own then return 0 end
  local last = tonumber(redis.call('GET', KEYS[2]) or '')
  local tick = tonumber(ARGV[4])
  if last and last >= tick then return 0 end
  if held then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  elseif not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[3]) then
    return 0
  end
  redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
  return 1
elseif op == 'renew' then
  if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
elseif op == 'release' then
  if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
  redis.call('DEL', KEYS[1])
  return 1
end
return redis.error_reply('ROLLBOARD lease: unknown op ' .. tostring(op))
