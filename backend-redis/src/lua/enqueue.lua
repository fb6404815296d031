-- SPEC E: ARGV[3] = n, then 10 fields per job: payload, priority, run_at (absolute, or
-- ''), delay (microseconds, or ''), max_attempts, group, batch, stage, dedupe key,
-- enqueued_by ('' = none for the optional ones). Returns id, deduplicated (0/1) per job.
local n = tonumber(ARGV[3])
local F = 10
-- Every check before the first write: a script that fails after writing keeps what
-- it wrote (SPEC E4, B3).
for i = 0, n - 1 do
  local o = 3 + i * F
  local b = ARGV[o + 7]
  if b ~= '' then
    local h = redis.call('HMGET', bk(b), 'of', 'sealed', 'failed', 'rel')
    if not h[1] then
      return redis.error_reply('RELAYQ_INVALID batch batch ' .. b .. ' is unknown in this queue')
    end
    if h[2] == '1' then
      return redis.error_reply('RELAYQ_INVALID batch batch ' .. b .. ' is sealed')
    end
    if h[3] == '1' then
      return redis.error_reply('RELAYQ_INVALID batch batch ' .. b .. ' halted after a dead job')
    end
    if h[4] and tonumber(ARGV[o + 8]) < tonumber(h[4]) then
      return redis.error_reply('RELAYQ_STAGE_CLOSED ' .. ARGV[o + 8] .. ' ' .. h[4])
    end
  end
end
local out, groups, batches = {}, {}, {}
for i = 0, n - 1 do
  local o = 3 + i * F
  local g, b, dk, by = ARGV[o + 6], ARGV[o + 7], ARGV[o + 9], ARGV[o + 10]
  local held = dk ~= '' and redis.call('HGET', B .. ':dedupe', dk)
  if held then
    out[#out + 1] = tonumber(held)
    out[#out + 1] = 1
  else
    local id = redis.call('INCR', B .. ':seq')
    local ra = ARGV[o + 3] ~= '' and tonumber(ARGV[o + 3]) or NOW + tonumber(ARGV[o + 4])
    local plain = g == '' and b == ''
    local fields = {'p', ARGV[o + 1], 'pr', ARGV[o + 2], 'ra', s(ra), 'ma', ARGV[o + 5],
      'at', '0', 'ca', s(NOW), 'c', claimed_fields(ARGV[o + 2], ARGV[o + 5], g, b,
        b ~= '' and ARGV[o + 8] or '', by)}
    if by ~= '' then fields[#fields + 1], fields[#fields + 2] = 'by', by end
    -- A job with no group or batch is ready at once: its state goes in the same write.
    if plain then fields[#fields + 1], fields[#fields + 2] = 'st', 'ready' end
    redis.call('HSET', jk(id), unpack(fields))
    if dk ~= '' then
      redis.call('HSET', jk(id), 'dk', dk)
      redis.call('HSET', B .. ':dedupe', dk, s(id))
    end
    if g ~= '' then
      local gm = okey(ra, id)
      redis.call('HSET', jk(id), 'g', g, 'gm', gm)
      redis.call('ZADD', gk(g), ARGV[o + 2], gm)
      groups[g] = true
    end
    if b ~= '' then
      redis.call('HSET', jk(id), 'b', b, 's', ARGV[o + 8])
      redis.call('ZADD', bk(b) .. ':live', ARGV[o + 8], id)
      redis.call('SADD', bk(b) .. ':jobs', id)
      batches[b] = batches[b] or {}
      table.insert(batches[b], id)
    end
    -- Jobs with a group or a batch start blocked; promotion below decides.
    if plain then
      stat('ready', 1)
      if ra > NOW then
        redis.call('ZADD', B .. ':delay', s(ra), id)
      else
        redis.call('ZADD', B .. ':ready', ARGV[o + 2], okey(ra, id))
      end
    else
      set_state(id, 'blocked')
    end
    out[#out + 1] = id
    out[#out + 1] = 0
  end
end
-- A batch whose lowest stage is not released yet releases it (its first jobs, or a new
-- floor); in one already released, only this call's jobs at that stage need placing.
for b, ids in pairs(batches) do
  local f = floor(b)
  local rel = tonumber(redis.call('HGET', bk(b), 'rel'))
  if rel == nil or rel < f then
    release_stage(b)
  else
    for _, id in ipairs(ids) do
      if num(id, 's') == f and get(id, 'st') == 'blocked' then
        local g = get(id, 'g')
        if g then groups[g] = true else set_state(id, 'ready') end
      end
    end
  end
end
for g in pairs(groups) do settle_group(g) end
event('r')
publish()
return out
