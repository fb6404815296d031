-- SPEC C6, M2, M3. ARGV[3] = operation:
--   'pause' / 'resume'; 'max' (ARGV[4] = limit, or '' for none);
--   'rate' (ARGV[4] = count, or '' for none; ARGV[5] = interval, microseconds; ARGV[6]
--     = burst): stores it afresh, its next start cleared, unless it is the rate
--     already stored (SPEC K8);
--   'keylimit' (ARGV[4] = 'k' .. key, or '' for the default of every key; ARGV[5] =
--     limit, or '' for none): stores it, and puts every parked job back in B:ready,
--     so the next claim parks again those whose key is still full (SPEC K1, K3);
--   'keyrate' (ARGV[4] = 'k' .. key, or '' for the default of every key; ARGV[5] =
--     count, or '' for none; ARGV[6] = interval, microseconds; ARGV[7] = burst):
--     stores it afresh, unless it is the rate already stored, and puts the parked jobs
--     it may concern back in B:ready (SPEC K12);
--   'retry' (ARGV[4] = '' for every dead job, or a comma-separated id list): how many
--     dead jobs went back to ready, each with its enqueued budget again (not batch
--     jobs; not a job at the attempt cap; not a job whose dedupe key another unfinished
--     job holds; of dead jobs sharing a key, the first);
--   'maintain' (ARGV[4] = retention, microseconds): requeued, dead, pruned, and 1 when
--     there is more to do (each call does a bounded amount);
--   'delete' (ARGV[4..] = ids): how many of them were finished and are now gone, as
--     pruning leaves them (SPEC M8);
--   'runnow' (ARGV[4..] = ids): how many of them waited only for their time and are
--     due now (SPEC M10);
--   'beat' (ARGV[4] = worker, ARGV[5] = its beat, ARGV[6] = how long beats are kept,
--     microseconds): stores the beat in B:workers and its time in B:wseen, and drops
--     beats older than that (SPEC M9).
local op = ARGV[3]
-- Whether the queue's claims judge keys (keyed) and keys' rates (kr).
local function keyed_flags()
  local rated = redis.call('HEXISTS', B .. ':settings', 'krn') == 1
    or redis.call('EXISTS', B .. ':krate') == 1
  local keyed = rated or redis.call('HEXISTS', B .. ':settings', 'kl') == 1
    or redis.call('EXISTS', B .. ':klim') == 1
  if keyed then
    redis.call('HSET', B .. ':settings', 'keyed', '1')
  else
    redis.call('HDEL', B .. ':settings', 'keyed')
  end
  if rated then
    redis.call('HSET', B .. ':settings', 'kr', '1')
  else
    redis.call('HDEL', B .. ':settings', 'kr')
  end
end
if op == 'pause' or op == 'resume' then
  redis.call('HSET', B .. ':settings', 'paused', op == 'pause' and '1' or '0')
  event('r')
  publish()
  return 1
elseif op == 'keylimit' then
  if ARGV[4] == '' then
    if ARGV[5] == '' then
      redis.call('HDEL', B .. ':settings', 'kl')
    else
      redis.call('HSET', B .. ':settings', 'kl', ARGV[5])
    end
  elseif ARGV[5] == '' then
    redis.call('HDEL', B .. ':klim', string.sub(ARGV[4], 2))
  else
    redis.call('HSET', B .. ':klim', string.sub(ARGV[4], 2), ARGV[5])
  end
  keyed_flags()
  for _, lk in ipairs(redis.call('SMEMBERS', B .. ':kpk')) do unpark(lk) end
  event('r')
  publish()
  return 1
elseif op == 'keyrate' then
  local lk = ARGV[4] ~= '' and string.sub(ARGV[4], 2) or nil
  local want = ARGV[5] ~= '' and (ARGV[5] .. ',' .. ARGV[6] .. ',' .. ARGV[7]) or nil
  local was
  if lk then
    was = redis.call('HGET', B .. ':krate', lk)
  else
    local d = redis.call('HMGET', B .. ':settings', 'krn', 'krp', 'krb')
    if d[1] then was = d[1] .. ',' .. d[2] .. ',' .. d[3] end
  end
  if (was or false) == (want or false) then return 1 end
  if lk then
    -- The key starts afresh: under its new rate, or under the default.
    if want then
      redis.call('HSET', B .. ':krate', lk, want)
    else
      redis.call('HDEL', B .. ':krate', lk)
    end
    redis.call('HDEL', B .. ':ktat', lk)
    redis.call('ZREM', B .. ':kwake', lk)
    unpark(lk)
  else
    if want then
      redis.call('HSET', B .. ':settings', 'krn', ARGV[5], 'krp', ARGV[6], 'krb', ARGV[7])
    else
      redis.call('HDEL', B .. ':settings', 'krn', 'krp', 'krb')
    end
    -- Every key under the default starts afresh.
    for _, k in ipairs(redis.call('HKEYS', B .. ':ktat')) do
      if redis.call('HEXISTS', B .. ':krate', k) == 0 then
        redis.call('HDEL', B .. ':ktat', k)
        redis.call('ZREM', B .. ':kwake', k)
      end
    end
    for _, k in ipairs(redis.call('SMEMBERS', B .. ':kpk')) do unpark(k) end
  end
  keyed_flags()
  event('r')
  publish()
  return 1
