-- sliding_window_log.lua: an exact sliding-window log (part of the script built from decide.lua).
--
-- Parameters: p1 = limit (hits per window), p2 = window (microseconds), p3 unused.
-- Key: a sorted set. Each admitted request is a member scored by its time in microseconds: "<t>:<seq>"
--   holds one hit, "<t>:<seq>:<h>" holds h hits; <seq> numbers the members recorded at the same
--   microsecond, so two hits at one instant are two hits. The member "#" is scored -(hits counted): hit
--   scores are > 0, so it is never pruned. A key with no hits left is deleted.
-- A hit recorded at t counts while now - t < window. Memory: one member per admitted request in the
--   window, so at most `limit` members.
-- Negative hits give back the newest hits first.

local function log_weight(member)
  local h = string.match(member, '^%d+:%d+:(%d+)$')
  if h then return tonumber(h) end
  return 1
end

algorithms.sliding_window_log = {
  load = function(key, limit, window, _, now)
    local cutoff = fmt(now - window)
    local expired = redis.call('ZRANGEBYSCORE', key, 0, cutoff)
    local stored = redis.call('ZSCORE', key, '#')
    local total
    if stored then
      total = -tonumber(stored)
    else
      total = 0  -- a new key (or one edited by hand): count what is there
      for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, 0, '+inf')) do total = total + log_weight(m) end
    end
    if #expired > 0 then
      for _, m in ipairs(expired) do total = total - log_weight(m) end
      redis.call('ZREMRANGEBYSCORE', key, 0, cutoff)
    end
    if total <= 0 then
      total = 0
      redis.call('DEL', key)
    elseif #expired > 0 or not stored then
      redis.call('ZADD', key, fmt(-total), '#')
    end
    local oldest = redis.call('ZRANGE', key, 1, 1, 'WITHSCORES')
    return {
      key = key, limit = limit, window = window, total = total, pend = 0, give = 0,
      oldest = oldest[2] and tonumber(oldest[2]) or nil,
    }
  end,

  evaluate = function(st, hits, now)
    local function counted() return st.total - st.give + st.pend end
    local function reset()
      if st.oldest and st.give < st.total then return st.oldest + st.window - now end
      if st.pend > 0 then return st.window end
      return 0
    end
    local rem_before = math.max(0, st.limit - counted())
    local reset_before = reset()
    if hits < 0 then
      local g = -hits
      local take = math.min(g, st.pend)
      st.pend = st.pend - take
      st.give = math.min(st.total, st.give + g - take)
      return 0, rem_before, reset_before, math.max(0, st.limit - counted()), reset(), 0
    end
    if counted() + hits > st.limit then
      local over_reset = st.window
      if hits <= st.limit then
        -- walk the oldest stored hits (rank 0 is "#") until enough have left the window
        local need = counted() + hits - st.limit
        local keep = st.total - st.give
        local freed, rank = 0, 1
        while freed < need and freed < keep do
          local batch = redis.call('ZRANGE', st.key, rank, rank + 63, 'WITHSCORES')
          if #batch == 0 then break end
          for j = 1, #batch, 2 do
            freed = freed + log_weight(batch[j])
            if freed >= need then
              over_reset = tonumber(batch[j + 1]) + st.window - now
              break
            end
            if freed >= keep then break end
          end
          rank = rank + 64
        end
      end
      return 1, rem_before, reset_before, 0, 0, over_reset
    end
    st.pend = st.pend + hits
    return 0, rem_before, reset_before, math.max(0, st.limit - counted()), reset(), 0
  end,

  save = function(st, now)
    local key = st.key
    local give = st.give
    while give > 0 do
      -- newest first; a member heavier than what is left to give back keeps the difference
      local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', 1, 'WITHSCORES', 'LIMIT', 0, 64)
      if #newest == 0 then break end
      for j = 1, #newest, 2 do
        local w = log_weight(newest[j])
        redis.call('ZREM', key, newest[j])
        if w > give then
          local t, seq = string.match(newest[j], '^(%d+):(%d+)')
          local rest = w - give
          local member = t .. ':' .. seq
          if rest > 1 then member = member .. ':' .. fmt(rest) end
          redis.call('ZADD', key, newest[j + 1], member)
          give = 0
          break
        end
        give = give - w
        if give == 0 then break end
      end
    end
    local total = st.total - st.give
    if st.pend > 0 then
      local snow = fmt(now)
      local seq = redis.call('ZCOUNT', key, snow, snow)
      local member = snow .. ':' .. seq
      if st.pend > 1 then member = member .. ':' .. fmt(st.pend) end
      redis.call('ZADD', key, snow, member)
      total = total + st.pend
    end
    if total <= 0 then
      redis.call('DEL', key)
    elseif st.pend > 0 or st.give > 0 then
      redis.call('ZADD', key, fmt(-total), '#')
      if st.pend > 0 then pexpire_us(key, st.window) end
    end
  end,
}
