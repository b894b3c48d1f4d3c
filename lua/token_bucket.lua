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
--
-- Holds (a request that may be undone, see decide.lua): its tokens are taken as any request's, and recorded
-- as a hold {h<id> = "tokens expiry"} so that an undo can give back what they would be now had they never
-- been taken. That is not simply the tokens: had the bucket refilled to the brim in between, they would
-- have been capped away (a bucket of 10: a hold takes 5, it refills to 10, another request takes 3; without
-- the hold it would hold 7, not 10). So the key also keeps G, the room the outstanding holds may give back,
-- in field 'h' = "G tokens, G ticks, H, next id, lowest outstanding id, its expiry, latest expiry, check":
-- G grows by a hold's tokens, and shrinks to the room left under the brim whenever the bucket's level
-- rises (refill, hits given back): G = min(G, burst - level), what the bucket without the holds would have
-- on top of this one (exactly with one hold; never more with several). H is the holds' tokens. An undo gives
-- back G - (H - its tokens) when that is positive: all of G when it is the only hold, exact; with several,
-- the others' share comes first, so it never gives back more than the bucket without it would hold, and may
-- give back less. A hold not undone by its expiry (the request was admitted, or the undo failed) is
-- confirmed: its tokens stay taken and G drops by them. The check is the level as this version last wrote
-- it: a key written since by an earlier version (which knows no holds) has its holds dropped, as confirmed.

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

-- The room under the brim, burst - (n + f / W), in whole tokens and ticks.
local function room(st)
  if st.f == 0 then return st.burst - st.n, 0 end
  return st.burst - st.n - 1, st.per_token - st.f
end

-- After the level rose: the holds can give back no more than the room left (see Holds above).
local function clip_holds(st)
  if st.held == 0 then return end
  local rn, rf = room(st)
  if rn < st.gn or (rn == st.gn and rf < st.gf) then st.gn, st.gf = rn, rf end
end

-- The holds' meta field, ending with the check of the level as written now (`check`).
local function hold_meta(st, check)
  return table.concat({fmt(st.gn), fmt(st.gf), fmt(st.held), fmt(st.next), fmt(st.lowest), fmt(st.lowest_exp),
                       fmt(st.latest_exp), check}, ' ')
end

-- Confirm the holds past their expiry, oldest first: their tokens stay taken, G no longer counts them.
local function confirm_expired(st, now)
  local changed = false
  while st.held > 0 and st.lowest < st.next and st.lowest_exp <= now do
    local record = redis.call('HGET', st.key, 'h' .. fmt(st.lowest))
    if record then
      local tokens, exp = string.match(record, '^(%d+) (%d+)$')
      tokens, exp = tonumber(tokens), tonumber(exp)
      if exp > now then
        st.lowest_exp = exp
        break
      end
      st.held = st.held - tokens
      if st.gn > tokens or (st.gn == tokens and st.gf > 0) then st.gn = st.gn - tokens else st.gn, st.gf = 0, 0 end
      redis.call('HDEL', st.key, 'h' .. fmt(st.lowest))
      changed = true
    end
    st.lowest = st.lowest + 1
    st.lowest_exp = -1  -- the next record's expiry is read on the next turn
  end
  if st.held == 0 then st.gn, st.gf = 0, 0 end
  -- the records are gone: the meta must say so even if this request writes nothing else
  if changed and st.held == 0 then
    redis.call('HDEL', st.key, 'h')
  elseif changed then
    redis.call('HSET', st.key, 'h', hold_meta(st, st.check))
  end
end

