-- token_bucket.lua: a token bucket with lazy refill and exact integer arithmetic (part of the script built
-- from decide.lua).
--
-- A bucket holds up to `burst` tokens and refills requests_per_unit tokens per window. It counts whole
-- tokens (at most burst, below 2^32) and the fraction of the next token in ticks: with g =
-- gcd(requests_per_unit, window_us), one token is W = window_us / g ticks and one microsecond refills
-- R = requests_per_unit / g ticks, so refill never loses a fraction (algorithms.token_bucket_ticks). W is
-- below 2^53 as windows are, so tokens and fraction are exact in a Lua double; the products that may not be
-- (elapsed time x R, tokens x W) go through muldiv below, so every limit the config accepts counts exactly.
-- Parameters: p1 = burst (tokens), p2 = W (ticks per token), p3 = R (ticks per microsecond; 0 when
--   requests_per_unit is 0: the bucket never refills).
-- Key: a hash {n = whole tokens, f = ticks of the next token, u = microsecond of the last update, p = W then};
--   a bucket whose capacity in ticks (burst x W, plus R) is below 2^53 — every bucket earlier versions
--   accepted — is stored as they store it instead, {t = n x W + f, u, p}, so that during a rolling upgrade
--   each version reads the other's buckets. No key means a full bucket. A reload that changes the rate or the
--   window changes a tick's size: the whole tokens carry over, the fraction is converted, rounded down.
-- Over limit when the bucket holds fewer than `hits` whole tokens. remaining = whole tokens left.
-- Reset within limit: time until the bucket is full again; over limit: time until hits tokens are there.
-- Hits that never fit (more than burst) are told the time the bucket takes to fill from empty (one window
-- with the default burst), a bucket that never refills (requests_per_unit 0) the key's lifetime, a year:
-- never 0, which would send a client straight back. A wait longer than LONGEST_US (a burst of 2^32 tokens
-- refilled one per year) is told as LONGEST_US, and the key lives that long at most: a bucket nobody touches
-- for 71 years is full again.
-- Negative hits put tokens back, up to the burst.

-- a bucket that never refills lives this long (microseconds)
local NEVER_US = 31536000000000
-- 2^51 µs, about 71 years: the longest wait told and the longest a key lives (every exact double passes it)
local LONGEST_US = 2251799813685248
local TWO_53 = 9007199254740992

-- floor(a * b / c) and a * b mod c, for whole a, b >= 0 and c > 0 below 2^53, exact while the quotient is
-- below 2^53 (the caller checks a double estimate first where it might not be).
local function muldiv(a, b, c)
  local p = a * b
  if p < TWO_53 then
    -- the product is exact, and so is floor(p / c): the division's rounding error is below 1 / c
    local q = math.floor(p / c)
    return q, p - q * c
  end
  -- a x 2^i = qx * c + rx, doubled bit by bit of b; remainders stay below c by modular addition (never
  -- summing past 2^53), quotients stay below the final one
  local qx = math.floor(a / c)
  local rx = a - qx * c
  local q, r = 0, 0
  while true do
    if math.fmod(b, 2) == 1 then
      q = q + qx
      if r >= c - rx then r = r - (c - rx); q = q + 1 else r = r + rx end
      b = b - 1
    end
    b = b / 2
    if b == 0 then return q, r end
    qx = qx * 2
    if rx >= c - rx then rx = rx - (c - rx); qx = qx + 1 else rx = rx + rx end
  end
end

-- Microseconds until the bucket has refilled `k` >= 1 whole tokens less `f` ticks (0 <= f < W):
-- ceil(((k - 1) * W + (W - f)) / R), at most LONGEST_US. R > 0.
local function refill_time(st, k, f)
  local W, R = st.per_token, st.per_us
  if (k - 1) * W / R >= 4503599627370496 then return LONGEST_US end  -- 2^52: surely past LONGEST_US
  local q, r = muldiv(k - 1, W, R)
  local d = W - f
  local dq = math.floor(d / R)
  local rest = r + (d - dq * R)  -- below 2 R: one or two microseconds more at most
  local t = q + dq
  if rest > R then t = t + 2 elseif rest > 0 then t = t + 1 end
  return math.min(t, LONGEST_US)
