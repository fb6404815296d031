-- SPEC C: ARGV[3] = limit, ARGV[4] = lease (microseconds), ARGV[5] = worker, then one
-- fresh random token per job that may be claimed (made by the caller: Lua's random
-- numbers are not). Returns 12 fields per claimed job, in order-key order.
local settings = redis.call('HMGET', B .. ':settings', 'paused', 'max')
-- Expired leases first (SPEC C5), in bounded chunks.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', B .. ':running', '-inf', s(NOW), 'LIMIT', 0, 100)) do
  expire(tonumber(id))
end
-- Jobs that fell due, in bounded chunks (never one unbounded unpack).
for _, set in ipairs({':delay', ':backoff'}) do
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', B .. set, '-inf', s(NOW), 'LIMIT', 0, 10000)) do
    local h = redis.call('HMGET', jk(id), 'pr', 'ra')
    redis.call('ZREM', B .. set, id)
    redis.call('ZADD', B .. ':ready', h[1], okey(tonumber(h[2]), tonumber(id)))
  end
end
local limit = tonumber(ARGV[3])
if settings[1] == '1' then limit = 0 end
if settings[2] then
  local live = redis.call('ZCOUNT', B .. ':running', '(' .. s(NOW), '+inf')
  limit = math.min(limit, tonumber(settings[2]) - live)
end
local out = {}
if limit > 0 then
  local lease = tonumber(ARGV[4])
  local popped = redis.call('ZPOPMIN', B .. ':ready', limit)
  -- The running index gets every claimed job in one call.
  local running = {}
  for i = 1, #popped, 2 do
    local id = id_of(popped[i])
    local k = (i + 1) / 2
    local h = redis.call('HMGET', jk(id), 'st', 'at', 'p', 'pr', 'ra', 'ma', 'g', 'b', 's', 'by')
    stat(h[1], -1)
    stat('running', 1)
    local ex = NOW + lease
    local at = (tonumber(h[2]) or 0) + 1
    redis.call('HSET', jk(id), 'st', 'running', 'at', s(at), 'tk', ARGV[5 + k], 'ex', s(ex),
      'w', ARGV[5], 'sa', s(NOW))
    running[#running + 1] = s(ex)
    running[#running + 1] = id
    for _, v in ipairs({id, ARGV[5 + k], at, s(ex), h[3], h[4], h[5], h[6]}) do
      out[#out + 1] = v
    end
    -- Optional fields as '' when absent: a nil would end the array.
    for j = 7, 10 do out[#out + 1] = h[j] or '' end
  end
  if #running > 0 then redis.call('ZADD', B .. ':running', unpack(running)) end
end
publish()
return out
