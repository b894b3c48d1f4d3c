-- sliding_window_counter.lua: two adjacent fixed windows weighted by overlap (Cloudflare's approximation;
-- part of the script built from decide.lua).
--
-- Parameters: p1 = limit (hits per window), p2 = window W (microseconds), p3 unused.
-- Key: a hash {i = index of the current window (floor(t / W)), c = hits in it, p = hits in the window
--   before, W = the window length they were counted in}: both windows live in one key, so in one Redis
--   Cluster slot; O(1) memory. Counts of another length (a reload changed the unit) are not carried over.
-- Estimate at time now, e = now - i*W into the current window:
--   counted = c + p * (W - e) / W   (doubles, computed in this order by every implementation)
-- Over limit when counted + hits > limit. remaining = floor(limit - counted).
-- Reset within limit: the end of the current window (when the older window stops counting);
-- over limit: the first instant at which counted + hits <= limit, found from the linear decay.
-- Negative hits are taken back from the current window, then from the previous one.
-- Receipt (a request that may be undone): the window index its hits went to and their number. Undo takes
-- them back from that window, the current or the previous one; a window gone has nothing left to undo.

algorithms.sliding_window_counter = {
  load = function(key, limit, window, _, now)
    local idx = math.floor(now / window)
    local stored = redis.call('HMGET', key, 'i', 'c', 'p', 'W')
    local cur, prev = 0, 0
    local i = tonumber(stored[1])
    -- counted in windows of another length (a reload; a key from before 'W' was stored shows as an index
    -- more than one window ahead): not carried over
    if (stored[4] and tonumber(stored[4]) ~= window) or (i and i > idx + 1) then i = nil end
    if i and i > idx then idx = i end  -- the clock went back: keep counting in the newest window seen
    if i == idx then
      cur, prev = tonumber(stored[2]) or 0, tonumber(stored[3]) or 0
    elseif i == idx - 1 then
      prev = tonumber(stored[2]) or 0
    end
    return {key = key, limit = limit, window = window, idx = idx, cur = cur, prev = prev, added = 0}
  end,

  evaluate = function(st, hits, now)
    local w = st.window
    local e = math.max(0, now - st.idx * w)
    local function weighted() return st.prev * (w - e) / w end
    local function remaining() return math.max(0, math.floor(st.limit - st.cur - weighted())) end
    local function reset()
      if st.cur > 0 or st.prev > 0 then return w - e end
      return 0
    end
    local rem_before, reset_before = remaining(), reset()
    if hits < 0 then
      local g = -hits
      local take = math.min(g, st.cur)
      st.cur = st.cur - take
      st.prev = math.max(0, st.prev - (g - take))
      return 0, rem_before, reset_before, remaining(), reset(), 0
    end
    local room = st.limit - st.cur - hits
    if room < weighted() then
      local over_reset = w
      if hits <= st.limit then
        if room >= 0 then
          -- this window: p * (W - e') / W <= room
          over_reset = math.max(1, math.ceil(w - room * w / st.prev) - e)
        else
          -- the next window, where this window's hits become the older ones: cur * (W - e') / W <= limit - hits
          over_reset = math.max(1, (w - e) + math.ceil(w - (st.limit - hits) * w / st.cur))
        end
      end
      return 1, rem_before, reset_before, 0, 0, over_reset
    end
    st.cur = st.cur + hits
    st.added = st.added + hits
    return 0, rem_before, reset_before, remaining(), reset(), 0
  end,

  save = function(st, now)
    if st.cur == 0 and st.prev == 0 then
      redis.call('DEL', st.key)
      return
    end
    redis.call('HSET', st.key, 'i', fmt(st.idx), 'c', fmt(st.cur), 'p', fmt(st.prev), 'W', fmt(st.window))
    -- the current window's hits count until the end of the next window
    pexpire_us(st.key, (st.idx + 2) * st.window - now)
  end,

  receipt = function(st)
    if st.added > 0 then return st.idx, st.added end
  end,

  undo = function(key, limit, window, p3, idx, hits, now)
    local st = algorithms.sliding_window_counter.load(key, limit, window, p3, now)
    if idx == st.idx and st.cur > 0 then
      st.cur = math.max(0, st.cur - hits)
    elseif idx == st.idx - 1 and st.prev > 0 then
      st.prev = math.max(0, st.prev - hits)
    else
      return 0
    end
    algorithms.sliding_window_counter.save(st, now)
    return 1
  end,
}
