-- sliding_window_log.lua: an exact sliding-window log (part of the script built from decide.lua).
--
-- Parameters: p1 = limit (hits per window), p2 = window (microseconds), p3 unused.
-- Key: a sorted set. Each admitted request is one member, scored by its time in microseconds and named by
--   the running count of hits recorded in the key after it (C); a request's hits are C minus the C of the
--   member before it. Scores are distinct, and never used twice while the key lives: a request in the same
--   microsecond as the newest one (or while the clock is behind it) is recorded 1 µs after it, so two hits at
--   one instant are two members, and after the newest hits were given back or undone, 1 µs after the newest
--   of those. Bookkeeping members have negative scores (hits have positive ones, so pruning never touches
--   them): "#" is scored -C of the newest request, "^" -C of the newest request that has left the window,
--   "@" (once hits were given back or undone) minus the time of the newest of them. Hits counted =
--   C(#) - C(^). A key with no hits left is deleted, unless "@" is not past yet.
-- A hit recorded at t counts while now - t < window. Memory: one member per admitted request in the
--   window (at most `limit`) plus two. Every step is O(log n): pruning is one ZREMRANGEBYSCORE, and the
--   time until enough hits have left is a binary search on C (C grows with time while Redis TIME does).
-- Negative hits give back the newest hits first.
-- Receipt (a request that may be undone): the time of its member, which names it alone (times are never used
-- twice, and a key is deleted only once every time it used is past). Undo removes exactly that member (not
-- the newest: a member recorded after it expires later) and counts the later members' C down by its hits; a
-- member that has left the window has nothing left to undo.


-- The bookkeeping members and the oldest hit: the bookkeeping members sort first ("#", "^" and "@" have
-- negative scores), then the hits by time. Returns last (C of "#"), base (C of "^"), oldest (or nil), whether
-- the key exists, and removed (the time of "@", or nil).
local function log_head(key)
  local head = redis.call('ZRANGE', key, 0, 3, 'WITHSCORES')
  local last, base, oldest, removed = 0, 0, nil, nil
  for j = 1, #head, 2 do
    local member, score = head[j], tonumber(head[j + 1])
    if member == '#' then last = -score
    elseif member == '^' then base = -score
    elseif member == '@' then removed = -score
    elseif score > 0 then oldest = score; break end
  end
  return last, base, oldest, #head > 0, removed
end

-- Remember that hits up to time `t` were removed (given back or undone): no later hit is recorded at a time
-- already used. Returns the time remembered.
local function log_removed(st, t)
  if st.removed == nil or t > st.removed then
    redis.call('ZADD', st.key, '-' .. fmt(t), '@')
    st.removed = t
  end
  return st.removed
end

local function log_load(key, limit, window, _, now)
  local cutoff = now - window
  local last, base, oldest, exists, removed = log_head(key)
  if oldest and oldest <= cutoff then
    -- hits have left the window: drop them, remembering the running count of the newest one gone
    local newest_gone = redis.call('ZREVRANGEBYSCORE', key, fmt(cutoff), '(0', 'LIMIT', 0, 1)
    redis.call('ZREMRANGEBYSCORE', key, '(0', fmt(cutoff))
    redis.call('ZADD', key, '-' .. newest_gone[1], '^')
    last, base, oldest, exists, removed = log_head(key)
  end
  if exists and last - base <= 0 and not (removed and removed >= now) then
    redis.call('DEL', key)
    last, base, oldest, removed = 0, 0, nil, nil
  end
  local newest = nil
  if oldest then
    local tail = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    newest = tonumber(tail[2])
  end
  -- hits are recorded after the newest one (1 µs later if the clock has not moved on or went back) and after
  -- any removed one, so scores are distinct and C grows with them (Redis would order equal scores by name, as
  -- text), and a receipt's time names one member only
  local at = now
  if newest then at = math.max(at, newest + 1) end
  if removed then at = math.max(at, removed + 1) end
  return {
    key = key, limit = limit, window = window, last = last, base = base, pend = 0, give = 0,
    oldest = oldest, newest = newest, removed = removed, at = at,
  }
end

-- Time (microseconds from now) when the stored hits up to running count `c` have all left the window,
-- or nil when the stored hits do not reach `c`.
local function log_time_of_count(st, c, now)
  if c > st.last - st.give then return nil end
  local first = redis.call('ZCOUNT', st.key, '-inf', '0')  -- the bookkeeping members come first
  local lo, hi = first, redis.call('ZCARD', st.key) - 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if tonumber(redis.call('ZRANGE', st.key, mid, mid)[1]) >= c then hi = mid else lo = mid + 1 end
  end
  local found = redis.call('ZRANGE', st.key, lo, lo, 'WITHSCORES')
  return tonumber(found[2]) + st.window - now
end

algorithms.sliding_window_log = {
  load = log_load,

  evaluate = function(st, hits, now)
    local function counted() return st.last - st.base - st.give + st.pend end
    local function reset()
      if st.oldest and st.give < st.last - st.base then return st.oldest + st.window - now end
      if st.pend > 0 then return st.at + st.window - now end
      return 0
    end
    local rem_before, reset_before = math.max(0, st.limit - counted()), reset()
    if hits < 0 then
      local take = math.min(-hits, st.pend)
      st.pend = st.pend - take
      st.give = math.min(st.last - st.base, st.give - hits - take)
      return 0, rem_before, reset_before, math.max(0, st.limit - counted()), reset(), 0
    end
    if counted() + hits > st.limit then
      local over_reset = st.window
      if hits <= st.limit then
        -- the request fits once this many of the counted hits have left, oldest first
        over_reset = log_time_of_count(st, st.base + counted() + hits - st.limit, now)
          or (st.at + st.window - now)
      end
      return 1, rem_before, reset_before, 0, 0, over_reset
    end
    st.pend = st.pend + hits
    return 0, rem_before, reset_before, math.max(0, st.limit - counted()), reset(), 0
  end,

  -- A request that writes nothing (rejected, or check-only) still renews the key's expiry from its newest
  -- hit: a reload that made the window longer would otherwise let the key vanish with the old window's time
  -- while its hits still count.
  keep = function(st, now)
    if st.newest then extend_us(st.key, st.newest + st.window - now) end
  end,

  save = function(st, now)
    local key = st.key
    local last = st.last
    local give = st.give
    while give > 0 do
      -- the newest request gives back first; one heavier than what is left keeps the difference
      local two = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(0', 'LIMIT', 0, 2)
      if #two == 0 then break end
      local before = tonumber(two[2]) or st.base
      local weight = last - before
      local score = redis.call('ZSCORE', key, two[1])
      redis.call('ZREM', key, two[1])
      if weight > give then
        last = last - give
        redis.call('ZADD', key, score, fmt(last))
        give = 0
      else
        last = before
        give = give - weight
        log_removed(st, tonumber(score))
      end
    end
    if st.pend == 0 and last == st.last then  -- nothing to write
      algorithms.sliding_window_log.keep(st, now)
      return
    end
    if last + st.pend - st.base <= 0 then
      if st.removed and st.removed >= now then
        redis.call('ZADD', key, '-' .. fmt(last), '#')  -- no hits left, but "@" is not past yet
      else
        redis.call('DEL', key)
      end
      return
    end
    if st.pend > 0 then
      last = last + st.pend
      redis.call('ZADD', key, fmt(st.at), fmt(last), '-' .. fmt(last), '#')
      pexpire_us(key, st.at + st.window - now)
    elseif last ~= st.last then
      redis.call('ZADD', key, '-' .. fmt(last), '#')
      algorithms.sliding_window_log.keep(st, now)  -- only given back: the hits left still need their time
    end
    if last ~= st.last and last > 1125899906842624 then  -- 2^50: count from 0 again before C loses precision
      local members = redis.call('ZRANGEBYSCORE', key, '(0', '+inf', 'WITHSCORES')
      for j = 1, #members, 2 do
        redis.call('ZREM', key, members[j])
        redis.call('ZADD', key, members[j + 1], fmt(tonumber(members[j]) - st.base))
      end
      redis.call('ZADD', key, '-' .. fmt(last - st.base), '#')
      redis.call('ZADD', key, '0', '^')
    end
  end,

  receipt = function(st)
    if st.pend > 0 then return st.at, 0 end
  end,

  undo = function(key, limit, window, p3, at, _, now)
    local st = log_load(key, limit, window, p3, now)
    local found = redis.call('ZRANGEBYSCORE', key, fmt(at), fmt(at))
    if #found == 0 then return 0 end  -- it has left the window
    local prior = redis.call('ZREVRANGEBYSCORE', key, '(' .. fmt(at), '(0', 'LIMIT', 0, 1)
    local weight = tonumber(found[1]) - (tonumber(prior[1]) or st.base)
    redis.call('ZREM', key, found[1])
    -- the members recorded after it count its hits no more
    local later = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(at), '+inf', 'WITHSCORES')
    for j = 1, #later, 2 do
      redis.call('ZREM', key, later[j])
      redis.call('ZADD', key, later[j + 1], fmt(tonumber(later[j]) - weight))
    end
    local last = st.last - weight
    redis.call('ZADD', key, '-' .. fmt(last), '#')
    if log_removed(st, at) < now and last - st.base <= 0 then redis.call('DEL', key) end
    return 1
  end,
}
