-- SPEC L3: ARGV[3] = job id, ARGV[4] = token, ARGV[5] = extension (microseconds).
-- Returns the new expiry, or -1 when the token no longer holds.
local id = tonumber(ARGV[3])
local h = redis.call('HMGET', jk(id), 'st', 'tk', 'ex')
if h[1] ~= 'running' or h[2] ~= ARGV[4] or tonumber(h[3]) <= NOW then return -1 end
local ex = NOW + tonumber(ARGV[5])
redis.call('HSET', jk(id), 'ex', s(ex))
redis.call('ZADD', B .. ':running', s(ex), id)
return ex