elseif op == 'rate' then
  local now = redis.call('HMGET', B .. ':settings', 'rn', 'rp', 'rb')
  if now[1] ~= ARGV[4] or now[2] ~= ARGV[5] or now[3] ~= ARGV[6] then
    redis.call('HDEL', B .. ':settings', 'rn', 'rp', 'rb', 'rt')
    if ARGV[4] ~= '' then
      redis.call('HSET', B .. ':settings', 'rn', ARGV[4], 'rp', ARGV[5], 'rb', ARGV[6])
    end
  end
  event('r')
  publish()
  return 1
elseif op == 'max' then
  if ARGV[4] == '' then
    redis.call('HDEL', B .. ':settings', 'max')
  else
    redis.call('HSET', B .. ':settings', 'max', ARGV[4])
  end
  event('r')
  publish()
  return 1
elseif op == 'retry' then
  local wanted = nil
  if ARGV[4] ~= '' then
    wanted = {}
    for id in string.gmatch(ARGV[4], '[^,]+') do wanted[tonumber(id)] = true end
  end
  local revived = 0
  for _, id in ipairs(redis.call('ZRANGE', B .. ':dead', 0, -1)) do
    id = tonumber(id)
    local h = redis.call('HMGET', jk(id), 'b', 'dk', 'g', 'pr', 'at')
    local free = not h[2] or not redis.call('HGET', B .. ':dedupe', h[2])
    -- A job at the attempt counter's cap could get no attempt more: it stays dead.
    local room = (tonumber(h[5]) or 0) < 32767
    if (wanted == nil or wanted[id]) and not h[1] and free and room then
      revived = revived + 1
      redis.call('ZREM', B .. ':dead', id)
      redis.call('ZREM', B .. ':done', id)
      -- Attempts go on counting and max_attempts grows by the enqueued budget
      -- (SPEC M2). The fixed fields hold max_attempts: the next claim rebuilds them.
      local c = redis.call('HMGET', jk(id), 'at', 'ma', 'bu')
      local budget = c[3] or c[2]
      local ma = math.min(32767, (tonumber(c[1]) or 0) + tonumber(budget))
      redis.call('HDEL', jk(id), 'fa', 'f')
      redis.call('HSET', jk(id), 'ma', s(ma), 'bu', budget, 'ra', s(NOW))
      if h[2] then redis.call('HSET', B .. ':dedupe', h[2], s(id)) end
      if h[3] then
        local gm = okey(NOW, id)
        redis.call('HSET', jk(id), 'gm', gm)
        redis.call('ZADD', gk(h[3]), h[4], gm)
        set_state(id, 'blocked')
        settle_group(h[3])
      else
        set_state(id, 'ready')
      end
    end
  end
  publish()
  return revived
elseif op == 'runnow' then
  -- A ready job is never blocked, and a ready grouped job is its group's next: its
  -- earlier run_at keeps it first there, re-keyed as a retry's is.
  local moved = 0
  for i = 4, #ARGV do
    local id = tonumber(ARGV[i])
    local h = redis.call('HMGET', jk(id), 'st', 'ra')
    if (h[1] == 'ready' or h[1] == 'retrying') and tonumber(h[2]) > NOW then
      unindex(id, h[1], h[2])
      redis.call('HSET', jk(id), 'ra', s(NOW))
      index(id)
      regroup(id)
      moved = moved + 1
    end
  end
  publish()
  return moved
