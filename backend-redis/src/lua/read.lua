-- SPEC L5, M1: reads in one script, so one consistent view. ARGV[3] = what:
--   'stats': paused, max ('' if none), scheduled count, the oldest claimable job's
--     run_at ('' if none), the rate's count, interval, burst and next start ('' each if
--     none), the server's time, then state, count pairs;
--   'job' (ARGV[4] = id): now, the hash's length n, n items of field, value pairs, then
--     the log entries; or -1 if unknown;
--   'running': id, worker, attempt, started, expiry, progress (or nil) per running job;
--   'batches' (ARGV[4] = limit): batch ids, newest first;
--   'batch_jobs' (ARGV[4] = batch id): the batch's job ids, unordered; or -1 if unknown;
--   'dead' (ARGV[4] = limit): dead job ids, oldest first;
--   'lost' (ARGV[4..] = id, token pairs): the ids whose job is not running under that
--     token (SPEC B8);
--   'holder' (ARGV[4] = group): the group's job running or retrying, or -1 (SPEC M6);
--   'list' (ARGV[4] = below this id or '', ARGV[5] = limit, ARGV[6] = how many ids to
--     look at, ARGV[7..11] = state, batch, stage, group, text, each '' for any): where
--     the listing goes on ('' at its end), then the matching ids, newest first (SPEC M7);
--   'workers' (ARGV[4] = how long beats are kept, microseconds): beat, time pairs, the
--     most recent first (SPEC M9);
--   'keys' (ARGV[4] = limit): see below (SPEC K7).
local what = ARGV[3]
if what == 'keys' then
  -- The default limit and default key rate ('count,interval,burst'), then key,
  -- running, own limit, own rate, and when its rate allows the next start (each ''
  -- if none) per key with running jobs, a limit or rate of its own, or a rate that
  -- allows no start now, by key, at most ARGV[4] of them (SPEC K7, K14).
  local d = redis.call('HMGET', B .. ':settings', 'kl', 'krn', 'krp', 'krb')
  local default_rate = d[2] and rate_of(d[2], d[3], d[4]) or nil
  local keys = {}
  local function entry(k)
    keys[k] = keys[k] or {0, '', '', ''}
    return keys[k]
  end
  local run = redis.call('HGETALL', B .. ':krun')
  for i = 1, #run, 2 do entry(run[i])[1] = tonumber(run[i + 1]) end
  local own = redis.call('HGETALL', B .. ':klim')
  for i = 1, #own, 2 do entry(own[i])[2] = own[i + 1] end
  local rates = redis.call('HGETALL', B .. ':krate')
  for i = 1, #rates, 2 do entry(rates[i])[3] = rates[i + 1] end
  local tats = redis.call('HGETALL', B .. ':ktat')
  for i = 1, #tats, 2 do
    local r = key_rate(tats[i], default_rate)
    if r then
      local at = next_start(r, tonumber(tats[i + 1]))
      if at > NOW then entry(tats[i])[4] = s(at) end
    end
  end
  local names = {}
  for k in pairs(keys) do names[#names + 1] = k end
  table.sort(names)
  local out = {d[1] or '', d[2] and (d[2] .. ',' .. d[3] .. ',' .. d[4]) or ''}
  for i = 1, math.min(#names, tonumber(ARGV[4])) do
    local k = names[i]
    local e = keys[k]
    out[#out + 1], out[#out + 2], out[#out + 3] = k, e[1], e[2]
    out[#out + 1], out[#out + 2] = e[3], e[4]
  end
  return out
elseif what == 'stats' then
  local h = redis.call('HMGET', B .. ':settings', 'paused', 'max', 'rn', 'rp', 'rb', 'rt')
  -- The earliest run_at of a job a claim could take now (SPEC M1): the head of each
  -- priority band of B:ready (its members sort by run_at within a band), and the first
  -- due job of B:delay and B:backoff, which a claim moves to B:ready. One look-up per
  -- band, up to 100 bands.
  local oldest = nil
  local function older(t) if t and (oldest == nil or t < oldest) then oldest = t end end
  local head = redis.call('ZRANGE', B .. ':ready', 0, 0, 'WITHSCORES')
  local bands = 0
  while #head > 0 and bands < 100 do
    older(tonumber(string.sub(head[1], 1, 18)))
    head = redis.call('ZRANGEBYSCORE', B .. ':ready', '(' .. head[2], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    bands = bands + 1
  end
  for _, set in ipairs({':delay', ':backoff'}) do
    local due = redis.call('ZRANGEBYSCORE', B .. set, '-inf', s(NOW), 'WITHSCORES', 'LIMIT', 0, 1)
    if #due > 0 then older(tonumber(due[2])) end
  end
  local out = {h[1] or '0', h[2] or '', redis.call('ZCOUNT', B .. ':delay', '(' .. s(NOW), '+inf'),
    oldest and s(oldest) or '', h[3] or '', h[4] or '', h[5] or '', h[6] or '', NOWS}
  local stats = redis.call('HGETALL', B .. ':stats')
  for i = 1, #stats do out[#out + 1] = stats[i] end
  return out
elseif what == 'job' then
  local h = redis.call('HGETALL', jk(ARGV[4]))
  if #h == 0 then return -1 end
  -- The hash's length first: no field value can be mistaken for a separator.
  local out = {s(NOW), #h}
  for i = 1, #h do out[#out + 1] = h[i] end
  for _, e in ipairs(redis.call('LRANGE', jk(ARGV[4]) .. ':log', 0, -1)) do out[#out + 1] = e end
  return out
elseif what == 'running' then
  local out = {}
  -- The running index's score is the lease's expiry, kept with the lease.
  local running = redis.call('ZRANGE', B .. ':running', 0, -1, 'WITHSCORES')
  for i = 1, #running, 2 do
    local id = running[i]
    local h = redis.call('HMGET', jk(id), 'w', 'at', 'sa', 'pg')
    out[#out + 1] = id
    for j = 1, 3 do out[#out + 1] = h[j] end
    out[#out + 1] = s(tonumber(running[i + 1]))
    out[#out + 1] = h[4]
  end
  return out
elseif what == 'batches' then
  return redis.call('ZREVRANGE', B .. ':batches', 0, tonumber(ARGV[4]) - 1)
elseif what == 'batch_jobs' then
  if redis.call('EXISTS', bk(ARGV[4])) == 0 then return -1 end
  return redis.call('SMEMBERS', bk(ARGV[4]) .. ':jobs')
elseif what == 'dead' then
  return redis.call('ZRANGE', B .. ':dead', 0, tonumber(ARGV[4]) - 1)
elseif what == 'lost' then
  local lost = {}
  for i = 4, #ARGV, 2 do
    if not holds(ARGV[i], ARGV[i + 1]) then lost[#lost + 1] = ARGV[i] end
  end
  return lost
elseif what == 'holder' then
  local id = redis.call('GET', ghk(ARGV[4]))
  if not id then return -1 end
  local st = get(id, 'st')
  if st == 'running' or st == 'retrying' then return tonumber(id) end
  return -1
elseif what == 'workers' then
  local seen = redis.call('ZREVRANGEBYSCORE', B .. ':wseen', '+inf', '(' .. s(NOW - tonumber(ARGV[4])), 'WITHSCORES')
  local out = {}
  for i = 1, #seen, 2 do
    local beat = redis.call('HGET', B .. ':workers', seen[i])
    if beat then
      out[#out + 1] = beat
      out[#out + 1] = seen[i + 1]
    end
  end
  return out
elseif what == 'list' then
  -- Ids are the queue's own counter's, so the queue's jobs are every id from the
  -- counter down; a pruned one is looked at and skipped.
  local top = tonumber(redis.call('GET', B .. ':seq') or '0')
  if ARGV[4] ~= '' then top = math.min(top, tonumber(ARGV[4]) - 1) end
  local limit, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
  local state, batch, stage, group, text = ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]
  local out, place = {''}, 0
  for id = top, 1, -1 do
    place = place + 1
    local h = redis.call('HMGET', jk(id), 'st', 'ra', 'b', 's', 'g', 'le')
    if h[1] then
      local st = h[1]
      if st == 'ready' and tonumber(h[2]) > NOW then st = 'scheduled' end
      local hit = (state == '' or st == state) and (batch == '' or h[3] == batch)
        and (stage == '' or h[4] == stage) and (group == '' or h[5] == group)
      if hit and text ~= '' then
        hit = (h[6] and string.find(h[6], text, 1, true) ~= nil)
          or string.find(get(id, 'p') or '', text, 1, true) ~= nil
      end
      if hit then out[#out + 1] = s(id) end
    end
    if #out - 1 >= limit or place >= budget then
      out[1] = s(id)
      break
    end
  end
  return out
end
return redis.error_reply('RELAYQ_BUG unknown read ' .. what)
