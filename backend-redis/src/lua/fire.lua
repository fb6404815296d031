-- SPEC S2: fires one slot. ARGV[3] name, ARGV[4] version, ARGV[5] slot in microseconds
-- ('' = run now: no mark moves, a pause is ignored), ARGV[6] the batch's on_failure
-- ('' = no batch), ARGV[7] = n, then 11 fields per job (see enqueue_jobs), batch ''.
-- Returns {'made', batch or '', id, deduplicated, ...}, or {why}: 'gone', 'changed',
-- 'paused', 'taken', 'notdue'. One script: the mark moves with the jobs, or neither.
local k = B .. ':s:' .. ARGV[3]
local h = redis.call('HMGET', k, 'v', 'm', 'p')
if not h[1] then return {'gone'} end
if h[1] ~= ARGV[4] then return {'changed'} end
local slot = ARGV[5]
if slot ~= '' then
  if h[3] == '1' then return {'paused'} end
  if tonumber(h[2]) >= tonumber(slot) then return {'taken'} end
  if tonumber(slot) > NOW then return {'notdue'} end
end
local n = tonumber(ARGV[7])
local A, batch, out = ARGV, '', {}
if n > 0 then
  if ARGV[6] ~= '' then
    local id = redis.call('INCR', B .. ':bseq')
    batch = s(id)
    -- The batch is named after its schedule (SPEC B1).
    redis.call('HSET', bk(id), 'of', ARGV[6], 'sealed', '0', 'failed', '0', 'ca', NOWS,
      'nm', ARGV[3])
    redis.call('ZADD', B .. ':batches', id, id)
    A = {}
    for i = 1, #ARGV do A[i] = ARGV[i] end
    for i = 0, n - 1 do A[7 + i * 11 + 7] = batch end
  end
  -- Core checked every job, and the batch is new and open: no check below fails.
  out = enqueue_jobs(A, 7, n)
  if out.err then return out end
  if batch ~= '' then
    redis.call('HSET', bk(batch), 'sealed', '1')
    event('f')
  end
  event('r')
end
if slot ~= '' then
  redis.call('HSET', k, 'm', slot)
  if n > 0 then
    local first = ''
    for i = 1, #out, 2 do
      if out[i + 1] == 0 then first = s(out[i]) break end
    end
    redis.call('HSET', k, 'ls', slot, 'lj', first, 'lb', batch)
  end
end
publish()
local reply = {'made', batch}
for i = 1, #out do reply[#reply + 1] = out[i] end
return reply
