-- SPEC L: ARGV[3] = n, then one record per lease: 'c', job id, token for a completion
-- without output (the common case, in three arguments); 'w', the same and how long the
-- job waited in its worker before its handler started (microseconds); else 'x', job
-- id, token, kind (complete, fail, release), retry delay (microseconds, or ''), retry
-- time (absolute, or ''), error, output ('' = none, else '=' .. text), wait ('' =
-- none). Each lease is judged on its own token, one after another. Returns one verdict
-- per lease: 'c', 'r', 'd', 't<run_at>' or 's' (stale).

-- `waited` is the job's wait in its worker before its handler started (SPEC L5), or
-- nil: the log starts the attempt then and keeps its claim, `sa`, beside (a plain
-- completion keeps the wait in `wt` instead, see complete_plain).
local function settle_one(o, kind, id, g, output, waited)
  local h = redis.call('HMGET', jk(id), 'at', 'ma', 'w', 'sa', 'bu')
  local at, ma, ran = tonumber(h[1]), tonumber(h[2]), {h[3], h[4]}
  if kind == 'complete' then
    log(id, at, 'succeeded', nil, output, ran, waited)
    finish(id, 'succeeded')
    return 'c'
  elseif kind == 'release' then
    -- The attempt is not counted (SPEC L4), and a released job no longer holds its
    -- group: an earlier job whose stage was released meanwhile goes first (SPEC G2).
    log(id, at, 'released', nil, output, ran, waited)
    clear_lease(id)
    redis.call('HSET', jk(id), 'at', s(at - 1))
    -- Attempts spent before a dead retry (max attempts less the budget it grew by,
    -- SPEC M2) do not count: it came back ready.
    if at > 1 + ma - (tonumber(h[5]) or ma) then
      -- An earlier attempt counted: back to retrying, as before the claim, holding
      -- its group (its backoff moved it behind later jobs of the group, SPEC G2).
      set_state(id, 'retrying')
    elseif g then
      set_state(id, 'blocked')
      redis.call('DEL', ghk(g))
      settle_group(g)
    else
      set_state(id, 'ready')
    end
    return 'r'
  end
  local err = ARGV[o + 6]
  log(id, at, 'failed', err, output, ran, waited)
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

-- Whether the lease on job hash `k` is the running attempt's `token`, still ahead,
-- and whether the job is plain (see lease_value in lib.lua). A lease written before
-- `ls` existed is judged on its state, token and expiry fields, as then.
local function judge(k, token)
  local ls = redis.call('HGET', k, 'ls')
  if ls then
    -- A blank lease (a plainly completed job) holds no token.
    return lease_token(ls) == token and live(lease_expiry(ls)), string.byte(ls) == 112
  end
  local h = redis.call('HMGET', k, 'st', 'tk', 'ex')
  return h[1] == 'running' and h[2] == token and h[3] ~= false and live(h[3]), false
end

local n = tonumber(ARGV[3])
local out, done = {}, {}
local o = 3
for i = 1, n do
  local id, full, waits = ARGV[o + 2], ARGV[o + 1] == 'x', ARGV[o + 1] == 'w'
  local k = B .. ':job:' .. id
  local ok, plain = judge(k, ARGV[o + 3])
  local waited = (full and ARGV[o + 9]) or (waits and ARGV[o + 4]) or nil
  if waited == '' then waited = nil end
  if not ok then
    out[i] = 's'
  elseif plain and not full then
    -- The hot path: a plain job's completion without output reads nothing more.
    complete_plain(k, id, nil, done, waited)
    out[i] = 'c'
  else
    -- What a group's or batch's bookkeeping or a dedupe key needs (none for a plain
    -- job); the outcomes other than a completion read the rest in settle_one.
    local g, b, dk, lk
    if not plain then
      local h = redis.call('HMGET', k, 'g', 'b', 'dk', 'lk')
      g, b, dk, lk = h[1], h[2], h[3], h[4]
    end
    local kind, output = 'complete', nil
    if full then
      kind = ARGV[o + 4]
      output = ARGV[o + 8] ~= '' and string.sub(ARGV[o + 8], 2) or nil
    end
    -- A limit key's slot frees through finish (set_state), as every other way out of
    -- running does.
    if kind == 'complete' and not dk and not lk then
      if g or b then
        complete_kept(k, id, g, b, output, done, waited)
      else
        complete_plain(k, id, output, done, waited)
      end
      out[i] = 'c'
    else
      -- A record in three arguments is a completion: settle_one reads no failure
      -- arguments for it.
      out[i] = settle_one(o + 1, kind, tonumber(id), g, output, waited)
    end
  end
  o = o + (full and 9 or (waits and 4 or 3))
end
flush_completed(done)
publish()
return out
