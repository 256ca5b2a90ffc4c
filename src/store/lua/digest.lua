-- digest.lua: the digest table, where fold.lua remembers idempotency keys and
-- trim_seen.lua forgets them: its constants (declared here only), its layout, and the reads
-- and writes of it that those scripts share.
-- Used by: fold.lua, trim_seen.lua.
--
-- An event's key is remembered as its digest (16 bytes: a 128-bit hash of the id, computed
-- by the caller) tagged with its slice number mod 2^32 (4 bytes, big-endian), in one Hash
-- per instance (`seen:ids`) organised by linear hashing, so it stays compact at any size
-- and every call's work is bounded: fields `#L` (level), `#p` (split pointer), `#n`
-- (entries held), `#c` ('1' once a write found the instance holding no legacy `seen`
-- ZSet, which no release since writes: fold.lua then looks for one no more), and buckets named by their decimal address whose value is the
-- concatenation of their 20-byte entries. With h the first 4 bytes of a digest as a
-- big-endian number, its bucket is h mod 2^L, or h mod 2^(L+1) when that is below p.
-- After the inserts, while #n > LOAD * (2^L + p), bucket p is split: its entries with
-- h mod 2^(L+1) ~= p move to bucket p + 2^L (entries whose slice may be forgotten are
-- dropped on the way), and p advances, wrapping to 0 with L + 1. An entry counts while
-- its slice is newer than the newest slice whose ids may be forgotten (`through`, mod
-- 2^32): a key is one instance-wide set, so a repeat is a duplicate whatever slice it
-- falls in (the first applied wins). Each remembered entry also appends h to its slice's
-- forget log (`seen:<n>`), from which the roll (trim_seen.lua) removes the slice's entries
-- when they may be forgotten.
local LOAD = 16 -- entries per bucket, on average, before a split
local DIGEST, ENTRY = 16, 20 -- bytes per digest, and per table entry (digest and slice tag)
local WRAP, HALF = 4294967296, 2147483648

-- The 4-byte tag of slice number `n`.
local function tag_of(n)
  local t = n % WRAP
  return string.char(math.floor(t / 16777216) % 256, math.floor(t / 65536) % 256,
    math.floor(t / 256) % 256, t % 256)
end

-- The Hash field of the bucket at address `a`.
local function field_of(a) return string.format('%d', a) end

