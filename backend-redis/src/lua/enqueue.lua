-- SPEC E: ARGV[3] = n, then 11 fields per job (see enqueue_jobs). Returns id,
-- deduplicated (0/1) per job.
local out = enqueue_jobs(ARGV, 3, tonumber(ARGV[3]))
if out.err then return out end
event('r')
publish()
return out
