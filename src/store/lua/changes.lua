-- changes.lua: the change feed of a board with `changes_top = N`. A script that changes
-- an instance's ranking reads, before it writes, the top the feed last recorded (the
-- instance's `meta` field `feed`), and after its last write the top N of the ranking, and
-- records the difference in the instance's change stream and in `feed`, in that same call:
-- a call that fails, or judges every event a duplicate, or refuses a stale swap, records
-- nothing. Comparing with the top last recorded, not the one read before the call, keeps
-- the stream whole whatever changed the ranking unrecorded (the feed turned on over a
-- ranking, turned off and on again, its N changed, a version without the feed during an
-- upgrade): the next call that records anything records every difference.
-- Used by: fold.lua, expire.lua, swap.lua.
--
-- One entry per change, with the fields kind (`entered`, `left` or `passed`), member,
-- rank (its new rank; for `left` its last one), total (exact, in minor units), cause (`tip`
-- from an apply, `roll` from an expiry or a swap), ts (the call's `now`, epoch ms) and, on
-- `passed`, `passed`: the member it passed. A call writes every `left` first, then the
-- `entered` and `passed` entries in the order of their new ranks (a member that passed
-- several has one entry per member passed, in their old order). Replayed in that order
-- over the previous top N (remove a member that left, insert one that entered at its rank,
-- move one that passed to its rank), they give the new top N exactly.

-- The feed of a call (nil for a board without one): the stream `key`, the instance's
-- `meta`, the size of the top `top` (a number), the stream's cap `max_len` and the board's
-- `tie`-break.
local function feed_of(key, meta, top, max_len, tie)
  if not key or top == 0 then return nil end
  return { key = key, meta = meta, top = top, max_len = max_len, tie = tie }
end

-- The top `feed` last recorded, read before a call's first write (which also proves that
-- the stream is one): two lists, member names and totals (strings), best first. `feed`
-- holds one line per member, `<member>\t<total>` (member names hold no control
-- character); a value that is not in that form is taken for an empty top, whose next
-- entries name every member of the top again.
local function recorded_top(feed)
  redis.call('XLEN', feed.key)
  local names, totals = {}, {}
  local v = redis.call('HGET', feed.meta, 'feed')
  if not v then return names, totals end
  for m, t in string.gmatch(v, '([^\t\n]+)\t(%-?%d+)\n') do
    names[#names + 1], totals[#totals + 1] = m, t
  end
  return names, totals
end

-- Records in `feed` the changes from the top recorded before the call (`old` names and
-- `old_totals`, as `recorded_top` read them) to the top N of `result` now, at `now` (nil:
-- Redis's clock), for `cause`, and records the new top when its members or their totals
-- changed. Returns the entries written.
local function record_changes(feed, old, old_totals, result, cause, now)
  local after = redis.call('ZREVRANGEBYSCORE', result, '+inf', '(0', 'WITHSCORES', 'limit', 0,
    feed.top)
  local format, tie = string.format, feed.tie
  local new, new_totals = {}, {}
  for i = 1, #after, 2 do
    new[#new + 1] = tie == 'n' and after[i] or string.sub(after[i], 18)
    new_totals[#new_totals + 1] = format('%d', tonumber(after[i + 1]))
  end
  local same, same_totals = #old == #new, true
  for r = 1, #new do
    if new[r] ~= old[r] then same = false end
    if new_totals[r] ~= old_totals[r] then same_totals = false end
  end
  if same and same_totals then return 0 end
  if #new == 0 then
    redis.call('HDEL', feed.meta, 'feed')
  else
    local lines = {}
    for r = 1, #new do lines[r] = new[r] .. '\t' .. new_totals[r] .. '\n' end
    redis.call('HSET', feed.meta, 'feed', table.concat(lines))
  end
  if same then return 0 end
  local was, is = {}, {}
  for r, m in ipairs(old) do was[m] = r end
  for r, m in ipairs(new) do is[m] = r end
  if not now then
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  local ts, written = format('%d', now), 0
  local function add(kind, m, rank, total, passed)
    if passed then
      redis.call('XADD', feed.key, 'MAXLEN', feed.max_len, '*', 'kind', kind, 'member', m,
        'rank', rank, 'total', total, 'passed', passed, 'cause', cause, 'ts', ts)
    else
      redis.call('XADD', feed.key, 'MAXLEN', feed.max_len, '*', 'kind', kind, 'member', m,
        'rank', rank, 'total', total, 'cause', cause, 'ts', ts)
    end
    written = written + 1
  end
  for r, m in ipairs(old) do
    if not is[m] then add('left', m, format('%d', r), old_totals[r]) end
  end
  for r, m in ipairs(new) do
    local rank, o = format('%d', r), was[m]
    if not o then
      add('entered', m, rank, new_totals[r])
    else
      for q = 1, o - 1 do
        local x = old[q]
        if is[x] and is[x] > r then add('passed', m, rank, new_totals[r], x) end
      end
    end
  end
  -- A stream whose instance emptied expires (cleanup.lua); written again, it stays.
  redis.call('PERSIST', feed.key)
  return written
end
