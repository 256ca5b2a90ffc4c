-- gate.lua: what an instance's `meta` lets through before fold.lua judges
-- any event: the board definition pinned there, the `gen` counter, the time of the last
-- roll and the watermark.
-- Used by: fold.lua.

-- The KEYS the two scripts share (their headers list them): meta, result, members,
-- slices, seen, refs, totals and seen:ids; then the board's flags among the ARGV they
-- share: whether it is incremental, its tie-break, whether it allows negative amounts,
-- and its settings fingerprint.
local function shared_args(KEYS, ARGV)
  return KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
    ARGV[4] == 'i', ARGV[5], ARGV[6] == '1', ARGV[7]
end

-- The keys a window's instance takes after its slice Hashes (and, for the widest, their
-- forget logs), from KEYS[at]: its change stream (changes.lua; none on a board without a
-- feed, whose `top` is 0, and on a resummarize board, whose apply leaves the ranking alone:
-- its caller sends none), then, when `with_dense`, the distinct totals of a dense_rank
-- board. Returns the feed (nil for none) of the instance whose meta is `meta`, a stream
-- capped at `cap` entries, the distinct totals' key (nil for none) and the index of the
-- key after them.
local function tail_keys(KEYS, at, meta, top, cap, tie, with_dense)
  local feed = nil
  if top > 0 then
    feed = feed_of(KEYS[at], meta, top, cap, tie)
    at = at + 1
  end
  if with_dense then return feed, KEYS[at], at + 1 end
  return feed, nil, at
end

-- The instance's `meta` fields the two scripts read, in one HMGET: its reply as it is,
-- each field at the index named here.
local EXPIRED_THROUGH, SETTINGS, GEN, LAST_ROLL, CHAIN = 1, 2, 3, 4, 5
local function read_meta(meta)
  return redis.call('HMGET', meta, 'expired_through', 'settings', 'gen', 'last_roll', 'chain')
end

-- The time the events are judged at, the watermark (the newest slice whose events are
-- late), for a board of `per_window` slices of `width` ms, and the `gen` counter (0 for
-- none: write_meta bumps it), given `stored` (read_meta); or nil, nil, nil and the error
-- when `stored` holds a number that is not one or the settings of another board
-- definition.
local function gate(meta, stored, settings, now, width, per_window)
  -- Time never goes back: a roll at a later time (a forced `roll --at`, or a replica whose
  -- measure of Redis's clock is a little ahead of this caller's) already expired and
  -- forgot what was due then, so the events are judged at that time at least.
  if stored[LAST_ROLL] then
    local rolled = counter(stored[LAST_ROLL])
    if not rolled then return nil, nil, nil, fail('corrupt: ' .. meta .. ' last_roll is not an integer') end
    if rolled > now then now = rolled end
  end
  local gen = 0
  if stored[GEN] then
    gen = counter(stored[GEN])
    if not gen then return nil, nil, nil, fail('corrupt: ' .. meta .. ' gen is not an integer') end
  end
  local refused = settings_refused(stored[SETTINGS], settings)
  if refused then return nil, nil, nil, refused end
  local watermark = math.floor(now / width) - per_window
  if stored[EXPIRED_THROUGH] then
    local w = integer(stored[EXPIRED_THROUGH])
    if not w then return nil, nil, nil, fail('corrupt: ' .. meta .. ' expired_through is not an integer') end
    if w > watermark then watermark = w end
  end
  return now, watermark, gen
end
