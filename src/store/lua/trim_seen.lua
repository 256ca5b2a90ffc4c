-- trim_seen.lua: forget one chunk of idempotency keys whose time has passed.
--
-- KEYS[1] seen      ZSet  legacy raw ids -> epoch ms from which each may be forgotten
-- KEYS[2] seen:ids  Hash  the digest table (layout in apply.lua)
-- KEYS[3] seen:<n>  List  the forget log of slice n (4-byte bucket hashes), if any
--
-- ARGV[1] now (epoch ms)   ARGV[2] most legacy ids to forget in this call
-- ARGV[3] n, the slice whose ids may be forgotten ('' for none)
-- ARGV[4] most forget-log entries to take in this call
--
-- Takes the first ARGV[4] entries of the log, removes every entry of slice n from the
-- buckets they address (a bucket holding several of them is rewritten once), and drops
-- the entries taken; the legacy ZSet (the layout before digests) is drained in bounded
-- chunks until it is gone. Everything is read and checked before the first write, so a
-- call that fails has written nothing, and a repeated call finds nothing more to remove.
-- Returns { legacy ids forgotten, log entries taken, digests forgotten }.
local DIGEST, ENTRY, WRAP = 16, 20, 4294967296
local legacy, table_key, log_key = KEYS[1], KEYS[2], KEYS[3]

-- Phase 1: read and check.
local ids = redis.call('ZRANGEBYSCORE', legacy, '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local taken, changed, removed = {}, {}, 0
local held
if ARGV[3] ~= '' then
  local tag = tonumber(ARGV[3]) % WRAP
  local tag_bytes = string.char(math.floor(tag / 16777216) % 256, math.floor(tag / 65536) % 256,
    math.floor(tag / 256) % 256, tag % 256)
  taken = redis.call('LRANGE', log_key, 0, tonumber(ARGV[4]) - 1)
  if #taken > 0 then
    local state = redis.call('HMGET', table_key, '#L', '#p', '#n')
    local L, p = integer(state[1]), integer(state[2])
    held = integer(state[3])
    if not L or not p or not held or L < 0 or L > 40 or p < 0 or p >= 2 ^ L or held < 0 then
      -- No table (or no state): nothing of the slice is held any more.
      if state[1] or state[2] or state[3] then
        return fail('corrupt: ' .. table_key .. ' state #L/#p/#n')
      end
      held = nil
    else
      local wanted, seen_addr = {}, {}
      for _, h in ipairs(taken) do
        if #h ~= 4 then return fail('corrupt: ' .. log_key .. ' holds a ' .. #h .. '-byte entry') end
        local x = hash32(h, 1)
        local a = x % (2 ^ L)
        if a < p then a = x % (2 ^ (L + 1)) end
        if not seen_addr[a] then
          seen_addr[a] = true
          wanted[#wanted + 1] = string.format('%d', a)
        end
      end
      local values = redis.call('HMGET', table_key, unpack(wanted))
      for i, field in ipairs(wanted) do
        local v = values[i] or ''
        if #v % ENTRY ~= 0 then
          return fail('corrupt: ' .. table_key .. ' bucket ' .. field .. ' is ' .. #v .. ' bytes')
        end
        -- The slice's entries are found by a plain search for their tag (a hit inside
        -- a digest is skipped: it is not where a tag sits), and the spans between them
        -- kept as they are.
        local keep, dropped, from, hit = {}, 0, 1, string.find(v, tag_bytes, 1, true)
        while hit do
          local start = hit - DIGEST
          if start % ENTRY == 1 then
            if start > from then keep[#keep + 1] = string.sub(v, from, start - 1) end
            from = start + ENTRY
            dropped = dropped + 1
            hit = string.find(v, tag_bytes, from + DIGEST, true)
          else
            hit = string.find(v, tag_bytes, hit + 1, true)
          end
        end
        if dropped > 0 then
          if from <= #v then keep[#keep + 1] = string.sub(v, from) end
          changed[#changed + 1] = { field, table.concat(keep) }
          removed = removed + dropped
        end
      end
    end
  end
end

-- Phase 2: write.
if #changed > 0 then
  local set, gone = { '#n', string.format('%d', math.max(held - removed, 0)) }, {}
  for _, c in ipairs(changed) do
    if c[2] == '' then
      gone[#gone + 1] = c[1]
    else
      set[#set + 1] = c[1]
      set[#set + 1] = c[2]
    end
  end
  redis.call('HSET', table_key, unpack(set))
  if #gone > 0 then redis.call('HDEL', table_key, unpack(gone)) end
end
if #taken > 0 then redis.call('LTRIM', log_key, #taken, -1) end
if #ids > 0 then redis.call('ZREM', legacy, unpack(ids)) end
return { #ids, #taken, removed }