algorithms.token_bucket = {
  load = function(key, burst, per_token, per_us, now)
    local st = {key = key, burst = burst, per_token = per_token, per_us = per_us, n = burst, f = 0, updated = now,
                taken = 0, held = 0, gn = 0, gf = 0, next = 1, lowest = 1, lowest_exp = 0, latest_exp = 0}
    local stored = redis.call('HMGET', key, 't', 'n', 'f', 'u', 'p', 'h')
    if not stored[1] and not stored[2] then return st end
    st.stored = stored[1] and 't' or 'n'
    st.check = stored[1] or (stored[2] .. ':' .. stored[3])
    local was = tonumber(stored[5]) or per_token  -- a key from before the tick size was stored: today's
    if stored[1] then
      local t = tonumber(stored[1])
      st.n = math.floor(t / was)
      st.f = t - st.n * was
    else
      st.n, st.f = tonumber(stored[2]), tonumber(stored[3])
    end
    if stored[6] then
      st.meta = true
      local m = {}
      for word in string.gmatch(stored[6], '%S+') do m[#m + 1] = word end
      if m[8] == st.check then
        st.gn, st.gf, st.held = tonumber(m[1]), tonumber(m[2]), tonumber(m[3])
        st.next, st.lowest = tonumber(m[4]), tonumber(m[5])
        st.lowest_exp, st.latest_exp = tonumber(m[6]), tonumber(m[7])
      else
        -- an earlier version wrote the level since: it knew no holds, so they count as confirmed
        local fields = redis.call('HKEYS', key)
        for _, field in ipairs(fields) do
          if string.match(field, '^h') then redis.call('HDEL', key, field) end
        end
        st.meta = nil
      end
    end
    if was ~= per_token then  -- fractions of a token in ticks of the new size, rounded down
      st.f = muldiv(st.f, per_token, was)
      st.gf = muldiv(st.gf, per_token, was)
    end
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
    if st.held > 0 then
      clip_holds(st)
      confirm_expired(st, now)
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
      clip_holds(st)
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
    st.taken = st.taken + hits
    return 0, rem_before, reset_before, st.n, until_full(st), 0
  end,

  save = function(st, now, hold)
    if hold and st.taken > 0 then  -- a request that may be undone: its tokens are a hold
      local exp = now + hold
      if st.held == 0 then st.lowest, st.lowest_exp = st.next, exp end
      st.hold_id, st.hold_exp = st.next, exp
      redis.call('HSET', st.key, 'h' .. fmt(st.next), fmt(st.taken) .. ' ' .. fmt(exp))
      st.next = st.next + 1
      st.held = st.held + st.taken
      st.gn = st.gn + st.taken
      st.latest_exp = math.max(st.latest_exp, exp)
    end
    if st.n >= st.burst and st.held == 0 then
      redis.call('DEL', st.key)
      return
    end
    local check
    if st.burst * st.per_token + st.per_us < TWO_53 then
      if st.stored == 'n' then redis.call('HDEL', st.key, 'n', 'f') end
      check = fmt(st.n * st.per_token + st.f)
      redis.call('HSET', st.key, 't', check, 'u', fmt(st.updated), 'p', fmt(st.per_token))
    else
      if st.stored == 't' then redis.call('HDEL', st.key, 't') end
      check = fmt(st.n) .. ':' .. fmt(st.f)
      redis.call('HSET', st.key, 'n', fmt(st.n), 'f', fmt(st.f), 'u', fmt(st.updated), 'p', fmt(st.per_token))
    end
    local ttl = lifetime(st)
    if st.held > 0 then
      redis.call('HSET', st.key, 'h', hold_meta(st, check))
      -- a hold's id must not be given to another while its undo may come
      ttl = math.max(ttl, st.latest_exp - now)
    elseif st.meta then
      redis.call('HDEL', st.key, 'h')
    end
    pexpire_us(st.key, ttl)
  end,

  receipt = function(st)
    if st.hold_id then return st.hold_id, st.hold_exp end
  end,

  undo = function(key, burst, per_token, per_us, id, exp, now)
    if now >= exp then return 0 end  -- confirmed at its expiry
    local st = algorithms.token_bucket.load(key, burst, per_token, per_us, now)
    if st.held == 0 then return 0 end
    local record = redis.call('HGET', key, 'h' .. fmt(id))
    if not record then return 0 end
    local taken, until_us = string.match(record, '^(%d+) (%d+)$')
    -- ids start again once no hold is out: a record of another expiry is another request's hold
    if tonumber(until_us) ~= exp then return 0 end
    local tokens = tonumber(taken)
    local others = st.held - tokens
    -- G beyond the other holds' tokens comes back (G <= H, so at most this hold's tokens)
    if st.gn > others or (st.gn == others and st.gf > 0) then
      local give_n, give_f = st.gn - others, st.gf
      st.n = st.n + give_n
      if give_f >= st.per_token - st.f then st.f = give_f - (st.per_token - st.f); st.n = st.n + 1
      else st.f = st.f + give_f end
      st.gn, st.gf = others, 0
    end
    st.held = others
    redis.call('HDEL', key, 'h' .. fmt(id))
    algorithms.token_bucket.save(st, now)
    return 1
  end,
}
