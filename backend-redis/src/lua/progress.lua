-- SPEC L7: ARGV[3..] = id, token, progress triples. Stores each progress (the text the
-- core made) in its job's `pg` field while the job is running under that token;
-- returns the ids whose lease no longer holds.
local lost = {}
for i = 3, #ARGV, 3 do
  local id = ARGV[i]
  if holds(id, ARGV[i + 1]) then
    redis.call('HSET', jk(id), 'pg', ARGV[i + 2])
  else
    lost[#lost + 1] = id
  end
end
return lost