elseif op == 'delete' then
  local deleted = 0
  for i = 4, #ARGV do
    local id = ARGV[i]
    local h = redis.call('HMGET', jk(id), 'st', 'b')
    if h[1] == 'succeeded' or h[1] == 'dead' or h[1] == 'cancelled' then
      stat(h[1], -1)
      redis.call('DEL', jk(id), jk(id) .. ':log')
      redis.call('ZREM', B .. ':done', id)
      redis.call('ZREM', B .. ':dead', id)
      if h[2] then redis.call('SREM', bk(h[2]) .. ':jobs', id) end
      -- A plain completion's id stays in B:donelist until pruning reaches it and
      -- finds no job: removing it here would cost a walk of the list.
      deleted = deleted + 1
    end
  end
  publish()
  return deleted
elseif op == 'beat' then
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', B .. ':wseen', '-inf', '(' .. s(NOW - tonumber(ARGV[6])))) do
    redis.call('HDEL', B .. ':workers', gone)
    redis.call('ZREM', B .. ':wseen', gone)
  end
  redis.call('HSET', B .. ':workers', ARGV[4], ARGV[5])
  redis.call('ZADD', B .. ':wseen', NOWS, ARGV[4])
  return 1
elseif op == 'maintain' then
  -- Bounded work per call (a script blocks the server while it runs): the caller
  -- calls again while the last value says there is more.
  local requeued, dead, budget = 0, 0, 1000
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', B .. ':running', '-inf', s(NOW), 'LIMIT', 0, budget)) do
    local retries = expire(tonumber(id))
    if retries then requeued = requeued + 1 elseif retries == false then dead = dead + 1 end
  end
  local cutoff = NOW - tonumber(ARGV[4])
  local ids = redis.call('ZRANGEBYSCORE', B .. ':done', '-inf', s(cutoff), 'LIMIT', 0, budget)
  for _, id in ipairs(ids) do
    local h = redis.call('HMGET', jk(id), 'st', 'b')
    stat(h[1], -1)
    redis.call('DEL', jk(id), jk(id) .. ':log')
    redis.call('ZREM', B .. ':done', id)
    redis.call('ZREM', B .. ':dead', id)
    if h[2] then redis.call('SREM', bk(h[2]) .. ':jobs', id) end
  end
  -- Plain completions, oldest first, up to the first one still kept. Their list is in
  -- finishing order; after the server's clock stepped back, a few may wait behind a
  -- later one for a while.
  local listed, gone = 0, 0
  if #ids < budget then
    local head = redis.call('LRANGE', B .. ':donelist', 0, budget - #ids - 1)
    for _, id in ipairs(head) do
      local h = redis.call('HMGET', jk(id), 'st', 'fa', 'b')
      if h[1] and tonumber(h[2]) > cutoff then break end
      -- An entry without a job was deleted already (SPEC M8): trimmed, not counted.
      if h[1] then
        stat(h[1], -1)
        gone = gone + 1
      end
      if h[3] then redis.call('SREM', bk(h[3]) .. ':jobs', id) end
      redis.call('DEL', jk(id), jk(id) .. ':log')
      listed = listed + 1
    end
    if listed > 0 then redis.call('LTRIM', B .. ':donelist', listed, -1) end
  end
  local pruned = #ids + gone
  local more = (requeued + dead == budget or #ids + listed == budget) and 1 or 0
  -- Keys' rate values that lie in the past, and no wake: the same as none (kit::rate
  -- starts from now either way). A hundred a call, from a cursor kept in settings kc,
  -- so keys that never start again leave nothing behind (SPEC K12).
  local scan = redis.call('HSCAN', B .. ':ktat', redis.call('HGET', B .. ':settings', 'kc') or '0',
    'COUNT', 100)
  for i = 1, #scan[2], 2 do
    local k = scan[2][i]
    if tonumber(scan[2][i + 1]) <= NOW and not redis.call('ZSCORE', B .. ':kwake', k) then
      redis.call('HDEL', B .. ':ktat', k)
    end
  end
  if scan[1] == '0' then
    redis.call('HDEL', B .. ':settings', 'kc')
  else
    redis.call('HSET', B .. ':settings', 'kc', scan[1])
  end
  if more == 0 then
    -- Sealed batches left without jobs go too.
    for _, b in ipairs(redis.call('ZRANGE', B .. ':batches', 0, -1)) do
      if redis.call('HGET', bk(b), 'sealed') == '1' and redis.call('SCARD', bk(b) .. ':jobs') == 0 then
        redis.call('DEL', bk(b), bk(b) .. ':live', bk(b) .. ':jobs')
        redis.call('ZREM', B .. ':batches', b)
      end
    end
  end
  publish()
  return {requeued, dead, pruned, more}
end
return redis.error_reply('RELAYQ_BUG unknown admin operation ' .. op)