end

local function until_full(st)
  if st.n >= st.burst or st.per_us == 0 then return 0 end
  return refill_time(st, st.burst - st.n, st.f)
end

-- how long the key must live: until the bucket is full, or a year for one that never refills
local function lifetime(st)
  if st.per_us == 0 then return NEVER_US end
  return until_full(st)
end

algorithms.token_bucket = {
  load = function(key, burst, per_token, per_us, now)
    local st = {key = key, burst = burst, per_token = per_token, per_us = per_us, n = burst, f = 0, updated = now}
    local stored = redis.call('HMGET', key, 't', 'n', 'f', 'u', 'p')
    if not stored[1] and not stored[2] then return st end
    st.stored = stored[1] and 't' or 'n'
    local was = tonumber(stored[5]) or per_token  -- a key from before the tick size was stored: today's
    if stored[1] then
      local t = tonumber(stored[1])
      st.n = math.floor(t / was)
      st.f = t - st.n * was
    else
      st.n, st.f = tonumber(stored[2]), tonumber(stored[3])
    end
    if was ~= per_token then st.f = muldiv(st.f, per_token, was) end  -- f < was: the quotient is below W
    if st.n >= burst then st.n, st.f = burst, 0 end
    -- time never runs backwards for a bucket: an earlier clock refills nothing and moves nothing back
    local before = tonumber(stored[4])
    st.updated = math.max(now, before)
    local elapsed = now - before
    if elapsed > 0 and per_us > 0 and st.n < burst then
      if elapsed * per_us / per_token >= 4503599627370496 then  -- 2^52 tokens: far more than a burst
        st.n, st.f = burst, 0
      else
        local q, r = muldiv(elapsed, per_us, per_token)
        if r >= per_token - st.f then st.f = r - (per_token - st.f); q = q + 1 else st.f = st.f + r end
        if q >= burst - st.n then st.n, st.f = burst, 0 else st.n = st.n + q end
      end
    end
    return st
  end,

  -- A request that writes nothing (rejected, or check-only) still renews the key's expiry: after a reload to a
  -- slower rate the bucket takes longer to fill, and must not come back full with the old rate's time.
  keep = function(st, _)
    if st.stored and st.n < st.burst then extend_us(st.key, lifetime(st)) end
  end,

  evaluate = function(st, hits, now)
    local rem_before, reset_before = st.n, until_full(st)
    if hits < 0 then
      st.n = math.min(st.burst, st.n - hits)
      if st.n >= st.burst then st.f = 0 end
      return 0, rem_before, reset_before, st.n, until_full(st), 0
    end
    if hits > st.n then
      local over_reset
      if st.per_us == 0 then
        over_reset = NEVER_US
      elseif hits > st.burst then
        over_reset = refill_time(st, st.burst, 0)
      else
        over_reset = refill_time(st, hits - st.n, st.f)
      end
      return 1, rem_before, reset_before, 0, 0, over_reset
    end
    st.n = st.n - hits
    return 0, rem_before, reset_before, st.n, until_full(st), 0
  end,

  save = function(st, now)
    if st.n >= st.burst then
      redis.call('DEL', st.key)
      return
    end
    if st.burst * st.per_token + st.per_us < TWO_53 then
      if st.stored == 'n' then redis.call('HDEL', st.key, 'n', 'f') end
      redis.call('HSET', st.key, 't', fmt(st.n * st.per_token + st.f), 'u', fmt(st.updated), 'p', fmt(st.per_token))
    else
      if st.stored == 't' then redis.call('HDEL', st.key, 't') end
      redis.call('HSET', st.key, 'n', fmt(st.n), 'f', fmt(st.f), 'u', fmt(st.updated), 'p', fmt(st.per_token))
    end
    pexpire_us(st.key, lifetime(st))
  end,
}