-- The table's level, split pointer and entries held, each `absent` when the table has no
-- state, then nil, whether `#c` marks the instance free of the legacy ZSet, bucket 0 as
-- stored (nil for none; read in the same HMGET: on a table of level 0 with no split, as
-- every small instance's, it is the only bucket) and whether the table has a state; or,
-- when its state is not three integers in range, three nils and the error.
local function table_state(table_key, absent)
  local state = redis.call('HMGET', table_key, '#L', '#p', '#n', '#c', '0')
  if not (state[1] or state[2] or state[3]) then return absent, absent, absent, nil, false, state[5], false end
  local L, p, held = integer(state[1]), integer(state[2]), integer(state[3])
  if not L or not p or not held or L < 0 or L > 40 or p < 0 or p >= 2 ^ L or held < 0 then
    return nil, nil, nil, fail('corrupt: ' .. table_key .. ' state #L/#p/#n')
  end
  return L, p, held, nil, state[4] == '1', state[5], true
end

-- The buckets of the keys at bytes from, from + step, ... to of `blob` (a digest, or a
-- forget log's entry: its first four bytes are its bucket hash, h), in a table of level
-- `L` and split pointer `p`: the address of the key at byte i in addr[(i - 1) / step + 1],
-- and each address added to `wanted` the first time it is met (`listed`: address -> true).
-- One loop over the batch, no call per key: this runs for every event.
local function locate(blob, from, to, step, L, p, addr, wanted, listed)
  local byte, size, size2 = string.byte, 2 ^ L, 2 ^ (L + 1)
  for i = from, to, step do
    local a, b, c, d = byte(blob, i, i + 3)
    local h = ((a * 256 + b) * 256 + c) * 256 + d
    local x = h % size
    if x < p then x = h % size2 end
    addr[(i - 1) / step + 1] = x
    if not listed[x] then
      listed[x] = true
      wanted[#wanted + 1] = x
    end
  end
end

-- Adds to `wanted` (as locate does) each bucket that inserting entries up to `n` held in
-- all would split, in a table of level `L` and split pointer `p`: read in phase 1, since
-- the splits of phase 2 are a prefix of these.
local function splits_ahead(L, p, n, wanted, listed)
  local sp, size = p, 2 ^ L
  while n > LOAD * (size + sp) do
    if not listed[sp] then
      listed[sp] = true
      wanted[#wanted + 1] = sp
    end
    sp = sp + 1
    if sp == size then sp, size = 0, 2 * size end
  end
end

-- The buckets at the addresses `wanted`, in one HMGET (none when bucket 0, already read
-- by table_state as `bucket0`, is the only one): address -> value ('' for an empty bucket),
-- and the Hash field of each in `field` (address -> field, for the writes); or nil and
-- the error when one is not a whole number of entries.
local function read_buckets(table_key, wanted, field, bucket0)
  local format, fields, at = string.format, {}, {}
  local buckets = {}
  for _, a in ipairs(wanted) do
    local f = format('%d', a) -- field_of(a)
    field[a] = f
    if a == 0 then
      buckets[0] = bucket0 or ''
    else
      fields[#fields + 1] = f
      at[#fields] = a
    end
  end
  if #fields > 0 then
    local values = variadic('HMGET', table_key, fields)
    for i, a in ipairs(at) do buckets[a] = values[i] or '' end
  end
  for _, a in ipairs(wanted) do
    local v = buckets[a]
    if #v % ENTRY ~= 0 then
      return nil, fail('corrupt: ' .. table_key .. ' bucket ' .. field[a] .. ' is ' .. #v .. ' bytes')
    end
  end
  return buckets
end

-- How many of the digests at bytes from, from + DIGEST, ... to of `blob` the buckets hold
-- in an entry of a slice newer than `through` (the digest at byte i is looked for in
-- bucket addr[(i - 1) / DIGEST + 1], as locate numbers them; in bucket 0 for every digest
-- when `addr` is nil, a table of one bucket); each one held is also marked
-- in `found` (by that number) when given. One loop over the batch, as locate.
local function held_of(blob, from, to, addr, buckets, through, found)
  local byte, sub, find = string.byte, string.sub, string.find
  local digest, entry, wrap, half = DIGEST, ENTRY, WRAP, HALF
  local n = 0
  for i = from, to, digest do
    local k = (i - 1) / digest + 1
    local bucket = buckets[addr and addr[k] or 0]
    if #bucket > 0 then
      local d = sub(blob, i, i + digest - 1)
      local j = 1
      while true do
        local at = find(bucket, d, j, true)
        if not at then break end
        if (at - 1) % entry == 0 then
          -- The entry's slice tag, as a number: does the entry still count?
          local a, b, c, e = byte(bucket, at + digest, at + digest + 3)
          local x = ((((a * 256 + b) * 256 + c) * 256 + e) - through) % wrap
          if x > 0 and x < half then
            n = n + 1
            if found then found[k] = true end
            break
          end
        end
        j = at + 1
      end
    end
  end
  return n
end

-- Writes the buckets in `changed` (address -> new value; an emptied bucket is deleted)
-- and, first, the state fields and values in `set`; `field` holds the Hash field of some
-- of the addresses (read_buckets; nil for none).
local function write_buckets(table_key, set, changed, field)
  local gone -- the emptied buckets' fields, made for the first (most calls empty none)
  for a, v in pairs(changed) do
    if v == '' then
      gone = gone or {}
      gone[#gone + 1] = field and field[a] or field_of(a)
    else
      set[#set + 1] = field and field[a] or field_of(a)
      set[#set + 1] = v
    end
  end
  variadic('HSET', table_key, set)
  if gone then variadic('HDEL', table_key, gone) end
end

-- Phase 2 after the inserts: `dirty` holds the new value of each bucket they changed,
-- `buckets` and `field` those read in phase 1 (read_buckets), and `held` the entries now
-- held. Splits buckets while the table is over its load (bounded: at most one per LOAD
-- inserts, and one more; every bucket a split touches was read and checked in phase 1),
-- then writes the changed buckets and the state (with `#c` when `clean`: the caller found
-- no legacy ZSet). `stated`: the table had a state, level L and split pointer p (as
-- table_state read them): then `#L` and `#p` are written only when a split changed them.
local function write_table(table_key, L, p, held, dirty, buckets, field, through, clean, stated)
  local byte, sub, format = string.byte, string.sub, string.format
  local size, L0, p0 = 2 ^ L, L, p
  while held > LOAD * (size + p) do
    local v = dirty[p]
    if v == nil then v = buckets[p] end
    if v == nil then v = redis.call('HGET', table_key, field_of(p)) or '' end
    local stay, move = {}, {}
    for i = 1, #v, ENTRY do
      -- An entry that no longer counts (see held_of) is dropped; the others stay or move
      -- by their bucket hash.
      local a, b, c, e = byte(v, i + DIGEST, i + DIGEST + 3)
      local x = ((((a * 256 + b) * 256 + c) * 256 + e) - through) % WRAP
      if not (x > 0 and x < HALF) then
        held = held - 1
      else
        a, b, c, e = byte(v, i, i + 3)
        if (((a * 256 + b) * 256 + c) * 256 + e) % (2 * size) == p then
          stay[#stay + 1] = sub(v, i, i + ENTRY - 1)
        else
          move[#move + 1] = sub(v, i, i + ENTRY - 1)
        end
      end
    end
    dirty[p] = table.concat(stay)
    dirty[p + size] = table.concat(move)
    p = p + 1
    if p == size then
      L, p, size = L + 1, 0, 2 * size
    end
  end
  local state = { '#n', format('%d', held) }
  if not stated or L ~= L0 then
    state[#state + 1], state[#state + 2] = '#L', format('%d', L)
  end
  if not stated or p ~= p0 then
    state[#state + 1], state[#state + 2] = '#p', format('%d', p)
  end
  if clean then
    state[#state + 1], state[#state + 2] = '#c', '1'
  end
  write_buckets(table_key, state, dirty, field)
end
