-- SPEC L3: ARGV[3] = job id, ARGV[4] = token, ARGV[5] = extension (microseconds).
-- Returns the new expiry, or -1 when the token no longer holds.
local id = tonumber(ARGV[3])
local ex = NOW + tonumber(ARGV[5])
local ls = redis.call('HGET', jk(id), 'ls')
if ls then
  -- A blank lease (a plainly completed job) holds no token.
  if lease_token(ls) ~= ARGV[4] or tonumber(lease_expiry(ls)) <= NOW then return -1 end
  redis.call('HSET', jk(id), 'ls', lease_value(string.sub(ls, 1, 1), ARGV[4], s(ex)))
else
  -- A lease written before `ls` existed.
  local h = redis.call('HMGET', jk(id), 'st', 'tk', 'ex')
  if h[1] ~= 'running' or h[2] ~= ARGV[4] or tonumber(h[3]) <= NOW then return -1 end
  redis.call('HSET', jk(id), 'ex', s(ex))
end
redis.call('ZADD', B .. ':running', s(ex), id)
return ex
