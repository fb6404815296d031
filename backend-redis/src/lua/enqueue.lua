-- SPEC E: ARGV[3] = n, then 10 fields per job: payload, priority, run_at (absolute, or
-- ''), delay (microseconds, or ''), max_attempts, group, batch, stage, dedupe key,
-- enqueued_by ('' = none for the optional ones). Returns id, deduplicated (0/1) per job.
local n = tonumber(ARGV[3])
local F = 10
-- Every check before the first write: a script that fails after writing keeps what
-- it wrote (SPEC E4, B3). Each batch is read once: `rel[b]` is its released stage, or
-- false before any.
local rel = {}
for i = 0, n - 1 do
  local o = 3 + i * F
  local b = ARGV[o + 7]
  if b ~= '' and rel[b] == nil then
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
    rel[b] = h[4] and tonumber(h[4]) or false
  end
  if b ~= '' and rel[b] and tonumber(ARGV[o + 8]) < rel[b] then
    return redis.error_reply('RELAYQ_STAGE_CLOSED ' .. ARGV[o + 8] .. ' ' .. s(rel[b]))
  end
end
local out, groups, batches = {}, {}, {}
local function add(t, f, v) t[#t + 1], t[#t + 2] = f, v end
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
    -- A job without a group is ready at once when it has no batch or joins its batch's
    -- released stage: nothing below that stage is unfinished (SPEC B3 turns lower ones
    -- away). Other jobs with a group or a batch start blocked; promotion below decides.
    local ready = g == '' and (b == '' or (rel[b] and tonumber(ARGV[o + 8]) <= rel[b]))
    local fields = {'p', ARGV[o + 1], 'pr', ARGV[o + 2], 'ra', s(ra), 'ma', ARGV[o + 5],
      'at', '0', 'ca', s(NOW), 'f', fixed_fields(ARGV[o + 2], ARGV[o + 5], g, b,
        b ~= '' and ARGV[o + 8] or '', by, dk), 'st', ready and 'ready' or 'blocked'}
    if by ~= '' then add(fields, 'by', by) end
    if dk ~= '' then
      add(fields, 'dk', dk)
      redis.call('HSET', B .. ':dedupe', dk, s(id))
    end
    if g ~= '' then
      local gm = okey(ra, id)
      add(fields, 'g', g)
      add(fields, 'gm', gm)
      redis.call('ZADD', gk(g), ARGV[o + 2], gm)
      groups[g] = true
    end
    if b ~= '' then
      add(fields, 'b', b)
      add(fields, 's', ARGV[o + 8])
      redis.call('ZADD', bk(b) .. ':live', ARGV[o + 8], id)
      redis.call('SADD', bk(b) .. ':jobs', id)
      batches[b] = true
    end
    redis.call('HSET', jk(id), unpack(fields))
    if ready then
      stat('ready', 1)
      if ra > NOW then
        redis.call('ZADD', B .. ':delay', s(ra), id)
      else
        redis.call('ZADD', B .. ':ready', ARGV[o + 2], okey(ra, id))
      end
    else
      stat('blocked', 1)
    end
    out[#out + 1] = id
    out[#out + 1] = 0
  end
end
-- Only a batch whose floor is above its released stage (or that has none yet) has a
-- stage to release. At the released stage, ungrouped jobs went in ready above and
-- grouped ones are their groups' business, so its jobs are not read again.
for b in pairs(batches) do
  if not rel[b] or rel[b] < floor(b) then release_stage(b) end
end
for g in pairs(groups) do settle_group(g) end
event('r')
publish()
return out
