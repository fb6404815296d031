-- SPEC B7: ARGV[3] = 'job' or 'batch', ARGV[4] = its id, ARGV[5] = why, for the log of
-- a running attempt. A job: 1 cancelled, 0 already finished, -1 unknown. A batch: how
-- many jobs were cancelled, or -1 unknown; the batch is sealed. A running job's lease is
-- revoked and its attempt closed in the log.
local function cancel(id)
  local st = get(id, 'st')
  if st == 'succeeded' or st == 'dead' or st == 'cancelled' then return 0 end
  if st == 'running' then
    log(id, num(id, 'at'), 'cancelled', ARGV[5])
    -- Its worker stops the handler now, not at its next beat (SPEC B8).
    event('c')
  end
  finish(id, 'cancelled')
  return 1
end
local result
if ARGV[3] == 'job' then
  local id = tonumber(ARGV[4])
  if redis.call('EXISTS', jk(id)) == 0 then return -1 end
  result = cancel(id)
else
  local b = ARGV[4]
  if redis.call('EXISTS', bk(b)) == 0 then return -1 end
  redis.call('HSET', bk(b), 'sealed', '1')
  result = 0
  -- Highest stage first, so cancelling a stage never releases the next one.
  for _, id in ipairs(redis.call('ZREVRANGE', bk(b) .. ':live', 0, -1)) do
    result = result + cancel(tonumber(id))
  end
  event('f')
end
publish()
return result
