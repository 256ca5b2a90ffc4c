-- legacy_seen.lua: the legacy `seen` ZSet, the idempotency layout before digests (raw id ->
-- epoch ms from which it may be forgotten): never written any more, read while it exists,
-- drained by the roll.
-- Used by: fold.lua, trim_seen.lua.
--
-- The legacy `seen` ZSet (the idempotency layout before digests) is removed in 0.3 or after
-- 2027-03-01, whichever comes first; until then apply calls carry raw ids to an instance
-- that still holds it and the roll drains it. Its removal takes this file, the KEYS slot
-- the scripts keep for it and the raw ids a fold.lua call judging each event may take.

-- Whether the instance still holds the ZSet.
local function legacy_held(seen)
  return redis.call('EXISTS', seen) == 1
end

-- For fold.lua judging each event, the ZSet's entries staying authoritative while it exists: the
-- forget-at time of each of the raw `ids` (false for an id it does not hold; none at all,
-- then nil and true, without the ZSet); or nil and the `legacy-seen` error when it exists
-- and the caller sent no ids (`with_ids` false), so that the caller repeats the call with
-- them.
local function legacy_remembered(seen, with_ids, ids)
  if not legacy_held(seen) then return {}, nil, true end
  if not with_ids then return nil, fail('legacy-seen: ' .. seen .. ' still holds raw ids') end
  return variadic('ZMSCORE', seen, ids)
end

-- For trim_seen.lua: up to `most` raw ids that may be forgotten at `now`.
local function legacy_due(seen, now, most)
  return redis.call('ZRANGEBYSCORE', seen, '-inf', now, 'LIMIT', 0, most)
end

-- For trim_seen.lua, in phase 2: forgets the raw `ids`.
local function legacy_forget(seen, ids)
  if #ids > 0 then redis.call('ZREM', seen, unpack(ids)) end
end
