-- sliding_window_log.lua: an exact sliding-window log, deciding every limited descriptor of one
-- ShouldRateLimit call at once, all-or-nothing.
--
-- KEYS[i]   one sorted set per limit (i = 1..n). Members are admitted requests, scored by their time
--           in microseconds: "<t>:<seq>" holds one hit, "<t>:<seq>:<h>" holds h hits. <seq> numbers the
--           members recorded at the same microsecond, so two hits at one instant are two members.
--           The member "#" scored -total keeps the number of hits in the window (scores of hits are > 0,
--           so it is never pruned); a key holding no hits is deleted.
-- ARGV[1]   now in microseconds since the epoch, or "" to use Redis TIME (one clock for all replicas).
-- ARGV[2+3(i-1)..]  for limit i: limit (hits per window), window (microseconds), hits (0 = check only;
--           the caller clamps hits to limit + 1, since any larger value is equally over limit).
--
-- A hit recorded at t counts while now - t < window. The request is admitted only when every limit has
-- room for its hits (total + hits <= limit); then its hits are recorded in every limit, otherwise nothing
-- is recorded anywhere.
--
-- Reply: { admitted (0|1), then for each limit i: over (0|1), remaining, reset (microseconds) }.
--   within limit: reset = time until the oldest counted hit leaves the window (0 when nothing is counted);
--   over limit:   reset = time until this request's hits would fit (one window when hits > limit).

local function fmt(x)
  -- Lua would print large numbers as 1.7e+15; Redis needs every digit.
  return string.format('%.0f', x)
end

local function weight(member)
  local h = string.match(member, '^%d+:%d+:(%d+)$')
  if h then return tonumber(h) end
  return 1
end

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local n = #KEYS
local totals = {}   -- key -> hits counted, including hits of earlier limits of this request on that key
local result = {1}
local admitted = 1

for i = 1, n do
  local key = KEYS[i]
  local base = 2 + (i - 1) * 3
  local limit = tonumber(ARGV[base])
  local window = tonumber(ARGV[base + 1])
  local hits = tonumber(ARGV[base + 2])
  local cutoff = now - window

  local total = totals[key]
  if total == nil then
    local expired = redis.call('ZRANGEBYSCORE', key, 0, fmt(cutoff))
    local stored = redis.call('ZSCORE', key, '#')
    if stored then
      total = -tonumber(stored)
    else
      -- no counter: the key is new (or was edited by hand); count what is there
      total = 0
      for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, 0, '+inf')) do total = total + weight(m) end
      if total > 0 then redis.call('ZADD', key, fmt(-total), '#') end
    end
    if #expired > 0 then
      for _, m in ipairs(expired) do total = total - weight(m) end
      redis.call('ZREMRANGEBYSCORE', key, 0, fmt(cutoff))
      if total <= 0 then
        total = 0
        redis.call('DEL', key)
      else
        redis.call('ZADD', key, fmt(-total), '#')
      end
    end
  end

  local over = 0
  local reset = 0
  if total + hits > limit then
    over = 1
    admitted = 0
    local need = total + hits - limit   -- hits that must leave the window first
    if hits > limit then
      reset = window
    else
      -- walk the oldest members (rank 0 is "#") until enough hits have left
      local freed = 0
      local rank = 1
      while freed < need do
        local batch = redis.call('ZRANGE', key, rank, rank + 63, 'WITHSCORES')
        if #batch == 0 then
          -- the rest are hits of this request's earlier limits, recorded now
          reset = window
          break
        end
        for j = 1, #batch, 2 do
          freed = freed + weight(batch[j])
          if freed >= need then
            reset = tonumber(batch[j + 1]) + window - now
            break
          end
        end
        rank = rank + 64
      end
    end
  end
  totals[key] = total + hits
  result[#result + 1] = over
  result[#result + 1] = over == 1 and 0 or (limit - total - hits)
  result[#result + 1] = reset
end

if admitted == 1 then
  local snow = fmt(now)
  for i = 1, n do
    local key = KEYS[i]
    local base = 2 + (i - 1) * 3
    local window = tonumber(ARGV[base + 1])
    local hits = tonumber(ARGV[base + 2])
    if hits > 0 then
      local seq = redis.call('ZCOUNT', key, snow, snow)
      local member = snow .. ':' .. seq
      if hits > 1 then member = member .. ':' .. fmt(hits) end
      redis.call('ZADD', key, snow, member)
      redis.call('ZINCRBY', key, fmt(-hits), '#')
      redis.call('PEXPIRE', key, fmt(math.ceil(window / 1000)))
    end
  end
  -- within limit: the oldest counted hit decides when the window frees up
  for i = 1, n do
    local key = KEYS[i]
    local window = tonumber(ARGV[2 + (i - 1) * 3 + 1])
    local oldest = redis.call('ZRANGE', key, 1, 1, 'WITHSCORES')
    if #oldest > 0 then
      result[1 + (i - 1) * 3 + 3] = tonumber(oldest[2]) + window - now
    end
  end
else
  result[1] = 0
  -- rejected: limits that had room report when their oldest counted hit leaves
  for i = 1, n do
    if result[1 + (i - 1) * 3 + 1] == 0 then
      local key = KEYS[i]
      local window = tonumber(ARGV[2 + (i - 1) * 3 + 1])
      local oldest = redis.call('ZRANGE', key, 1, 1, 'WITHSCORES')
      if #oldest > 0 then
        result[1 + (i - 1) * 3 + 3] = tonumber(oldest[2]) + window - now
      end
      -- nothing was recorded, so the remaining room does not include this request's hits
      local base = 2 + (i - 1) * 3
      result[1 + (i - 1) * 3 + 2] = result[1 + (i - 1) * 3 + 2] + tonumber(ARGV[base + 2])
    end
  end
end

return result
