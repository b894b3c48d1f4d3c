-- fixed_window.lua: envoyproxy/ratelimit's fixed window (part of the script built from decide.lua).
--
-- Parameters: p1 = limit (hits per window), p2 = window W (microseconds), p3 = 1 to stop counting hits of
--   requests that are over limit (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true), else 0.
-- Key: a hash {w = index of the window (floor(t / W), epoch-aligned), c = hits counted in it, W = the window
--   length it was counted in: a reload that changes the unit makes the index mean another time, so a count
--   of another length is not carried over (as envoyproxy/ratelimit, whose keys name the window's start)}.
-- As in envoyproxy/ratelimit, hits are counted even when the request is over limit (on this or on any
-- other descriptor) unless p3 = 1; over limit when the count after adding hits exceeds the limit.
-- Reset: the end of the window, over limit or not.
-- Negative hits are taken back (not below 0).
-- Receipt (a request that may be undone): the window index its hits went to and their number, unless denied
-- hits count (then a rejected request keeps them, as on one Redis: nothing to undo). Undo takes them back
-- from that window if it is still the current one; a window gone has nothing left to undo.

algorithms.fixed_window = {
  load = function(key, limit, window, stop_when_over, now)
    local idx = math.floor(now / window)
    local stored = redis.call('HMGET', key, 'w', 'c', 'W')
    local count = 0
    local w = tonumber(stored[1])
    -- counted in windows of another length (a reload; a key from before 'W' was stored shows as an index
    -- more than one window ahead): not carried over
    if (stored[3] and tonumber(stored[3]) ~= window) or (w and w > idx + 1) then w = nil end
    if w and w > idx then idx = w end  -- the clock went back: keep counting in the newest window seen
    if w == idx then count = tonumber(stored[2]) or 0 end
    return {
      key = key, limit = limit, window = window, idx = idx, count = count, changed = false, added = 0,
      counts_denied = stop_when_over ~= 1,
    }
  end,

  evaluate = function(st, hits, now)
    local reset = (st.idx + 1) * st.window - now
    local rem_before = math.max(0, st.limit - st.count)
    if hits < 0 then
      st.count = math.max(0, st.count + hits)
      st.changed = true
      return 0, rem_before, reset, math.max(0, st.limit - st.count), reset, 0
    end
    local over = st.count + hits > st.limit
    if hits > 0 and (not over or st.counts_denied) then
      st.count = math.min(st.count + hits, 4503599627370496)  -- 2^52: stays exact; far over any limit
      st.changed = true
      st.added = st.added + hits
    end
    if over then return 1, rem_before, reset, 0, 0, reset end
    return 0, rem_before, reset, math.max(0, st.limit - st.count), reset, 0
  end,

  save = function(st, now)
    if not st.changed then return end
    redis.call('HSET', st.key, 'w', fmt(st.idx), 'c', fmt(st.count), 'W', fmt(st.window))
    pexpire_us(st.key, (st.idx + 1) * st.window - now)
  end,

  receipt = function(st)
    if st.added > 0 and not st.counts_denied then return st.idx, st.added end
  end,

  undo = function(key, limit, window, stop_when_over, idx, hits, now)
    local st = algorithms.fixed_window.load(key, limit, window, stop_when_over, now)
    if st.idx ~= idx or st.count == 0 then return 0 end
    st.count = math.max(0, st.count - hits)
    st.changed = true
    algorithms.fixed_window.save(st, now)
    return 1
  end,
}
