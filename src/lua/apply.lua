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
--
-- Events are judged one by one, in order. Each member's stored state (ZSet member and
-- total) is read once per call and written once at the end, so a batch costs one
-- ZADD NX (dedup) and one HINCRBY (slice) per event plus a few commands per member.
-- Numbers stay below 2^53 in magnitude, so Lua's doubles hold them exactly; a sum that
-- would pass the limit is detected before anything is written for that event.
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

-- member -> { z0 = stored zmember | false, z = current, total0 = stored total, total, refs = added slices }
local state = {}
local touched = {}
local function load(member)
  local s = state[member]
  if s then return s end
  local z = redis.call('HGET', members, member)
  local total = 0
  if incremental then
    if z then total = tonumber(redis.call('ZSCORE', result, z) or '0') end
  else
    total = tonumber(redis.call('HGET', totals, member) or '0')
  end
  s = { z0 = z, z = z, total0 = total, total = total, refs = 0 }
  state[member] = s
  touched[#touched + 1] = member
  return s
end

local registered = {}
local out = {}
local changed = false
for i = 0, count - 1 do
  local b = 8 + i * 8
  local id, n = ARGV[b], tonumber(ARGV[b + 1])
  local status = 0
  if n <= horizon then
    status = 2
  else
    local forget = ARGV[b + 7]
    local fresh = redis.call('ZADD', seen, 'NX', forget, id) == 1
    if not fresh then
      if tonumber(redis.call('ZSCORE', seen, id)) > now then
        status = 1
      else
        -- Remembered once, but its time is up: it counts as new.
        redis.call('ZADD', seen, forget, id)
        fresh = true
      end
    end
    if fresh then
      local member, amount = ARGV[b + 4], tonumber(ARGV[b + 6])
      local s = load(member)
      local slice = KEYS[7 + tonumber(ARGV[b + 2])]
      local new_total = s.total + amount
      local in_slice = true
      local slice_ok = true
      if negative then
        -- With refunds a slice can exceed the total, and a new field adds a live slice.
        in_slice = redis.call('HGET', slice, member)
        slice_ok = math.abs((tonumber(in_slice) or 0) + amount) <= LIMIT
      end
      if math.abs(new_total) > LIMIT or not slice_ok then
        redis.call('ZREM', seen, id)
        status = 3
      else
        redis.call('HINCRBY', slice, member, ARGV[b + 6])
        if not registered[n] then
          redis.call('ZADD', slices, n, ARGV[b + 1])
          registered[n] = true
        end
        if not in_slice then s.refs = s.refs + 1 end
        s.total = new_total
        if not s.z or (tie ~= 'n' and tonumber(ARGV[b + 3]) > time_of(s.z)) then s.z = ARGV[b + 5] end
        changed = true
      end
    end
  end
  out[i + 1] = status
end

for _, member in ipairs(touched) do
  local s = state[member]
  if s.z then
    if s.z ~= s.z0 then redis.call('HSET', members, member, s.z) end
    if incremental then
      if s.z0 and s.z ~= s.z0 then redis.call('ZREM', result, s.z0) end
      if s.z ~= s.z0 or s.total ~= s.total0 then redis.call('ZADD', result, s.total, s.z) end
    elseif s.total ~= s.total0 then
      redis.call('HSET', totals, member, s.total)
    end
    if s.refs > 0 then redis.call('HINCRBY', refs, member, s.refs) end
  end
end
if changed then redis.call('HINCRBY', meta, 'gen', 1) end
return out
