-- decide.lua: decides the limited descriptors of one or more ShouldRateLimit calls in one script call.
-- slidegate sends this file with the algorithm files (lua/<algorithm>.lua) placed where the marker line
-- below stands; each registers itself in `algorithms`.
--
-- Several requests in one call (slidegate batches the calls that arrive while a script call is in flight) are
-- decided one after another, each exactly as if it had been a script call of its own.
--
-- ARGV[1]   now in microseconds since the epoch, or "" to use Redis TIME (one clock for all replicas).
-- ARGV[2]   R, the number of requests; then for each request: n (its number of limits), then for each of its
--           limits: algorithm name, p1, p2, p3 (the algorithm's parameters, see its file), hits (0 = check
--           only; negative = give |hits| back, Envoy's is_negative_hits), mode ("0": being over rejects the
--           request; "1", shadow: the limit is evaluated but being over does not reject the request; "2", quota
--           (envoyproxy/ratelimit's quota_mode): the request is rejected when every one of its quota limits is
--           over).
--           A request that may be undone (one part of a request that spans Redis Cluster slots, whose other
--           parts are decided by other nodes) gives -n instead of n, followed by the lifetime of its holds in
--           microseconds (see token_bucket.lua); its hits are never negative.
-- KEYS      the storage key of every limit, request after request (one key per limit, whatever the algorithm).
--
-- All-or-nothing per request: a request is admitted only when none of its limits of mode "0" is over, and not
-- every one of its quota limits (if it has any) is over (backends/base.py's admits is the twin); then
-- every one of its limits' state is written, otherwise none is (except an algorithm that counts denied hits,
-- fixed_window by default).
-- Reply: for each request in order: admitted (0|1), then for each of its limits: over (0|1), remaining,
-- reset (microseconds).
--   admitted (or counted anyway): remaining and reset after this request's hits;
--   rejected, limit not over:     remaining and reset as if this request had not come;
--   over limit:                   remaining 0, reset = time until this request's hits would fit.
-- A request that may be undone adds for each limit: remaining and reset as if this request had not come, and
-- a receipt r1, r2 (r1 = -1: nothing to undo) naming exactly what this request wrote, given when it was
-- admitted, once per key.
--
-- ARGV[2] = "undo" undoes admitted requests from their receipts: ARGV[3] = m, then for each of m limits:
-- algorithm name, p1, p2, p3, r1, r2, with its key in KEYS. Each algorithm's undo takes back exactly what the
-- receipt names, as if that request had never come, or a lower bound of it where that is not known (then it
-- never gives back more than the request took: the undo can only err towards counting too much). Reply: for
-- each limit 1 when something was taken back, else 0.
--
-- After the last request (or the last limit to undo), two more arguments may follow: J and a seed. Every
-- expiry this call sets is then up to J milliseconds longer (EXPIRATION_JITTER_MAX_SECONDS), drawn for each
-- key from a generator the seed starts, so that keys written at once (an epoch-aligned fixed window's, above
-- all) do not expire at once. A key living longer changes no answer: each algorithm reads its state by the
-- times stored in it, never by whether the key is still there. Without them (or with J = 0) no jitter.

local algorithms = {}

-- Lua prints large numbers as 1.7e+15; Redis needs every digit.
local function fmt(x)
  return string.format('%.0f', x)
end

local jitter_ms = 0  -- J, set below once the arguments are read

-- Expire `key` after `us` microseconds, in whole milliseconds rounded up (at least 1 ms), plus the jitter.
local function pexpire_us(key, us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  if jitter_ms > 0 then ms = ms + math.random(0, jitter_ms) end
  redis.call('PEXPIRE', key, fmt(ms))
end

-- Make `key` live at least `us` more microseconds (never less: a key may rightly outlive its last hit); when
-- it must be extended, the jitter is added as by pexpire_us.
local function extend_us(key, us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  local ttl = redis.call('PTTL', key)
  if ttl == -1 or (ttl >= 0 and ttl < ms) then
    if jitter_ms > 0 then ms = ms + math.random(0, jitter_ms) end
    redis.call('PEXPIRE', key, fmt(ms))
  end
end

--@@ALGORITHMS@@

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- J and the seed, after the requests' (or the undo's) arguments
local tail
if ARGV[2] == 'undo' then
  tail = 4 + 6 * tonumber(ARGV[3])
else
  tail = 3
  for _ = 1, tonumber(ARGV[2]) do
    local n = tonumber(ARGV[tail])
    if n < 0 then tail = tail + 2 - 6 * n else tail = tail + 1 + 6 * n end
  end
end
if ARGV[tail + 1] then
  jitter_ms = tonumber(ARGV[tail])
  -- the caller's seed: Redis before 7 starts every script call's generator from the same one
  if jitter_ms > 0 then math.randomseed(tonumber(ARGV[tail + 1])) end
end

-- Decide the request whose limits are KEYS[k0 + 1 .. k0 + n] and whose arguments start at ARGV[a0 + 1];
-- append its answer to `reply`. `hold` (microseconds) is set for a request that may be undone.
local function decide(k0, a0, n, hold, reply)
  local states = {}   -- key -> state, so a limit named twice in one request is counted once, with both hits
  local order = {}    -- keys in first-seen order: writes happen in a deterministic order
  local answers = {}
  local admitted = 1
  local quotas, quotas_over = 0, 0
  for i = 1, n do
    local b = a0 + (i - 1) * 6 + 1
    local algorithm = algorithms[ARGV[b]]
    if algorithm == nil then
      return redis.error_reply('unknown algorithm ' .. tostring(ARGV[b]))
    end
    local key = KEYS[k0 + i]
    local st = states[key]
    if st == nil then
      st = algorithm.load(key, tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), now)
      st.algorithm = algorithm
      states[key] = st
      order[#order + 1] = key
    end
    local answer = {algorithm.evaluate(st, tonumber(ARGV[b + 4]), now)}
    answer.state = st
    -- a rejected request reports each limit as it was before this request, even a limit named twice
    if st.before == nil then st.before = {answer[2], answer[3]} end
    answers[i] = answer
    local mode = ARGV[b + 5]
    if mode == '2' then
      quotas = quotas + 1
      if answer[1] == 1 then quotas_over = quotas_over + 1 end
    elseif answer[1] == 1 and mode ~= '1' then
      admitted = 0
    end
  end
  if quotas > 0 and quotas_over == quotas then admitted = 0 end

  for _, key in ipairs(order) do
    local st = states[key]
    if admitted == 1 or st.counts_denied then
      st.algorithm.save(st, now, hold)
    elseif st.algorithm.keep then
      st.algorithm.keep(st, now)
    end
  end

  reply[#reply + 1] = admitted
  local receipted = {}
  for i = 1, n do
    local a = answers[i]
    if a[1] == 1 then
      reply[#reply + 1] = 1
      reply[#reply + 1] = 0
      reply[#reply + 1] = a[6]
    elseif admitted == 1 or a.state.counts_denied then
      reply[#reply + 1] = 0
      reply[#reply + 1] = a[4]
      reply[#reply + 1] = a[5]
    else
      reply[#reply + 1] = 0
      reply[#reply + 1] = a.state.before[1]
      reply[#reply + 1] = a.state.before[2]
    end
    if hold then
      local st = a.state
      reply[#reply + 1] = st.before[1]
      reply[#reply + 1] = st.before[2]
      local r1, r2 = -1, 0
      if admitted == 1 and not receipted[st] then
        receipted[st] = true
        local x, y = st.algorithm.receipt(st)
        if x then r1, r2 = x, y end
      end
      reply[#reply + 1] = r1
      reply[#reply + 1] = r2
    end
  end
end

if ARGV[2] == 'undo' then
  local undone = {}
  for i = 1, tonumber(ARGV[3]) do
    local b = 3 + (i - 1) * 6 + 1
    local algorithm = algorithms[ARGV[b]]
    if algorithm == nil then
      return redis.error_reply('unknown algorithm ' .. tostring(ARGV[b]))
    end
    undone[i] = algorithm.undo(KEYS[i], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]),
                               tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), now)
  end
  return undone
end

local reply = {}
local k0, a0 = 0, 2
for _ = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[a0 + 1])
  local head, hold = 1, nil
  if n < 0 then  -- a request that may be undone: its holds' lifetime follows
    n, head, hold = -n, 2, tonumber(ARGV[a0 + 2])
  end
  local err = decide(k0, a0 + head, n, hold, reply)
  if err then return err end
  k0 = k0 + n
  a0 = a0 + head + 6 * n
end
return reply
