-- SPEC C: ARGV[3] = limit, ARGV[4] = lease (microseconds), ARGV[5] = worker, then one
-- fresh random token per job that may be claimed (made by the caller: Lua's random
-- numbers are not), then how many of the jobs start at once (SPEC K6). Returns the lease expiry, then 5 fields per claimed job (id,
-- attempt, payload, run_at, fixed_fields), in order-key order; the k-th job claimed
-- holds the k-th token. After the lease expiry comes the wait, in microseconds, until
-- the queue's rate allows the next start when the rate cut the claim short, else ''
-- (SPEC K10); then the wait until the earliest key its rate held allows a start, when
-- the claim came back short, else '' (SPEC K13).
local settings = redis.call('HMGET', B .. ':settings', 'paused', 'max', 'keyed', 'kl', 'rn',
  'rp', 'rb', 'rt', 'krn', 'krp', 'krb', 'kr')
-- Expired leases first (SPEC C5), in bounded chunks.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', B .. ':running', '-inf', s(NOW), 'LIMIT', 0, 100)) do
  expire(tonumber(id))
end
-- Jobs that fell due, in bounded chunks (never one unbounded unpack).
for _, set in ipairs({':delay', ':backoff'}) do
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', B .. set, '-inf', s(NOW), 'LIMIT', 0, 10000)) do
    local h = redis.call('HMGET', jk(id), 'pr', 'ra', 'lk')
    redis.call('ZREM', B .. set, id)
    ready_add(h[1], okey(tonumber(h[2]), tonumber(id)), h[3] or nil)
  end
end
-- A job's next attempt number as text, for the first few: parsing and formatting it
-- took about 3,400 instructions per job (callgrind), about as much as a redis.call.
local NEXT = {['0'] = '1', ['1'] = '2', ['2'] = '3', ['3'] = '4', ['4'] = '5'}
local limit = tonumber(ARGV[3])
if settings[1] == '1' then limit = 0 end
if settings[2] then
  local live = redis.call('ZCOUNT', B .. ':running', '(' .. s(NOW), '+inf')
  limit = math.min(limit, tonumber(settings[2]) - live)
end
-- SPEC K9: the queue's rate, by the generic cell rate algorithm on the server's clock
-- (relayq_core::kit::rate, which this follows step for step): `rt` is when the next
-- start is due; `limit` becomes what the rate allows now.
local paced = nil
if settings[5] and limit > 0 then
  local burst = tonumber(settings[7] or '1')
  local spaced = tonumber(settings[5]) - burst + 1
  local e = math.max(1, math.floor((tonumber(settings[6]) + spaced - 1) / spaced))
  local base = NOW
  if settings[8] then base = math.max(tonumber(settings[8]), NOW) end
  local room = math.max(0, math.floor((NOW + burst * e - base) / e))
  paced = {asked = limit, allowed = math.min(limit, room), base = base, e = e, burst = burst}
  limit = paced.allowed
