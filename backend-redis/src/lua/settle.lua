-- SPEC L: ARGV[3] = n, then one record per lease: 'c', job id, token for a completion
-- without output (the common case, in three arguments); else 'x', job id, token, kind
-- (complete, fail, release), retry delay (microseconds, or ''), retry time (absolute,
-- or ''), error, output ('' = none, else '=' .. text). Each lease is judged on its own
-- token, one after another. Returns one verdict per lease: 'c', 'r', 'd', 't<run_at>'
-- or 's' (stale).

-- Every outcome but a plain completion, `kind`, of job `id` of group `g` (or nil); a
-- failure's delay, time and error are ARGV[o + 4] to ARGV[o + 6]. Returns the verdict.
local function settle_one(o, kind, id, g, output)
  local h = redis.call('HMGET', jk(id), 'at', 'ma', 'w', 'sa')
  local at, ma, ran = tonumber(h[1]), tonumber(h[2]), {h[3], h[4]}
  if kind == 'complete' then
    log(id, at, 'succeeded', nil, output, ran)
    finish(id, 'succeeded')
    return 'c'
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
    return 'r'
  end
  local err = ARGV[o + 6]
  log(id, at, 'failed', err, output, ran)
  local delay, when = ARGV[o + 4], ARGV[o + 5]
  if at < ma and (delay ~= '' or when ~= '') then
    local ra = when ~= '' and math.max(tonumber(when), NOW) or NOW + tonumber(delay)
    clear_lease(id)
    set_state(id, 'retrying', {'ra', s(ra), 'le', err})
    regroup(id)
    return 't' .. s(ra)
  end
  finish(id, 'dead', err)
  return 'd'
end

-- Whether the lease expiry `ex` (a field's text) is still ahead. Both are decimal
-- integers without sign or leading zeros, so texts of one length (16 digits until the
-- year 2286) compare as numbers do, in any locale: that spares the hot path a number
-- conversion.
local function live(ex)
  if #ex == #NOWS then return ex > NOWS end
  return tonumber(ex) > NOW
end

local n = tonumber(ARGV[3])
local out, done = {}, {}
local o = 3
for i = 1, n do
  local id, full = ARGV[o + 2], ARGV[o + 1] == 'x'
  -- Only what judges the lease and tells a plain completion (no dedupe key; a group's
  -- or batch's bookkeeping follows), the hot path; the other outcomes read the rest.
  local k = B .. ':job:' .. id
  local h = redis.call('HMGET', k, 'st', 'tk', 'ex', 'g', 'b', 'dk')
  if h[1] ~= 'running' or h[2] ~= ARGV[o + 3] or not live(h[3]) then
    out[i] = 's'
  elseif not full and not h[6] then
    if h[4] or h[5] then
      complete_kept(k, id, h[4], h[5], nil, done)
    else
      complete_plain(k, id, nil, done)
    end
    out[i] = 'c'
  elseif not full then
    -- A completion in three arguments of a job with a dedupe key.
    out[i] = settle_one(o + 1, 'complete', tonumber(id), h[4], nil)
  else
    local output = ARGV[o + 8] ~= '' and string.sub(ARGV[o + 8], 2) or nil
    if ARGV[o + 4] == 'complete' and not h[6] then
      if h[4] or h[5] then
        complete_kept(k, id, h[4], h[5], output, done)
      else
        complete_plain(k, id, output, done)
      end
      out[i] = 'c'
    else
      out[i] = settle_one(o + 1, ARGV[o + 4], tonumber(id), h[4], output)
    end
  end
  o = o + (full and 8 or 3)
end
flush_completed(done)
publish()
return out
