-- SPEC B7: ARGV[3] = 'job' or 'batch', ARGV[4] = its id, ARGV[5] = why, for the log of
-- a running attempt. A job: 1 cancelled, 0 already finished, -1 unknown. A batch: how
-- many jobs were cancelled, or -1 unknown; the batch is sealed. A running job's lease is
-- revoked and its attempt closed in the log.
--
-- SPEC B9, a purge in steps: ARGV[3] = 'purge_batches', ARGV[4] = the last batch id
-- done, ARGV[6] = the newest batch id to look at ('' on the first step: the newest
-- now): cancels the next 20 batches' unfinished jobs as a batch cancel does; returns
-- {last batch id looked at (0 when none was left), jobs cancelled, that newest id}. ARGV[3] =
-- 'purge_jobs': cancels up to 200 jobs found running, ready, delayed or backing off,
-- each with its whole group, the group's last first; returns how many.
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
local function cancel_batch(b)
  redis.call('HSET', bk(b), 'sealed', '1')
  -- Highest stage first, so cancelling a stage never releases the next one. Every job
  -- listed is unfinished and ends cancelled: by its own cancel, or by that of a job it
  -- runs after (SPEC D4), which reaches it first. So all of them count.
  local live = redis.call('ZREVRANGE', bk(b) .. ':live', 0, -1)
  for _, id in ipairs(live) do
    cancel(tonumber(id))
  end
  event('f')
  return #live
end
local result
if ARGV[3] == 'job' then
  local id = tonumber(ARGV[4])
  if redis.call('EXISTS', jk(id)) == 0 then return -1 end
  result = cancel(id)
elseif ARGV[3] == 'batch' then
  local b = ARGV[4]
  if redis.call('EXISTS', bk(b)) == 0 then return -1 end
  result = cancel_batch(b)
elseif ARGV[3] == 'purge_batches' then
  local upto = ARGV[6]
  if upto == '' then upto = redis.call('GET', B .. ':bseq') or '0' end
  local last, n = 0, 0
  for _, b in ipairs(redis.call('ZRANGEBYSCORE', B .. ':batches', '(' .. ARGV[4], upto, 'LIMIT', 0, 20)) do
    last = tonumber(b)
    if redis.call('ZCARD', bk(b) .. ':live') > 0 then n = n + cancel_batch(b) end
  end
  result = {last, n, tonumber(upto)}
else
  result = 0
  for _, set in ipairs({':running', ':ready', ':delay', ':backoff'}) do
    for _, m in ipairs(redis.call('ZRANGE', B .. set, 0, 199 - result)) do
      local id = (set == ':ready') and id_of(m) or tonumber(m)
      local g = get(id, 'g')
      if g then
        for _, gm in ipairs(redis.call('ZREVRANGE', gk(g), 0, -1)) do
          if id_of(gm) ~= id then result = result + cancel(id_of(gm)) end
        end
      end
      result = result + cancel(id)
    end
    if result >= 200 then break end
  end
  -- Parked jobs (SPEC K4) are in their keys' sets, not in B:ready.
  if result < 200 then
    for _, lk in ipairs(redis.call('SMEMBERS', B .. ':kpk')) do
      for _, m in ipairs(redis.call('ZRANGE', kpk(lk), 0, 199 - result)) do
        result = result + cancel(id_of(m))
      end
      if result >= 200 then break end
    end
  end
end
publish()
return result
