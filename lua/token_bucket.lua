-- token_bucket.lua: a token bucket with lazy refill and exact integer arithmetic (part of the script built
-- from decide.lua).
--
-- A bucket holds up to `burst` tokens and refills requests_per_unit tokens per window. slidegate counts in
-- ticks so that refill is exact: with g = gcd(requests_per_unit, window_us), one token is W = window_us / g
-- ticks and one microsecond refills R = requests_per_unit / g ticks; the capacity is burst * W ticks
-- (kept below 2^53 by config validation, so every sum here is an exact integer in a Lua double).
-- Parameters: p1 = capacity in ticks (burst * W), p2 = W (ticks per token), p3 = R (ticks per microsecond;
--   0 when requests_per_unit is 0: the bucket never refills).
-- Key: a hash {t = ticks in the bucket, u = microsecond of the last update, p = ticks per token then}; no
--   key means a full bucket. A reload that changes the rate or the window changes a tick's size: the tokens
--   carry over (rounded down), not the number of ticks.
-- Over limit when the bucket holds fewer than hits * W ticks. remaining = whole tokens left.
-- Reset within limit: time until the bucket is full again; over limit: time until hits tokens are there.
-- Hits that never fit (more than burst) are told the time the bucket takes to fill from empty (one window
-- with the default burst), a bucket that never refills (requests_per_unit 0) the key's lifetime, a year:
-- never 0, which would send a client straight back.
-- Negative hits put tokens back, up to the capacity.

-- ceil(a / b) for whole a, b below 2^53: the double quotient is off by at most one either way
-- a bucket that never refills lives this long (microseconds)
local NEVER_US = 31536000000000

local function ceil_div(a, b)
  local q = math.floor(a / b)
  if q * b < a then q = q + 1 elseif q > 0 and (q - 1) * b >= a then q = q - 1 end
  return q
end

algorithms.token_bucket = {
  load = function(key, capacity, per_token, per_us, now)
    local stored = redis.call('HMGET', key, 't', 'u', 'p')
    local ticks = capacity
    local updated = now
    if stored[1] then
      ticks = tonumber(stored[1])
      local was = tonumber(stored[3])
      if was and was ~= per_token then ticks = math.floor(ticks / was * per_token) end  -- in doubles, as memory.py
      -- time never runs backwards for a bucket: an earlier clock refills nothing and moves nothing back
      updated = math.max(now, tonumber(stored[2]))
      local elapsed = now - tonumber(stored[2])
      if elapsed > 0 and per_us > 0 then
        if elapsed >= ceil_div(capacity - ticks, per_us) then
          ticks = capacity
        else
          ticks = ticks + elapsed * per_us
        end
      end
      ticks = math.min(ticks, capacity)
    end
    return {key = key, capacity = capacity, per_token = per_token, per_us = per_us, ticks = ticks, updated = updated,
            stored = stored[1] ~= false}
  end,

  -- A request that writes nothing (rejected, or check-only) still renews the key's expiry: after a reload to a
  -- slower rate the bucket takes longer to fill, and must not come back full with the old rate's time.
  keep = function(st, _)
    if not st.stored or st.ticks >= st.capacity then return end
    if st.per_us > 0 then
      extend_us(st.key, ceil_div(st.capacity - st.ticks, st.per_us))
    else
      extend_us(st.key, NEVER_US)
    end
  end,

  evaluate = function(st, hits, now)
    local function until_full()
      if st.ticks >= st.capacity then return 0 end
      if st.per_us == 0 then return 0 end
      return ceil_div(st.capacity - st.ticks, st.per_us)
    end
    local rem_before, reset_before = math.floor(st.ticks / st.per_token), until_full()
    if hits < 0 then
      st.ticks = math.min(st.capacity, st.ticks - hits * st.per_token)
      return 0, rem_before, reset_before, math.floor(st.ticks / st.per_token), until_full(), 0
    end
    local need = hits * st.per_token
    if need > st.ticks then
      local over_reset
      if st.per_us == 0 then
        over_reset = NEVER_US
      elseif need > st.capacity then
        over_reset = ceil_div(st.capacity, st.per_us)
      else
        over_reset = ceil_div(need - st.ticks, st.per_us)
      end
      return 1, rem_before, reset_before, 0, 0, over_reset
    end
    st.ticks = st.ticks - need
    return 0, rem_before, reset_before, math.floor(st.ticks / st.per_token), until_full(), 0
  end,

  save = function(st, now)
    if st.ticks >= st.capacity then
      redis.call('DEL', st.key)
      return
    end
    redis.call('HSET', st.key, 't', fmt(st.ticks), 'u', fmt(st.updated), 'p', fmt(st.per_token))
    if st.per_us > 0 then
      pexpire_us(st.key, ceil_div(st.capacity - st.ticks, st.per_us))
    else
      pexpire_us(st.key, NEVER_US)
    end
  end,
}
