-- swap.lua: replace live keys by their scratch copies in one atomic step, so readers see
-- either the old or the new ranking, never a half.
--
-- KEYS[1] meta  Hash  gen (bumped by every apply and expiry chunk)
-- KEYS[2..] pairs: scratch key, live key
--
-- ARGV[1] the `gen` read before the recomputation started, or '' to swap unconditionally
--
-- A scratch key that does not exist means "empty": the live key is deleted.
-- Returns 1 when swapped, 0 when `gen` moved (the caller recomputes and tries again).
if ARGV[1] ~= '' and (redis.call('HGET', KEYS[1], 'gen') or '0') ~= ARGV[1] then
  return 0
end
for i = 2, #KEYS, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('RENAME', KEYS[i], KEYS[i + 1])
    redis.call('PERSIST', KEYS[i + 1])
  else
    redis.call('DEL', KEYS[i + 1])
  end
end
return 1
