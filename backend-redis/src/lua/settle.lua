-- SPEC L: ARGV[3] = n, then 7 fields per lease: job id, token, kind (complete, fail,
-- release), retry delay (microseconds, or ''), retry time (absolute, or ''), error,
-- output ('' = none, else '=' .. text). Each lease is judged on its own token, one after
-- another. Returns one verdict per lease: 'c', 'r', 'd', 't<run_at>' or 's' (stale).
local n = tonumber(ARGV[3])
local out, done = {}, {}
for i = 0, n - 1 do
  local o = 3 + i * 7
  local id = tonumber(ARGV[o + 1])
  local h = redis.call('HMGET', jk(id), 'st', 'tk', 'ex', 'at', 'ma', 'g', 'w', 'sa', 'b', 'dk')
  if h[1] ~= 'running' or h[2] ~= ARGV[o + 2] or tonumber(h[3]) <= NOW then
    out[#out + 1] = 's'
  else
    local kind, at, ma, g = ARGV[o + 3], tonumber(h[4]), tonumber(h[5]), h[6]
    local output = ARGV[o + 7] ~= '' and string.sub(ARGV[o + 7], 2) or nil
    local ran = {h[7], h[8]}
    if kind == 'complete' and not g and not h[9] and not h[10] then
      complete_plain(id, output, done)
      out[#out + 1] = 'c'
    elseif kind == 'complete' then
      log(id, at, 'succeeded', nil, output, ran)
      finish(id, 'succeeded')
      out[#out + 1] = 'c'
    elseif kind == 'release' then
      -- The attempt is not counted (SPEC L4), and a released job no longer holds its
      -- group: an earlier job whose stage was released meanwhile goes first (SPEC G2).
      log(id, at, 'released', nil, output, ran)
      clear_lease(id)
      redis.call('HSET', jk(id), 'at', s(at - 1))
      if g then
        set_state(id, 'blocked')
        redis.call('DEL', ghk(g))
        settle_group(g)
      else
        set_state(id, 'ready')
      end
      out[#out + 1] = 'r'
    else
      local err = ARGV[o + 6]
      log(id, at, 'failed', err, output, ran)
      local delay, when = ARGV[o + 4], ARGV[o + 5]
      if at < ma and (delay ~= '' or when ~= '') then
        local ra = when ~= '' and math.max(tonumber(when), NOW) or NOW + tonumber(delay)
        clear_lease(id)
        set_state(id, 'retrying', {'ra', s(ra), 'le', err})
        regroup(id)
        out[#out + 1] = 't' .. s(ra)
      else
        finish(id, 'dead', err)
        out[#out + 1] = 'd'
      end
    end
  end
end
flush_completed(done)
publish()
return out
