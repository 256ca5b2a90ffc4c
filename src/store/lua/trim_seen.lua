-- trim_seen.lua: forget one chunk of idempotency keys whose time has passed.
--
-- KEYS[1] seen      ZSet  legacy raw ids -> epoch ms from which each may be forgotten
-- KEYS[2] seen:ids  Hash  the digest table (layout in digest.lua)
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
local legacy, table_key, log_key = KEYS[1], KEYS[2], KEYS[3]

-- Phase 1: read and check.
local ids = legacy_due(legacy, ARGV[1], tonumber(ARGV[2]))
local taken, changed, removed = {}, {}, 0
local field = {} -- address -> the Hash field of its bucket (read_buckets)
local held
if ARGV[3] ~= '' then
  local tag = tag_of(tonumber(ARGV[3]))
  taken = redis.call('LRANGE', log_key, 0, tonumber(ARGV[4]) - 1)
  if #taken > 0 then
    local L, p, table_refused, _, bucket0
    -- No table (or no state): nothing of the slice is held any more.
    L, p, held, table_refused, _, bucket0 = table_state(table_key, nil)
    if table_refused then return table_refused end
    if L then
      for _, h in ipairs(taken) do
        if #h ~= 4 then return fail('corrupt: ' .. log_key .. ' holds a ' .. #h .. '-byte entry') end
      end
      local hashes = table.concat(taken)
      local wanted, addr = {}, {}
      locate(hashes, 1, #hashes, 4, L, p, addr, wanted, {})
      local buckets, buckets_refused = read_buckets(table_key, wanted, field, bucket0)
      if not buckets then return buckets_refused end
      for _, a in ipairs(wanted) do
        local v = buckets[a]
        -- The slice's entries are found by a plain search for their tag (a hit inside
        -- a digest is skipped: it is not where a tag sits), and the spans between them
        -- kept as they are.
        local keep, dropped, from, hit = {}, 0, 1, string.find(v, tag, 1, true)
        while hit do
          local start = hit - DIGEST
          if start % ENTRY == 1 then
            if start > from then keep[#keep + 1] = string.sub(v, from, start - 1) end
            from = start + ENTRY
            dropped = dropped + 1
            hit = string.find(v, tag, from + DIGEST, true)
          else
            hit = string.find(v, tag, hit + 1, true)
          end
        end
        if dropped > 0 then
          if from <= #v then keep[#keep + 1] = string.sub(v, from) end
          changed[a] = table.concat(keep)
          removed = removed + dropped
        end
      end
    end
  end
end

-- Phase 2: write.
if removed > 0 then
  write_buckets(table_key, { '#n', string.format('%d', math.max(held - removed, 0)) }, changed, field)
end
if #taken > 0 then redis.call('LTRIM', log_key, #taken, -1) end
legacy_forget(legacy, ids)
return { #ids, #taken, removed }
