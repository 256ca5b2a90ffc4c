-- changes.lua: the change feed of a board with `changes_top = N`. A script that changes
-- an instance's ranking reads its top N before it writes and again after, and records the
-- difference in the instance's change stream in that same call: a call that fails, or
-- judges every event a duplicate, or refuses a stale swap, records nothing.
-- Used by: apply.lua, fold.lua, expire.lua, swap.lua.
--
-- One entry per change, with the fields kind (`entered`, `left` or `passed`), member,
-- rank (its new rank; for `left` its last one), total (exact, in minor units), cause (`tip`
-- from an apply, `roll` from an expiry or a swap), ts (the call's `now`, epoch ms) and, on
-- `passed`, `passed`: the member it passed. A call writes every `left` first, then the
-- `entered` and `passed` entries in the order of their new ranks (a member that passed
-- several has one entry per member passed, in their old order). Replayed in that order
-- over the previous top N (remove a member that left, insert one that entered at its rank,
-- move one that passed to its rank), they give the new top N exactly.

-- The feed of a call (nil for a board without one): the stream `key`, the size of the top
-- `top` (a number), the stream's cap `max_len` and the board's `tie`-break.
local function feed_of(key, top, max_len, tie)
  if not key or top == 0 then return nil end
  return { key = key, top = top, max_len = max_len, tie = tie }
end

-- The top of ranking `result` as `feed` watches it: { zmember, score, ... }, best first,
-- totals above 0 only (the ranked members). Read before a call's first write, it also
-- proves that the stream is one.
local function top_of(feed, result)
  redis.call('XLEN', feed.key)
  return redis.call('ZREVRANGEBYSCORE', result, '+inf', '(0', 'WITHSCORES', 'limit', 0, feed.top)
end

-- The member names of a top read by top_of.
local function names_of(top, tie)
  local names = {}
  for i = 1, #top, 2 do
    names[#names + 1] = tie == 'n' and top[i] or string.sub(top[i], 18)
  end
  return names
end

-- Records in `feed` the changes from top `before` (top_of before the call's writes) to
-- the top now, at `now` (nil: Redis's clock), for `cause`. Returns the entries written.
local function record_changes(feed, before, result, cause, now)
  local after = top_of(feed, result)
  local tie = feed.tie
  local old, new = names_of(before, tie), names_of(after, tie)
  local same = #old == #new
  for r = 1, #new do
    if new[r] ~= old[r] then same = false end
  end
  if same then return 0 end
  local was, is = {}, {}
  for r, m in ipairs(old) do was[m] = r end
  for r, m in ipairs(new) do is[m] = r end
  if not now then
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  local ts, written = string.format('%d', now), 0
  local function add(kind, m, rank, score, passed)
    local total = string.format('%d', tonumber(score))
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
    if not is[m] then add('left', m, string.format('%d', r), before[2 * r]) end
  end
  for r, m in ipairs(new) do
    local rank, o = string.format('%d', r), was[m]
    if not o then
      add('entered', m, rank, after[2 * r])
    else
      for q = 1, o - 1 do
        local x = old[q]
        if is[x] and is[x] > r then add('passed', m, rank, after[2 * r], x) end
      end
    end
  end
  return written
end
