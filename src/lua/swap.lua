-- swap.lua: replace live keys by their scratch copies in one atomic step, so readers see
-- either the old or the new ranking, never a half.
--
-- KEYS[1] meta    Hash    gen (bumped by every apply and expiry chunk), summed_through
-- KEYS[2] marker  String  written by stage.lua for this run; gone once the run swapped
-- KEYS[3..] pairs: scratch key, live key
--
-- ARGV[1] the `gen` read before the recomputation started, or '' not to check it
-- ARGV[2] the watermark the recomputation summed above, or '' not to check it
--
-- Refuses (returns 0) when the marker is gone (this run already swapped, e.g. a command
-- resent after a reconnect, or its scratch keys expired), when `gen` moved, or when
-- another run already swapped in a sum above a higher watermark (time never goes back).
-- A scratch key that does not exist means "empty": the live key is deleted.
-- Returns 1 when swapped.
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
if ARGV[1] ~= '' and (redis.call('HGET', KEYS[1], 'gen') or '0') ~= ARGV[1] then
  return 0
end
if ARGV[2] ~= '' then
  local summed = tonumber(redis.call('HGET', KEYS[1], 'summed_through'))
  if summed and summed > tonumber(ARGV[2]) then return 0 end
  redis.call('HSET', KEYS[1], 'summed_through', ARGV[2])
end
for i = 3, #KEYS, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('RENAME', KEYS[i], KEYS[i + 1])
    redis.call('PERSIST', KEYS[i + 1])
  else
    redis.call('DEL', KEYS[i + 1])
  end
end
redis.call('DEL', KEYS[2])
return 1
