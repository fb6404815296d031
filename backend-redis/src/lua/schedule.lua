-- SPEC S: schedules, each a hash B:s:<name> (d definition, v version, m mark in
-- microseconds, p paused '1'/'0', ls last slot, lj its first job, lb its batch, ''
-- for none), named in the set B:schedules.
-- ARGV[3] = 'put' (ARGV[4] name, ARGV[5] definition, ARGV[6] starting or ''): 1;
-- 'pause' (ARGV[4] name, ARGV[5] '1'/'0'): 1, or -1 unknown; 'delete' (ARGV[4]
-- name): 1 or 0; 'list': the server's time, then name, d, v, m, p, ls, lj, lb per
-- schedule.
local op = ARGV[3]
local function sk(name) return B .. ':s:' .. name end
if op == 'list' then
  local out = {NOWS}
  for _, name in ipairs(redis.call('SMEMBERS', B .. ':schedules')) do
    local h = redis.call('HMGET', sk(name), 'd', 'v', 'm', 'p', 'ls', 'lj', 'lb')
    if h[1] then
      out[#out + 1] = name
      for i = 1, 7 do out[#out + 1] = h[i] or '' end
    end
  end
  return out
end
local k = sk(ARGV[4])
if op == 'put' then
  -- A replacement keeps the mark and the pause flag (SPEC S1).
  if redis.call('EXISTS', k) == 1 then
    redis.call('HSET', k, 'd', ARGV[5])
    redis.call('HINCRBY', k, 'v', 1)
  else
    redis.call('HSET', k, 'd', ARGV[5], 'v', '1', 'm', ARGV[6] ~= '' and ARGV[6] or NOWS,
      'p', '0')
    redis.call('SADD', B .. ':schedules', ARGV[4])
  end
  return 1
end
if op == 'pause' then
  if redis.call('EXISTS', k) == 0 then return -1 end
  redis.call('HSET', k, 'p', ARGV[5])
  return 1
end
if op == 'delete' then
  redis.call('SREM', B .. ':schedules', ARGV[4])
  return redis.call('DEL', k)
end
return redis.error_reply('RELAYQ_INVALID op unknown schedule operation')