end
local out = {'', '', ''}
if limit > 0 then
  local lease = tonumber(ARGV[4])
  -- The first `limit` members and their removal by rank, rather than ZPOPMIN: it
  -- replies each member's score, formatted as a double and parsed back into Lua,
  -- about 5% of a drained job's instructions (callgrind), for a value nobody reads.
  local popped
  if settings[3] then
    -- SPEC K12, K13: with key rates, the keys whose wake time came first get up to
    -- their rate's burst of parked jobs back, as many as the rate can allow at once.
    local rated, woken = nil, {}
    if settings[12] then
      rated = {default = rate_of(settings[9], settings[10], settings[11])}
      local due = redis.call('ZRANGEBYSCORE', B .. ':kwake', '-inf', s(NOW), 'LIMIT', 0, 100)
      for _, lk in ipairs(due) do
        redis.call('ZREM', B .. ':kwake', lk)
        local r = key_rate(lk, rated.default)
        unpark(lk, r and r.b or 1)
        woken[#woken + 1] = lk
      end
    end
    -- `slots` follows the tokens, one per job asked for (`limit` may be cut above).
    local asked = tonumber(ARGV[3])
    local keys
    popped, keys = keyed_head(limit, tonumber(ARGV[6 + asked]) or limit, tonumber(settings[4]),
      rated)
    if rated then
      for lk in pairs(keys.moved) do redis.call('HSET', B .. ':ktat', lk, s(keys.tats[lk])) end
      for lk, at in pairs(keys.wakes) do redis.call('ZADD', B .. ':kwake', s(at), lk) end
      -- A woken key's jobs beyond those put back stay parked: they go back when its
      -- rate next allows a start. Not a key this claim found full: its parked jobs go
      -- back as its slots free (a wake time now would have workers claim in a loop).
      for _, lk in ipairs(woken) do
        if not keys.wakes[lk] and not keys.full[lk] and redis.call('EXISTS', kpk(lk)) == 1 then
          local r = key_rate(lk, rated.default)
          if r then
            local tat = keys.tats[lk] or tonumber(redis.call('HGET', B .. ':ktat', lk) or '')
            redis.call('ZADD', B .. ':kwake', s(next_start(r, tat)), lk)
          end
        end
      end
      if #popped < limit then
        local first = redis.call('ZRANGE', B .. ':kwake', 0, 0, 'WITHSCORES')
        if #first > 0 then out[3] = s(math.max(0, tonumber(first[2]) - NOW)) end
      end
    end
  else
    popped = redis.call('ZRANGE', B .. ':ready', 0, limit - 1)
    if #popped > 0 then redis.call('ZREMRANGEBYRANK', B .. ':ready', 0, #popped - 1) end
  end
  -- The running index gets every claimed job in one call.
  local running = {}
  -- Jobs claimed per state they left (ready or retrying), counted once at the end.
  local left = {}
  local ex = s(NOW + lease)
  out[1] = ex
  for k = 1, #popped do
    -- The id as decimal text, without the order key's zero padding: no number to
    -- string conversions on the hot path.
    local id = string.match(popped[k], '^0*(%d+)$', 19)
    local key = B .. ':job:' .. id
    local h = redis.call('HMGET', key, 'st', 'at', 'p', 'ra', 'f', 'lk')
    -- Counted whether or not the queue has key limits now, so a limit set later
    -- counts what already runs (SPEC K2).
    if h[6] then
      redis.call('HINCRBY', B .. ':krun', h[6], 1)
      -- keyed_head took it out of its key's index with B:ready; ZREMRANGEBYRANK not.
      if not settings[3] then redis.call('ZREM', kwk(h[6]), popped[k]) end
    end
    if not h[5] then
      -- Enqueued before jobs kept their fixed fields in one value with the plain flag.
      local f = redis.call('HMGET', key, 'pr', 'ma', 'g', 'b', 's', 'by', 'dk')
      h[5] = fixed_fields(f[1], f[2], f[3], f[4], f[5], f[6], f[7], h[6])
      -- Kept, so its next claim (a retry) reads the one value.
      redis.call('HSET', key, 'f', h[5])
    end
    left[h[1]] = (left[h[1]] or 0) + 1
    local at = NEXT[h[2]] or s((tonumber(h[2]) or 0) + 1)
    local token = ARGV[5 + k]
    -- The fixed fields end in 'p' (byte 112) for a plain job.
    local kind = string.byte(h[5], -1) == 112 and 'p' or 'k'
    redis.call('HSET', key, 'st', 'running', 'at', at, 'ls', lease_value(kind, token, ex),
      'w', ARGV[5], 'sa', NOWS)
    running[2 * k - 1], running[2 * k] = ex, id
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = id, at, h[3], h[4], h[5]
  end
  if #running > 0 then redis.call('ZADD', B .. ':running', unpack(running)) end
  for st, n in pairs(left) do stat(st, -n) end
  stat('running', #running / 2)
end
if paced then
  local taken = (#out - 3) / 5
  local tat = paced.base + taken * paced.e
  if taken > 0 then redis.call('HSET', B .. ':settings', 'rt', s(tat)) end
  if paced.allowed < paced.asked and taken >= paced.allowed then
    out[2] = s(math.max(0, tat - (paced.burst - 1) * paced.e - NOW))
  end
end
publish()
return out
