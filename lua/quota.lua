-- quota.lua: the ledger of one global quota of the Rate Limit Quota Service, shared out among the Envoys that
-- enforce it. The rule, its reasons and its guarantee are written up in server/slidegate/quotas/ledger.py;
-- this is its twin for Redis, line for line alike (tests compare the books the two keep), so that every
-- slidegate replica shares a quota out from the same books, each change one atomic script call.
--
-- KEYS[1]  the quota's ledger: a hash of holders ("h:<holder>"), retired bookings ("r:<n>") and the last
--          booking's number ("n"), in ledger.py's encodings.
-- ARGV     op ("report", "release", "detach" or "booked"), now in ms ("" for Redis TIME), limit, window (ms), then
--          for report, release and detach: holder, and for report: allowed, denied, elapsed (ms), owner; for
--          release: unsure (see ledger.py's release); for detach: owner, unsure.
-- Reply    report: {max_tokens, tokens_per_fill, fill interval (ms)} (max_tokens 0: deny all; -1: another
--          stream reports this holder); release and detach: 0; booked: what the ledger books now, in
--          thousandths of a request.

local REPORT_INTERVAL_MS = 5000
local TTL_MS = 3 * REPORT_INTERVAL_MS
local SLACK_MS = 2000
local LEASE_MS = 3 * REPORT_INTERVAL_MS
local SETTLE_MS = 60000
local MAX_REPORTS = 16
local MAX_RETIRED = 32
local MAX_COUNT = 4294967296  -- 2^32

local function fmt(x)
  return string.format('%.0f', x)
end

local function split(text, sep)
  local out = {}
  if text == '' then return out end
  local start = 1
  while true do
    local at = string.find(text, sep, start, true)
    if not at then
      out[#out + 1] = string.sub(text, start)
      return out
    end
    out[#out + 1] = string.sub(text, start, at - 1)
    start = at + 1
  end
end

local function decode_reports(text)
  local out = {}
  for _, item in ipairs(split(text, ',')) do
    local at = string.find(item, ':', 1, true)
    out[#out + 1] = {tonumber(string.sub(item, 1, at - 1)), tonumber(string.sub(item, at + 1))}
  end
  return out
end

local function encode_reports(reports)
  local parts = {}
  for i, r in ipairs(reports) do parts[i] = fmt(r[1]) .. ':' .. fmt(r[2]) end
  return table.concat(parts, ',')
end

local function decode_holder(text)
  local parts = split(text, '|')
  local n = split(parts[1], ' ')
  for i = 1, #n do n[i] = tonumber(n[i]) end
  return {share = n[1], m = n[2], t = n[3], since = n[4], reported = n[5], level = n[6], carry = n[7],
          fresh = n[8], demand = n[9], seen = n[10], reports = decode_reports(parts[2]), owner = parts[3] or ''}
end

local function encode_holder(h)
  return table.concat({fmt(h.share), fmt(h.m), fmt(h.t), fmt(h.since), fmt(h.reported), fmt(h.level),
                       fmt(h.carry), fmt(h.fresh), fmt(h.demand), fmt(h.seen)}, ' ') .. '|' ..
         encode_reports(h.reports) .. '|' .. h.owner
end

local function decode_retired(text)
  local bar = string.find(text, '|', 1, true)
  local n = split(string.sub(text, 1, bar - 1), ' ')
  return {share = tonumber(n[1]), left = tonumber(n[2]), ended = tonumber(n[3]),
          reports = decode_reports(string.sub(text, bar + 1))}
end

local function encode_retired(r)
  return fmt(r.share) .. ' ' .. fmt(r.left) .. ' ' .. fmt(r.ended) .. '|' .. encode_reports(r.reports)
end

local function booked_by(r, now, window)
  local total = 0
  if now < r.ended + SLACK_MS + window then total = r.left end
  for _, rep in ipairs(r.reports) do
    if rep[1] > now - window then total = total + rep[2] * 1000 end
  end
  return math.min(r.share * 1000, total)
end

-- when the retired booking ``text`` can no longer count (ledger.py's _expires_of), read from its end and its last
-- report alone: a ledger's retired bookings are many, each looked at whenever one is added
local function expires_of(text, window)
  local ended = tonumber(string.match(text, '^[^ ]* [^ ]* ([^|]*)|'))
  -- the last report's time: the string read from its end (a pattern anchored at the end is tried from each
  -- character on)
  local at = string.match(string.reverse(text), '^[^,|:]*:([^,|:]*)[,|]')
  local last = 0
  if at then last = tonumber(string.reverse(at)) end
  return math.max(ended + SLACK_MS, last) + window
end

local function merge_oldest(reports)
  while #reports > MAX_REPORTS do
    local first, second = reports[1], reports[2]
    table.remove(reports, 1)
    reports[1] = {second[1], math.min(MAX_COUNT, first[2] + second[2])}
  end
end

local function keep_reports(reports, now, window)
  local kept = {}
  for _, r in ipairs(reports) do
    if r[1] > now - window then kept[#kept + 1] = r end
  end
  merge_oldest(kept)
  return kept
end

local function refill(t, elapsed, m, window)
  if t <= 0 then return 0 end
  local longest = window * (math.floor(m / t) + 2)
  elapsed = math.min(elapsed, longest)
  return math.floor(t * 1000 * elapsed / window) + 1
end

local function bucket_for(share, limit, window, shift)
  if share <= 0 or (share == 1 and limit > 1) then return {0, 0, 0} end
  if share == 1 then
    if shift > 0 then return {0, 0, 0} end
    return {1, 1, 2 * window}
  end
  local part = math.min(share - 1, math.max(1, math.floor(share * REPORT_INTERVAL_MS / (REPORT_INTERVAL_MS + window) + 0.5)))
  part = part + shift
  if part > share - 1 then return {0, 0, 0} end
  return {share - part, part, window}
end

local function assignment_of(h, window)
  if h.m == 0 then return {0, 0, 0} end
  if h.share == 1 then return {1, 1, 2 * window} end
  return {h.m, h.t, window}
end

local function same(a, b)
  return a[1] == b[1] and a[2] == b[2] and a[3] == b[3]
end

-- the ledger: field -> value (read whole by load, which every op but a release or detach that retires nothing
-- needs: those read and write their holder's field alone, closing a stream costing the same however many holders
-- the ledger has), and its names of a prefix in the order ledger.py sorts them
local key = KEYS[1]
local state = {}
local function load()
  local flat = redis.call('HGETALL', key)
  for i = 1, #flat, 2 do state[flat[i]] = flat[i + 1] end
end

local function retired_names()
  local numbered = {}
  for name in pairs(state) do
    if string.sub(name, 1, 2) == 'r:' then numbered[#numbered + 1] = {tonumber(string.sub(name, 3)), name} end
  end
  table.sort(numbered, function(a, b) return a[1] < b[1] end)
  local names = {}
  for i, item in ipairs(numbered) do names[i] = item[2] end
  return names
end

local function holder_names()
  local names = {}
  for name in pairs(state) do
    if string.sub(name, 1, 2) == 'h:' then names[#names + 1] = name end
  end
  table.sort(names)
  return names
end

local function put(name, value)
  state[name] = value
  redis.call('HSET', key, name, value)
end

local function drop(name)
  state[name] = nil
  redis.call('HDEL', key, name)
end

local function retire(entry, window)
  local number = tonumber(state['n'] or '0') + 1
  put('n', fmt(number))
  put('r:' .. fmt(number), encode_retired(entry))
  local names = retired_names()
  if #names <= MAX_RETIRED then return end
  local ends, numbers = {}, {}
  for _, name in ipairs(names) do
    ends[name], numbers[name] = expires_of(state[name], window), tonumber(string.sub(name, 3))
  end
  table.sort(names, function(a, b)
    if ends[a] ~= ends[b] then return ends[a] < ends[b] end
    return numbers[a] < numbers[b]
  end)
  local a, b = decode_retired(state[names[1]]), decode_retired(state[names[2]])
  local merged = {}
  for _, r in ipairs(a.reports) do merged[#merged + 1] = r end
  for _, r in ipairs(b.reports) do merged[#merged + 1] = r end
  table.sort(merged, function(x, y)
    if x[1] ~= y[1] then return x[1] < y[1] end
    return x[2] < y[2]
  end)
  merge_oldest(merged)
  put(names[1], encode_retired({share = a.share + b.share, left = a.left + b.left,
                                ended = math.max(a.ended, b.ended), reports = merged}))
  drop(names[2])
end

local function left_of(h, now, window)
  return h.level + refill(h.t, now - h.reported + SLACK_MS, h.m, window)
end

local function gone(h, till, window)
  local since = h.reported
  if h.fresh == 1 then since = h.since end
  return {share = h.share, left = h.level + refill(h.t, till + SLACK_MS - since, h.m, window), ended = till,
          reports = h.reports}
end

local function tidy(holder, now, window)
  for _, name in ipairs(retired_names()) do
    if now >= expires_of(state[name], window) then drop(name) end
  end
  for _, name in ipairs(holder_names()) do
    if name ~= 'h:' .. holder then
      local h = decode_holder(state[name])
      if now - h.seen >= LEASE_MS then
        drop(name)
        if h.share > 0 then retire(gone(h, h.seen + TTL_MS, window), window) end
      end
    end
  end
end

local op = ARGV[1]
local now
if ARGV[2] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local limit, window = tonumber(ARGV[3]), tonumber(ARGV[4])
-- the ledger outlives its last holder's bookings: a gone holder's bucket counts until TTL, SLACK and a window
-- after it was last heard from, noticed up to LEASE_MS late
local lifetime = LEASE_MS + TTL_MS + SLACK_MS + window

if op == 'booked' then
  load()
  local total = 0
  for name, text in pairs(state) do
    if string.sub(name, 1, 2) == 'h:' then
      total = total + decode_holder(text).share * 1000
    elseif string.sub(name, 1, 2) == 'r:' then
      total = total + booked_by(decode_retired(text), now, window)
    end
  end
  return total
end

local holder = ARGV[5]
local name = 'h:' .. holder

-- what Envoy may hold besides the holder's current bucket (ledger.py's release and detach: unsure)
local function book_unsure(share)
  if share > 0 then
    retire({share = share, left = share * 1000, ended = now + TTL_MS, reports = {}}, window)
  end
end

if op == 'release' then
  local text = redis.call('HGET', key, name)
  local h = text and decode_holder(text)
  local unsure = tonumber(ARGV[6] or '0')
  if (h and h.share > 0) or unsure > 0 then load() end
  if h then
    drop(name)
    if h.share > 0 then retire(gone(h, now + TTL_MS, window), window) end
  end
  book_unsure(unsure)
  redis.call('PEXPIRE', key, fmt(lifetime))
  return 0
end

if op == 'detach' then
  local text = redis.call('HGET', key, name)
  local unsure = tonumber(ARGV[7] or '0')
  if unsure > 0 then load() end
  if text then
    local h = decode_holder(text)
    if h.owner == ARGV[6] then
      h.owner = ''
      put(name, encode_holder(h))
    end
  end
  book_unsure(unsure)
  redis.call('PEXPIRE', key, fmt(lifetime))
  return 0
end

local allowed = math.min(tonumber(ARGV[6]), MAX_COUNT)
local denied = math.min(tonumber(ARGV[7]), MAX_COUNT)
local elapsed = tonumber(ARGV[8])
local owner = ARGV[9] or ''
load()
tidy(holder, now, window)
local h
if state[name] then h = decode_holder(state[name]) end
if h and h.owner ~= '' and h.owner ~= owner and now - h.seen < LEASE_MS then return {-1, 0, 0} end
local restarted = h and h.owner ~= owner and elapsed == 0
if h and (now - h.seen >= TTL_MS - SLACK_MS or restarted) then
  drop(name)
  if h.share > 0 then retire(gone(h, h.seen + TTL_MS, window), window) end
  h = nil
end
if not h then
  h = {share = 0, m = 0, t = 0, since = now, reported = now, level = 0, carry = 0, fresh = 0, demand = 0,
       seen = now, reports = {}, owner = owner}
end
h.owner = owner
local level
if h.fresh == 1 then
  local used = math.max(0, allowed * 1000 - h.carry)
  level = h.m * 1000 + refill(h.t, now - h.since, h.m, window) - used
else
  local interval = math.max(now - h.reported, elapsed + 1000)
  level = h.level + refill(h.t, interval, h.m, window) - allowed * 1000
  if denied > 0 and h.reported >= h.since + SLACK_MS then
    level = math.min(level, 1000 + refill(h.t, interval, h.m, window))
  end
end
h.level = math.max(0, math.min(h.m * 1000, level))
h.fresh, h.carry = 0, 0
if h.share > 0 and allowed > 0 then h.reports[#h.reports + 1] = {now, allowed} end
h.reports = keep_reports(h.reports, now, window)
local rate = math.min(MAX_COUNT, math.floor((allowed + denied) * 1000000 / math.max(elapsed, 1000)))
h.demand = math.max(rate, math.floor(h.demand / 2))
h.reported, h.seen = now, now
put(name, encode_holder(h))

local demands, others = {}, 0
for _, other in ipairs(holder_names()) do
  local o = decode_holder(state[other])
  demands[#demands + 1] = o.demand
  if other ~= name then others = others + o.share * 1000 end
end
for _, retired in ipairs(retired_names()) do
  others = others + booked_by(decode_retired(state[retired]), now, window)
end
local sum = 0
for _, d in ipairs(demands) do sum = sum + d end
local least = math.max(1, math.floor(sum / #demands / 10))
local weights = 0
for _, d in ipairs(demands) do weights = weights + math.max(d, least) end
local target = math.floor(limit * (math.max(h.demand, least) / weights))

local left, old = 0, 0
if h.share > 0 then
  left = left_of(h, now, window)
  old = booked_by({share = h.share, left = left, ended = now, reports = h.reports}, now, window)
end
local room = math.max(0, math.floor((limit * 1000 - others - old) / 1000))
local share = math.min(target, room)
local current = assignment_of(h, window)
local candidate = bucket_for(share, limit, window, 0)
if same(candidate, current) then
  candidate = bucket_for(share, limit, window, 1)
  if candidate[1] == 0 then
    share = share - 1
    candidate = bucket_for(share, limit, window, 0)
  end
end
local margin = math.max(1, math.floor(h.share / 10))
local replace
if h.share > 0 and target <= h.share - margin and now - h.since >= math.min(window, SETTLE_MS) then
  replace = true
else
  local gain = (candidate[1] + candidate[2]) * 1000 - (h.level + h.t * 1000)
  replace = candidate[1] > 0 and not same(candidate, current) and gain >= margin * 1000
end
redis.call('PEXPIRE', key, fmt(lifetime))
if not replace then return current end
if old > 0 then
  retire({share = h.share, left = left, ended = now, reports = h.reports}, window)
end
if candidate[1] == 0 then h.share = 0 else h.share = share end
h.m, h.t = candidate[1], candidate[2]
h.since, h.carry, h.fresh = now, left, 1
h.level = h.m * 1000
h.reports = {}
put(name, encode_holder(h))
return candidate
