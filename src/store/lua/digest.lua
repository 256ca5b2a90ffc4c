-- digest.lua: the digest table, where apply.lua and fold.lua remember idempotency keys and
-- trim_seen.lua forgets them: its constants (declared here only), its layout, and the reads
-- and writes of it that those scripts share.
-- Used by: apply.lua, fold.lua, trim_seen.lua.
--
-- An event's key is remembered as its digest (16 bytes: a 128-bit hash of the id, computed
-- by the caller) tagged with its slice number mod 2^32 (4 bytes, big-endian), in one Hash
-- per instance (`seen:ids`) organised by linear hashing, so it stays compact at any size
-- and every call's work is bounded: fields `#L` (level), `#p` (split pointer), `#n`
-- (entries held), and buckets named by their decimal address whose value is the
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

-- The 32-bit number in the four bytes of `d` from `at` on (a digest's bucket hash, or an
-- entry's slice tag).
local function hash32(d, at)
  local a, b, c, e = string.byte(d, at, at + 3)
  return ((a * 256 + b) * 256 + c) * 256 + e
end

-- The 4-byte tag of slice number `n`.
local function tag_of(n)
  local t = n % WRAP
  return string.char(math.floor(t / 16777216) % 256, math.floor(t / 65536) % 256,
    math.floor(t / 256) % 256, t % 256)
end

-- The Hash field of the bucket at address `a`.
local function field_of(a) return string.format('%d', a) end

-- The bucket of bucket hash `h` in a table of level `L` and split pointer `p`.
local function address(h, L, p)
  local a = h % (2 ^ L)
  if a < p then a = h % (2 ^ (L + 1)) end
  return a
end

-- The table's level, split pointer and entries held, each `absent` when the table has no
-- state; or, when its state is not three integers in range, three nils and the error.
local function table_state(table_key, absent)
  local state = redis.call('HMGET', table_key, '#L', '#p', '#n')
  if not (state[1] or state[2] or state[3]) then return absent, absent, absent end
  local L, p, held = integer(state[1]), integer(state[2]), integer(state[3])
  if not L or not p or not held or L < 0 or L > 40 or p < 0 or p >= 2 ^ L or held < 0 then
    return nil, nil, nil, fail('corrupt: ' .. table_key .. ' state #L/#p/#n')
  end
  return L, p, held
end

-- Calls `want(a)` for each bucket `a` that inserting entries up to `n` held in all would
-- split, in a table of level `L` and split pointer `p`: read in phase 1, since the splits
-- of phase 2 are a prefix of these.
local function splits_ahead(L, p, n, want)
  local sp, size = p, 2 ^ L
  while n > LOAD * (size + sp) do
    want(sp)
    sp = sp + 1
    if sp == size then sp, size = 0, 2 * size end
  end
end

-- A list of bucket addresses, each once, in the order first wanted, and the function that
-- adds one to it.
local function bucket_list()
  local list, listed = {}, {}
  return list, function(a)
    if not listed[a] then
      listed[a] = true
      list[#list + 1] = a
    end
  end
end

-- The buckets at the addresses `wanted`, in one HMGET: address -> value ('' for an empty
-- bucket); or nil and the error when one is not a whole number of entries.
local function read_buckets(table_key, wanted)
  local fields = {}
  for i, a in ipairs(wanted) do fields[i] = field_of(a) end
  local values = variadic('HMGET', table_key, fields)
  local buckets = {}
  for i, a in ipairs(wanted) do
    local v = values[i] or ''
    if #v % ENTRY ~= 0 then
      return nil, fail('corrupt: ' .. table_key .. ' bucket ' .. fields[i] .. ' is ' .. #v .. ' bytes')
    end
    buckets[a] = v
  end
  return buckets
end

-- Whether the entry at byte `at` of `bucket` belongs to a slice newer than `through`.
local function counts(bucket, at, through)
  local d = (hash32(bucket, at + DIGEST) - through) % WRAP
  return d > 0 and d < HALF
end

-- Whether `bucket` holds digest `d` in an entry that still counts.
local function holds(bucket, d, through)
  local i = 1
  while true do
    local at = string.find(bucket, d, i, true)
    if not at then return false end
    if (at - 1) % ENTRY == 0 and counts(bucket, at, through) then return true end
    i = at + 1
  end
end

-- Writes the buckets in `changed` (address -> new value; an emptied bucket is deleted)
-- and, first, the state fields and values in `set`.
local function write_buckets(table_key, set, changed)
  local gone = {}
  for a, v in pairs(changed) do
    if v == '' then
      gone[#gone + 1] = field_of(a)
    else
      set[#set + 1] = field_of(a)
      set[#set + 1] = v
    end
  end
  variadic('HSET', table_key, set)
  variadic('HDEL', table_key, gone)
end

-- Phase 2 after the inserts: `dirty` holds the new value of each bucket they changed,
-- `buckets` those read in phase 1, and `held` the entries now held. Splits buckets while
-- the table is over its load (bounded: at most one per LOAD inserts, and one more; every
-- bucket a split touches was read and checked in phase 1), then writes the changed
-- buckets and the state.
local function write_table(table_key, L, p, held, dirty, buckets, through)
  local function get(a)
    local v = dirty[a]
    if v == nil then v = buckets[a] end
    if v == nil then v = redis.call('HGET', table_key, field_of(a)) or '' end
    return v
  end
  local size = 2 ^ L
  while held > LOAD * (size + p) do
    local v = get(p)
    local stay, move = {}, {}
    for i = 1, #v, ENTRY do
      if not counts(v, i, through) then
        held = held - 1
      elseif hash32(v, i) % (2 * size) == p then
        stay[#stay + 1] = string.sub(v, i, i + ENTRY - 1)
      else
        move[#move + 1] = string.sub(v, i, i + ENTRY - 1)
      end
    end
    dirty[p] = table.concat(stay)
    dirty[p + size] = table.concat(move)
    p = p + 1
    if p == size then
      L, p, size = L + 1, 0, 2 * size
    end
  end
  write_buckets(table_key, { '#L', field_of(L), '#p', field_of(p), '#n', field_of(held) }, dirty)
end
