-- SPEC B: ARGV[3] = 'open' (ARGV[4] = on_failure, ARGV[5] = name or '' for none,
-- ARGV[6] = the dependency policy, SPEC D4): the new batch id; 'seal' (ARGV[4] = id): 1,
-- or -1 unknown; 'progress' (ARGV[4] = id): on_failure, sealed, failed, released stage
-- ('' if none), created, the latest finish of its jobs ('' if none), name ('' if none),
-- dependency policy, then stage, state, count triples, or -1 unknown;
-- 'reached' (ARGV[4] = id): sealed ('1'/'0') and the lowest stage with an unfinished
-- job ('' if none), or -1 unknown.
local op = ARGV[3]
if op == 'open' then
  local id = redis.call('INCR', B .. ':bseq')
  redis.call('HSET', bk(id), 'of', ARGV[4], 'sealed', '0', 'failed', '0', 'ca', s(NOW))
  if ARGV[5] ~= '' then redis.call('HSET', bk(id), 'nm', ARGV[5]) end
  if ARGV[6] == 'run' then redis.call('HSET', bk(id), 'af', 'run') end
  redis.call('ZADD', B .. ':batches', id, id)
  return id
end
local b = ARGV[4]
local h = redis.call('HMGET', bk(b), 'of', 'sealed', 'failed', 'rel', 'ca', 'nm', 'af')
if not h[1] then return -1 end
if op == 'seal' then
  redis.call('HSET', bk(b), 'sealed', '1')
  event('f')
  publish()
  return 1
end
if op == 'reached' then
  -- One look-up in the live set, whatever the batch's size.
  local low = floor(b)
  return {h[2], low and s(low) or ''}
end
local counts, last = {}, nil
for _, id in ipairs(redis.call('SMEMBERS', bk(b) .. ':jobs')) do
  local j = redis.call('HMGET', jk(id), 's', 'st', 'fa')
  if j[1] then
    local key = j[1] .. ' ' .. j[2]
    counts[key] = (counts[key] or 0) + 1
    local fa = tonumber(j[3])
    if fa and (not last or fa > last) then last = fa end
  end
end
local out = {h[1], h[2], h[3], h[4] or '', h[5] or '', last and s(last) or '', h[6] or '',
  h[7] or 'cancel'}
for key, count in pairs(counts) do
  local sp = string.find(key, ' ')
  out[#out + 1] = string.sub(key, 1, sp - 1)
  out[#out + 1] = string.sub(key, sp + 1)
  out[#out + 1] = count
end
return out
