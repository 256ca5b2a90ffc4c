-- apply.lua: fold a batch of events into one board instance, atomically.
--
-- KEYS[1] meta     Hash  expired_through (watermark slice), gen (bumped on every change)
-- KEYS[2] result   ZSet  zmember -> exact total (incremental boards)
-- KEYS[3] members  Hash  member -> zmember (tie-break prefix + member)
-- KEYS[4] slices   ZSet  registry of slice numbers that exist
-- KEYS[5] seen     ZSet  idempotency key -> epoch ms from which it may be forgotten
-- KEYS[6] refs     Hash  member -> number of slices holding it (allow_negative boards)
-- KEYS[7] totals   Hash  member -> exact live total (resummarize boards)
-- KEYS[8..]        slice Hashes of the batch, referenced by index from each event
--
-- ARGV[1] now (epoch ms)      ARGV[2] slices per window N   ARGV[3] slice width (ms)
-- ARGV[4] 'i' incremental | 'r' resummarize                 ARGV[5] tie: 'e' | 'l' | 'n'
-- ARGV[6] '1' if negative amounts are allowed               ARGV[7] number of events
-- then 8 values per event: id, slice n, slice key index (1-based into KEYS[8..]), ts,
-- member, zmember if this event sets the tie-break time, amount, forget-at (epoch ms)
--
-- Returns one status per event: 0 applied, 1 duplicate, 2 late, 3 overflow.
-- Numbers stay below 2^53 in magnitude, so Lua's doubles hold them exactly; a sum that
-- would pass the limit is detected before anything is written.
local LIMIT = 9007199254740991
local meta, result, members, slices, seen, refs, totals = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local now = tonumber(ARGV[1])
local incremental = ARGV[4] == 'i'
local tie = ARGV[5]
local negative = ARGV[6] == '1'
local count = tonumber(ARGV[7])

local horizon = math.floor(now / tonumber(ARGV[3])) - tonumber(ARGV[2])
local expired = tonumber(redis.call('HGET', meta, 'expired_through'))
if expired and expired > horizon then horizon = expired end

local function time_of(zmember)
  local prefix = tonumber(string.sub(zmember, 1, 16))
  if tie == 'e' then return LIMIT - prefix end
  return prefix
end

local out = {}
local changed = false
for i = 0, count - 1 do
  local b = 8 + i * 8
  local id, n, ts = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 3])
  local member, zm_new, amount = ARGV[b + 4], ARGV[b + 5], tonumber(ARGV[b + 6])
  local status = 0
  if n <= horizon then
    status = 2
  else
    local forget = redis.call('ZSCORE', seen, id)
    if forget and tonumber(forget) > now then
      status = 1
    else
      local slice = KEYS[7 + tonumber(ARGV[b + 2])]
      local in_slice = redis.call('HGET', slice, member)
      local old_z = redis.call('HGET', members, member)
      local total = 0
      if incremental then
        if old_z then total = tonumber(redis.call('ZSCORE', result, old_z) or '0') end
      else
        total = tonumber(redis.call('HGET', totals, member) or '0')
      end
      local new_total = total + amount
      local new_slice = (tonumber(in_slice) or 0) + amount
      if math.abs(new_total) > LIMIT or math.abs(new_slice) > LIMIT then
        status = 3
      else
        redis.call('HINCRBY', slice, member, ARGV[b + 6])
        if not in_slice then
          redis.call('ZADD', slices, n, ARGV[b + 1])
          if negative then redis.call('HINCRBY', refs, member, 1) end
        end
        local z = old_z
        if not z or (tie ~= 'n' and ts > time_of(old_z)) then z = zm_new end
        if z ~= old_z then redis.call('HSET', members, member, z) end
        if incremental then
          if old_z and z ~= old_z then redis.call('ZREM', result, old_z) end
          redis.call('ZADD', result, new_total, z)
        else
          redis.call('HINCRBY', totals, member, ARGV[b + 6])
        end
        redis.call('ZADD', seen, ARGV[b + 7], id)
        changed = true
      end
    end
  end
  out[i + 1] = status
end
if changed then redis.call('HINCRBY', meta, 'gen', 1) end
return out
