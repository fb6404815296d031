-- relayq's shared Lua: the helpers of every operation. Loaded with the operations as
-- one Redis Functions library, each operation a function whose body starts with
-- `begin(KEYS, ARGV)`; where functions are unavailable, put in front of each
-- operation's script, with the same call to `begin` between them (see scripts.rs).
--
-- KEYS[1] is the queue's base key, `<prefix>:{<queue>}`: every key below starts with it,
-- so a script touches one hash slot (Redis Cluster). ARGV[1] is the event channel,
-- ARGV[2] the queue name; an operation's own arguments start at ARGV[3].
--
-- Keys (B = KEYS[1]):
--   B:seq            job id counter          B:bseq          batch id counter
--   B:job:<id>       job hash                B:job:<id>:log  attempt log (JSON per attempt)
--   B:ready          claimable jobs: score = priority, member = order key (run_at, id)
--                    as 18 + 19 zero-padded digits,
--                    so equal priorities sort by run_at then id (SPEC C3), exactly
--   B:delay          ready jobs not yet due: score = run_at (microseconds)
--   B:backoff        retrying jobs not yet due: score = run_at
--   B:running        running jobs: score = lease expiry
--   B:done           finished jobs but plain completions: score = finished_at
--   B:dead           dead jobs by id
--   B:donelist       plain completions (see complete_plain, complete_kept), in
--                    finishing order: their
--                    index for pruning, a list because appending costs less than a
--                    sorted-set insert
--   B:stats          count per state                       B:settings  paused, max
--   B:dedupe         dedupe key -> unfinished job id
--   B:g:<group>      the group's unfinished jobs by order key; B:gh:<group> its holder
--   B:workers        worker name -> its last beat;  B:wseen  worker name by its time
--   B:b:<id>         batch hash; B:b:<id>:live unfinished jobs by stage;
--                    B:b:<id>:jobs all its job ids;  B:batches  batch ids
--   B:krun           limit key -> its running jobs (SPEC K2)
--   B:klim           limit key -> its own limit; B:settings kl the default, keyed set
--                    while the queue has any key limit
--   B:kp:<key>       the key's parked jobs, as B:ready holds them (SPEC K4);
--                    B:kpk  the keys with parked jobs
--   B:kw:<key>       the key's jobs in B:ready, as B:ready holds them: an enqueue
--                    counts those ahead of a new job (see enqueue_jobs)
--   B:krate          limit key -> its own rate as 'count,interval,burst' (SPEC K12);
--                    B:settings krn krp krb the default, kr set while any key has a
--                    rate (and keyed with it)
--   B:ktat           limit key -> when its rate's next start is due (kit::rate)
--   B:kwake          keys whose jobs a claim parked for their rate: score = when they
--                    go back (SPEC K13)
--   B:dep:<id>       the unfinished jobs that run after unfinished job <id> (SPEC D),
--                    deleted when it finishes
--
-- Job hash fields: st state, p payload, pr priority, ra run_at, ma max attempts,
-- at attempts, g group, gm group member key, b batch, s stage, dk dedupe key,
-- by enqueued_by, lk limit key, ca created, fa finished, le last error, ls the running attempt's
-- lease (see lease_value), w worker, sa started; lo and out: the outcome and output of
-- a last attempt kept in the hash rather than the log list (see complete_plain); pg the
-- last progress reported, as the core's text (SPEC L7); wt how long a plainly
-- completed job waited in its worker before its handler started (see complete_plain);
-- f the fields a claim returns that never change, in one value (see fixed_fields);
-- aft the jobs it runs after (ids joined by ','), dl how many of them are unfinished,
-- af 'run' when it runs even after one failed (SPEC D). A batch hash's af is its policy. Jobs
-- stored by earlier versions may lack f and hold a lease as tk (token) and ex
-- (expiry); claim, settle and heartbeat still read those.
--
-- Times are integer microseconds from TIME, the server's clock. Numbers are written
-- with string.format('%d'): Lua's own number-to-string keeps only 14 digits.

-- The call's state, set by `begin` at the start of every call. The helpers below are
-- defined once per library load (Redis Functions) and read these as upvalues: a call
-- that re-defined them all would pay about 4 µs before its first command (Findings 32
-- in docs/BENCHMARKS.md). Redis runs one call at a time, and `begin` resets all of it.
local B, CHANNEL, QUEUE
-- The server's clock in microseconds, and as written to keys and fields.
local NOW, NOWS
local EVENTS
-- Per-state count changes, written once per state when the call ends: one HINCRBY
-- per state and call instead of two per job.
local STATS

local function begin(keys, argv)
  B, CHANNEL, QUEUE = keys[1], argv[1], argv[2]
  local clock = redis.call('TIME')
  NOW = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  NOWS = string.format('%d', NOW)
  EVENTS, STATS = {}, {}
end

local function s(n) return string.format('%d', n) end
-- Ids may arrive as numbers: `..` would write large ones as 1.2e+14, so format them.
local function str(v) return type(v) == 'number' and s(v) or v end
local function jk(id) return B .. ':job:' .. str(id) end
local function gk(g) return B .. ':g:' .. g end
local function ghk(g) return B .. ':gh:' .. g end
local function bk(b) return B .. ':b:' .. str(b) end
-- 18 digits of run_at cover every time validation allows (up to year 9999).
local function okey(ra, id) return string.format('%018d%019d', math.max(ra, 0), id) end
local function id_of(member) return tonumber(string.sub(member, 19)) end
local function get(id, f) return redis.call('HGET', jk(id), f) end
local function num(id, f) return tonumber(redis.call('HGET', jk(id), f)) end

-- A job's fields that never change and that a claim returns, as one value: priority,
-- max attempts, group, batch, stage, enqueued_by, each '' when absent, then 'p' for a
-- plain job (no group, batch or dedupe key: nothing waits for its end) or '', joined
-- by NUL (no label holds one). A claim then reads and returns one value for seven, and
-- learns from its last byte which lease kind to write (see lease_value).
local function fixed_fields(pr, ma, g, b, st, by, dk, lk)
  local plain = (g or '') == '' and (b or '') == '' and (dk or '') == '' and (lk or '') == ''
  return table.concat({pr, ma, g or '', b or '', st or '', by or '', plain and 'p' or ''},
    '\0')
end

-- A running attempt's lease, in one hash field (`ls`) so that a settle reads one field,
-- not three: the kind ('p' for a plain job, whose completion needs no other field, or
-- 'k'), the token (36 characters: a UUID as the client writes it), then the expiry.
-- Written by the claim, its expiry rewritten by a heartbeat, blanked by a plain
-- completion, deleted by clear_lease: a job holds one only while it runs, so a lease
-- check need not read the job's state.
local function lease_value(kind, token, ex) return kind .. token .. ex end
local function lease_token(ls) return string.sub(ls, 2, 37) end
local function lease_expiry(ls) return string.sub(ls, 38) end

-- Whether job `id` is running under `token`, expired or not (SPEC B8, L7).
local function holds(id, token)
  local ls = get(id, 'ls')
  -- A blank lease is a plainly completed job's.
  if ls then return lease_token(ls) == token end
  local h = redis.call('HMGET', jk(id), 'st', 'tk')
  return h[1] == 'running' and h[2] == token
end

local function stat(state, n) STATS[state] = (STATS[state] or 0) + n end

local function event(kind) EVENTS[kind .. ':' .. QUEUE] = true end

-- Ends every writing script: stores the count changes and sends the events.
local function publish()
  for state, n in pairs(STATS) do
    if n ~= 0 then
      local v = redis.call('HINCRBY', B .. ':stats', state, n)
      if v <= 0 then redis.call('HDEL', B .. ':stats', state) end
    end
  end
  STATS = {}
  for msg in pairs(EVENTS) do redis.call('PUBLISH', CHANNEL, msg) end
end

local function kpk(lk) return B .. ':kp:' .. lk end
local function kwk(lk) return B .. ':kw:' .. lk end

-- SPEC K4: an enqueue parks a new due job of a key whose limit is at most this when
-- this many of the key's jobs sort ahead of it in B:ready. Each of those puts one
-- parked job of the key back when it leaves B:ready or, claimed, leaves running (see
-- unindex), so a job parked then always has something to put it back, and claims
-- never read a long backlog of one key. A key with fewer is left to the claim's
-- parking, which a short backlog costs little: parking every job beyond the limit
-- would send each through a settle's unpark. Jobs not yet due are not counted (they
-- are not in B:ready): one of them ahead would hold a due job back.
local PARK_AHEAD = 64

-- Whether the last of the PARK_AHEAD members of key `lk`'s index ahead of a new job is
-- still in B:ready, so at least one job ahead will put the new one back. An earlier
-- version's scripts running on the same server (scripts.rs) take members out of
-- B:ready without this index: such a member is dropped here, and the job not parked.
local function ahead_is_ready(lk)
  local m = redis.call('ZRANGE', kwk(lk), PARK_AHEAD - 1, PARK_AHEAD - 1)[1]
  if redis.call('ZSCORE', B .. ':ready', m) then return true end
  redis.call('ZREM', kwk(lk), m)
  return false
end

-- Job member `m` (score `pr`, limit key `lk` or nil) goes into B:ready.
local function ready_add(pr, m, lk)
  redis.call('ZADD', B .. ':ready', pr, m)
  if lk then redis.call('ZADD', kwk(lk), pr, m) end
end

-- Job member `m` (limit key `lk` or nil) leaves B:ready; returns whether it was there.
local function ready_rem(m, lk)
  if lk then redis.call('ZREM', kwk(lk), m) end
  return redis.call('ZREM', B .. ':ready', m) == 1
end

-- Parks job member `m` (as B:ready holds it, score `pr`) of key `lk`, whose key is full
-- (SPEC K4): it leaves B:ready until a slot of its key frees.
local function park(m, pr, lk)
  ready_rem(m, lk)
  redis.call('ZADD', kpk(lk), pr, m)
  redis.call('SADD', B .. ':kpk', lk)
end

-- Moves up to `n` (all when nil) of key `lk`'s parked jobs, earliest first, back
-- into B:ready.
local function unpark(lk, n)
  local k = kpk(lk)
  local got = redis.call('ZRANGE', k, 0, (n or 0) - 1, 'WITHSCORES')
  for i = 1, #got, 2 do
    redis.call('ZREM', k, got[i])
    ready_add(got[i + 1], got[i], lk)
  end
  if #got > 0 then event('r') end
  if redis.call('EXISTS', k) == 0 then redis.call('SREM', B .. ':kpk', lk) end
end

-- A job of key `lk` left running: one slot of the key frees, and its earliest parked
-- job goes back to B:ready, in the same script (SPEC K2, K4).
local function key_freed(lk)
  if redis.call('HINCRBY', B .. ':krun', lk, -1) <= 0 then redis.call('HDEL', B .. ':krun', lk) end
  unpark(lk, 1)
end

-- A stored rate 'count,interval,burst' (or three values) as {e = emission interval,
-- b = burst}, as relayq_core::Rate::emission_us computes it; nil for none.
local function rate_of(n, p, b)
  if not n or n == '' then return nil end
  n, p, b = tonumber(n), tonumber(p), tonumber(b or '1')
  local spaced = n - b + 1
  return {e = math.max(1, math.floor((p + spaced - 1) / spaced)), b = b}
end

-- The rate of key `lk`: its own, else `default`.
local function key_rate(lk, default)
  local own = redis.call('HGET', B .. ':krate', lk)
  if own then
    local n, p, b = string.match(own, '^(%d+),(%d+),(%d+)$')
    return rate_of(n, p, b)
  end
  return default
end

-- When a rate `r` whose next start is due at `tat` allows a start: now, or later.
local function next_start(r, tat)
  if not tat then return NOW end
  return math.max(NOW, tat - (r.b - 1) * r.e)
end

-- SPEC K2, K4, K6, K12: the members of B:ready a claim of a queue with key limits or
-- key rates takes, up to `limit`, removed from B:ready; the first `slots` start at
-- once. A job whose key is full, or whose key's rate allows no start now, is parked;
-- one that would take its key's last slot ahead of `slots` is left. Reads B:ready's
-- head again past what it parked, a bounded number of times. `rated` is nil without
-- key rates, else {default = the default key rate or nil}. Returns the members, and
-- per rated key met: its rate, its value after the claim, whether the claim moved
-- it, when a key the rate held may start again, and whether the key was full.
local function keyed_head(limit, slots, default, rated)
  local taken, limits, counts = {}, {}, {}
  local rates, tats, moved, wakes, full = {}, {}, {}, {}, {}
  local scan = 2 * limit + 256
  for _ = 1, 8 do
    local got = redis.call('ZRANGE', B .. ':ready', 0, scan - 1, 'WITHSCORES')
    local parked = 0
    for i = 1, #got, 2 do
      if #taken >= limit then break end
      local m = got[i]
      local lk = redis.call('HGET', jk(id_of(m)), 'lk')
      local take = true
      if lk then
        if limits[lk] == nil then
          local own = redis.call('HGET', B .. ':klim', lk)
          limits[lk] = (own and tonumber(own)) or default or false
          counts[lk] = tonumber(redis.call('HGET', B .. ':krun', lk) or '0')
          if rated then
            rates[lk] = key_rate(lk, rated.default) or false
            tats[lk] = tonumber(redis.call('HGET', B .. ':ktat', lk) or '')
          end
        end
        local max, r = limits[lk], rates[lk]
        if max and counts[lk] >= max then
          park(m, got[i + 1], lk)
          parked = parked + 1
          take = false
          full[lk] = true
        elseif max and #taken >= slots and counts[lk] + 1 >= max then
          take = false
        elseif r then
          -- The generic cell rate algorithm for one start (kit::rate).
          local base = math.max(tats[lk] or NOW, NOW)
          if NOW + r.b * r.e - base < r.e then
            park(m, got[i + 1], lk)
            parked = parked + 1
            take = false
            wakes[lk] = next_start(r, tats[lk])
          else
            tats[lk] = base + r.e
            moved[lk] = true
          end
        end
      end
      if take then
        taken[#taken + 1] = m
        ready_rem(m, lk)
        if lk then counts[lk] = counts[lk] + 1 end
      end
    end
    if #taken >= limit or #got < 2 * scan or parked == 0 then break end
  end
  return taken, {rates = rates, tats = tats, moved = moved, wakes = wakes, full = full}
end

-- Takes the job out of the index of its current state `st` (its run_at is `ra`, its
-- limit key `lk`, read here when not given).
local function unindex(id, st, ra, lk)
  if st == 'ready' or st == 'retrying' or st == 'running' then
    if lk == nil then lk = get(id, 'lk') end
  end
  if st == 'ready' or st == 'retrying' then
    redis.call('ZREM', B .. ':delay', id)
    redis.call('ZREM', B .. ':backoff', id)
    ready_rem(okey(tonumber(ra), id), lk or nil)
    -- An unparked job may hold its key's wake-up (a slot freed for it): leaving
    -- without being claimed, it passes it on to the next parked job of its key.
    if lk and redis.call('ZREM', kpk(lk), okey(tonumber(ra), id)) == 0 then unpark(lk, 1) end
  elseif st == 'running' then
    redis.call('ZREM', B .. ':running', id)
    if lk then key_freed(lk) end
  end
end

-- Puts the job into the index of its (new) state.
local function index(id)
  local h = redis.call('HMGET', jk(id), 'st', 'pr', 'ra', 'lk')
  local st, ra = h[1], tonumber(h[3])
  if st == 'ready' or st == 'retrying' then
    if ra > NOW then
      redis.call('ZADD', B .. (st == 'ready' and ':delay' or ':backoff'), s(ra), id)
    else
      ready_add(h[2], okey(ra, id), h[4] or nil)
      event('r')
    end
  end
end

-- Moves job `id` to state `st`, setting the extra fields {f1, v1, ...} with it.
local function set_state(id, st, extra)
  local h = redis.call('HMGET', jk(id), 'st', 'ra', 'lk')
  local old = h[1]
  unindex(id, old, h[2], h[3])
  if old then stat(old, -1) end
  stat(st, 1)
  local fields = {'st', st}
  for _, v in ipairs(extra or {}) do fields[#fields + 1] = v end
  redis.call('HSET', jk(id), unpack(fields))
  -- Finished and blocked jobs are in no index; only a claim makes a job running.
  if st == 'ready' or st == 'retrying' then index(id) end
end

local function clear_lease(id) redis.call('HDEL', jk(id), 'ls', 'tk', 'ex') end

-- Re-keys a grouped job in its group by its current run_at (after a retry moved it),
-- so its place is its order key (priority, run_at, id), as everywhere else.
local function regroup(id)
  local h = redis.call('HMGET', jk(id), 'g', 'gm', 'pr', 'ra')
  if not h[1] then return end
  local gm = okey(tonumber(h[4]), id)
  if gm == h[2] then return end
  redis.call('ZREM', gk(h[1]), h[2])
  redis.call('ZADD', gk(h[1]), h[3], gm)
  redis.call('HSET', jk(id), 'gm', gm)
end

-- Closes attempt `attempt` of job `id` in the log (SPEC L5). `ran` is the job's
-- {worker, claimed} when the caller read them already. The attempt starts at its
-- claim plus `waited`, its wait in the worker (microseconds, or nil), never past now;
-- `c` keeps the claim.
local function log(id, attempt, outcome, err, output, ran, waited)
  local h = ran or redis.call('HMGET', jk(id), 'w', 'sa')
  local start = h[2]
  if start and waited then start = s(math.min(tonumber(start) + tonumber(waited), NOW)) end
  local entry = {a = attempt, w = h[1] or '', s = start or s(NOW), e = s(NOW), o = outcome,
    c = h[2] or nil}
  if err then entry.x = err end
  if output then entry.out = output end
  redis.call('RPUSH', jk(id) .. ':log', cjson.encode(entry))
end

-- The batch's lowest unfinished stage, or nil.
local function floor(b)
  local r = redis.call('ZRANGE', bk(b) .. ':live', 0, 0, 'WITHSCORES')
  if #r == 0 then return nil end
  return tonumber(r[2])
end

local function stage_released(id)
  local b = get(id, 'b')
  if not b then return true end
  local f = floor(b)
  return f == nil or num(id, 's') <= f
end

-- Whether job `id` waits for jobs it runs after (SPEC D2).
local function waits(id) return (num(id, 'dl') or 0) > 0 end

-- Makes the group's holder right (SPEC G1, G2, G4, D3): a running or retrying holder
-- stays; otherwise the earliest job of the group whose stage is released and that
-- waits for no job it runs after is the one ready job, and every other job of the
-- group is blocked.
local function settle_group(g)
  local holder = redis.call('GET', ghk(g))
  if holder then
    local st = get(holder, 'st')
    if st == 'running' or st == 'retrying' then return end
  end
  -- The earliest job whose stage is released, read a page at a time: usually the
  -- first member is it, so the first page is small (a page of 100 took about a third
  -- of a grouped completion's time), and pages grow from there.
  local head, from, size = nil, 0, 4
  while head == nil do
    local page = redis.call('ZRANGE', gk(g), from, from + size - 1)
    if #page == 0 then break end
    for _, m in ipairs(page) do
      local id = id_of(m)
      if stage_released(id) and not waits(id) then head = id; break end
    end
    from = from + size
    size = math.min(size * 4, 256)
  end
  if holder and head and tonumber(holder) == head then return end
  if holder then
    set_state(tonumber(holder), 'blocked')
    redis.call('DEL', ghk(g))
  end
  if head then
    redis.call('SET', ghk(g), s(head))
    set_state(head, 'ready')
  end
end

-- Releases the batch's lowest unfinished stage (SPEC B2).
local function release_stage(b)
  local f = floor(b)
  if f == nil then return end
  local rel = tonumber(redis.call('HGET', bk(b), 'rel'))
  if rel == nil or rel < f then redis.call('HSET', bk(b), 'rel', s(f)) end
  local groups = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', bk(b) .. ':live', f, f)) do
    id = tonumber(id)
    if get(id, 'st') == 'blocked' then
      local g = get(id, 'g')
      if g then groups[g] = true elseif not waits(id) then set_state(id, 'ready') end
    end
  end
  for g in pairs(groups) do settle_group(g) end
end

local finish

-- A blocked job with no job left to wait for (SPEC D2): its group's turn decides, else
-- its stage.
local function free(id)
  local g = get(id, 'g')
  if g then settle_group(g) elseif stage_released(id) then set_state(id, 'ready') end
end

-- SPEC D2, D4: job `id` of a batch finished as `st`. Each blocked job that runs after
-- it counts it off and is freed at 0; when it failed, one that keeps the Cancel policy
-- is cancelled instead, and so on down the graph: a work list, not recursion, so a
-- chain of any length fits Lua's call depth. The error text is
-- relayq_core::cancelled_by::after's, word for word (a test in scripts.rs checks).
local function parent_done(id, st)
  local work = {{id, st}}
  while #work > 0 do
    local p = table.remove(work)
    local dk = B .. ':dep:' .. str(p[1])
    local children = redis.call('SMEMBERS', dk)
    if #children > 0 then
      redis.call('DEL', dk)
      local failed = p[2] == 'dead' or p[2] == 'cancelled'
      for _, c in ipairs(children) do
        c = tonumber(c)
        if get(c, 'st') == 'blocked' then
          if failed and get(c, 'af') ~= 'run' then
            finish(c, 'cancelled', 'cancelled: job ' .. str(p[1]) ..
              ', which it runs after, ended ' .. p[2], true)
            work[#work + 1] = {c, 'cancelled'}
          elseif redis.call('HINCRBY', jk(c), 'dl', -1) == 0 then
            free(c)
          end
        end
      end
    end
  end
end

-- SPEC B6, B8: a dead job of a Halt batch fails it and cancels every other unfinished
-- job: later stages (not started) and its own stage's, running ones included (their
-- attempts logged as cancelled, their workers told through 'c').
local function halt(b, stage)
  if redis.call('HGET', bk(b), 'of') ~= 'halt' then return end
  redis.call('HSET', bk(b), 'failed', '1')
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', bk(b) .. ':live', s(stage), '+inf')) do
    id = tonumber(id)
    local st = get(id, 'st')
    if st == 'running' then
      -- relayq_core::cancelled_by::HALT, word for word (a test in scripts.rs checks).
      log(id, num(id, 'at'), 'cancelled', 'cancelled while running: a job of its batch died, halting it')
      event('c')
    end
    if st == 'ready' or st == 'blocked' or st == 'running' or st == 'retrying' then
      finish(id, 'cancelled')
    end
  end
end

-- Finishes job `id` as `st` (succeeded, dead, cancelled) and releases what waited for
-- it: its dedupe key, its group's next job, its batch's next stage, the jobs that run
-- after it (but with `nodeps`, whose caller sees to those).
finish = function(id, st, err, nodeps)
  local h = redis.call('HMGET', jk(id), 'g', 'b', 's', 'dk', 'gm')
  local extra = {'fa', s(NOW)}
  if err then extra[3], extra[4] = 'le', err end
  set_state(id, st, extra)
  clear_lease(id)
  redis.call('ZADD', B .. ':done', s(NOW), id)
  if st == 'dead' then redis.call('ZADD', B .. ':dead', id, id) end
  if h[4] and redis.call('HGET', B .. ':dedupe', h[4]) == s(id) then
    redis.call('HDEL', B .. ':dedupe', h[4])
  end
  if h[1] then
    redis.call('ZREM', gk(h[1]), h[5])
    if redis.call('GET', ghk(h[1])) == s(id) then redis.call('DEL', ghk(h[1])) end
  end
  if h[2] then
    redis.call('ZREM', bk(h[2]) .. ':live', id)
    event('f')
    if st == 'dead' then halt(h[2], tonumber(h[3])) end
    -- The next stage can only open when this job's stage just emptied; a halted
    -- batch opens nothing more (its released stage stays where it stopped).
    if redis.call('ZCOUNT', bk(h[2]) .. ':live', h[3], h[3]) == 0
        and redis.call('HGET', bk(h[2]), 'failed') ~= '1' then
      release_stage(h[2])
    end
  end
  if h[1] then settle_group(h[1]) end
  if h[2] and not nodeps then parent_done(id, st) end
end

-- finish(id, 'succeeded') for a running job with no group, batch or dedupe key, the
-- hot path of a drain: nothing waits for such a job, so finishing it touches only its
-- hash and two indexes (complete_kept adds a group's or batch's bookkeeping). The
-- attempt's log record stays in the hash (worker `w`, started `sa`, ended `fa`, outcome
-- `lo`, output `out`) instead of a JSON entry in the log list; readers append it to the
-- list's entries. The lease is blanked in the same write rather than deleted (one
-- call, not two), so a kept job holds none of its 53 bytes, and a blank lease holds no
-- token. (A lease from an earlier version, `tk` and `ex`, stays behind: it is read only
-- when `ls` is absent, never after this.) `id` is the decimal id as given, `k` its
-- hash's key. The index changes and state counts are collected in `done` and made
-- by `flush_completed`, one call for many: out of the running index, onto the end of
-- B:donelist.
local function complete_plain(k, id, output, done, waited)
  -- `wt`: how long the job waited in its worker before its handler started (SPEC L5),
  -- in the same write; readers start the attempt at `sa` plus it.
  if output and waited then
    redis.call('HSET', k, 'st', 'succeeded', 'fa', NOWS, 'lo', 'succeeded', 'ls', '',
      'wt', waited, 'out', output)
  elseif output then
    redis.call('HSET', k, 'st', 'succeeded', 'fa', NOWS, 'lo', 'succeeded', 'ls', '',
      'out', output)
  elseif waited then
    redis.call('HSET', k, 'st', 'succeeded', 'fa', NOWS, 'lo', 'succeeded', 'ls', '',
      'wt', waited)
  else
    redis.call('HSET', k, 'st', 'succeeded', 'fa', NOWS, 'lo', 'succeeded', 'ls', '')
  end
  done[#done + 1] = id
end

-- finish(id, 'succeeded') for a running job of group `g` and/or batch `b` with no
-- dedupe key: complete_plain, then what finishing it releases, in finish's order: the
-- group's membership and hold, the batch's next stage, the group's next holder. Its
-- batch keeps it in B:b:<b>:jobs; the pruning of B:donelist removes it from there.
local function complete_kept(k, id, g, b, output, done, waited)
  complete_plain(k, id, output, done, waited)
  if g then
    redis.call('ZREM', gk(g), get(id, 'gm'))
    if redis.call('GET', ghk(g)) == id then redis.call('DEL', ghk(g)) end
  end
  if b then
    local live = bk(b) .. ':live'
    local stage = redis.call('ZSCORE', live, id)
    redis.call('ZREM', live, id)
    event('f')
    if redis.call('ZCOUNT', live, stage, stage) == 0
        and redis.call('HGET', bk(b), 'failed') ~= '1' then
      release_stage(b)
    end
  end
  if g then settle_group(g) end
  if b then parent_done(id, 'succeeded') end
end

local function flush_completed(done)
  if #done == 0 then return end
  stat('running', -#done)
  stat('succeeded', #done)
  redis.call('ZREM', B .. ':running', unpack(done))
  redis.call('RPUSH', B .. ':donelist', unpack(done))
end

-- SPEC C5: a running job whose lease expired retries in place (keeping its group and
-- stage) or, without attempts left, is dead. Returns true when it was requeued.
-- Returns true when the job retries, false when it is dead, nil when it no longer runs:
-- a job dead earlier in the same pass may have halted its batch, cancelling this one,
-- which stays cancelled (SPEC B6).
local function expire(id)
  if get(id, 'st') ~= 'running' then return nil end
  local at, ma = num(id, 'at'), num(id, 'ma')
  log(id, at, 'expired', 'lease expired')
  clear_lease(id)
  if at < ma then
    set_state(id, 'retrying', {'le', 'lease expired'})
    return true
  end
  finish(id, 'dead', 'lease expired')
  return false
end

-- SPEC E: stores `n` jobs of 11 fields each, the first field of job i (from 0) at
-- A[o0 + i * 11 + 1]: payload, priority, run_at (absolute, or ''), delay (microseconds,
-- or ''), max_attempts, group, batch, stage, dedupe key, enqueued_by, limit key ('' =
-- none for the optional ones). Then, optionally, the jobs that run after others (SPEC
-- D): their count m, and per such job its index in the call (from 0), its policy ('' for
-- its batch's, 'cancel' or 'run'), its count k of parents and k parents, each 'j' and a
-- stored job's id or 'c' and the index of a job of the call. Returns id, deduplicated
-- (0/1) per job, or an error reply before any write. The caller adds the 'r' event and
-- publishes.
local function enqueue_jobs(A, o0, n)
  local F = 11
  local deps, d = {}, o0 + n * F + 1
  for _ = 1, tonumber(A[d] or '0') do
    local i, k = tonumber(A[d + 1]), tonumber(A[d + 3])
    local refs = {}
    for r = 1, k do
      local ref = A[d + 3 + r]
      refs[r] = {call = string.sub(ref, 1, 1) == 'c', n = tonumber(string.sub(ref, 2))}
    end
    deps[i] = {policy = A[d + 2], refs = refs}
    d = d + 3 + k
  end
  -- Every check before the first write: a script that fails after writing keeps what
  -- it wrote (SPEC E4, B3). Each batch is read once: `rel[b]` is its released stage, or
  -- false before any.
  local rel = {}
  for i = 0, n - 1 do
    local o = o0 + i * F
    local b = A[o + 7]
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
    if b ~= '' and rel[b] and tonumber(A[o + 8]) < rel[b] then
      return redis.error_reply('RELAYQ_STAGE_CLOSED ' .. A[o + 8] .. ' ' .. s(rel[b]))
    end
    -- SPEC D5: a stored parent is a job of the same batch at no higher stage.
    for _, r in ipairs(deps[i] and deps[i].refs or {}) do
      if not r.call then
        local id = s(r.n)
        local h = redis.call('HMGET', jk(id), 'ca', 'b', 's')
        local why
        if not h[1] then
          why = 'job ' .. id .. ' is unknown in this queue'
        elseif h[2] ~= b then
          why = 'job ' .. id .. ' is not in batch ' .. b
        elseif tonumber(h[3]) > tonumber(A[o + 8]) then
          why = 'job ' .. id .. ' is in stage ' .. h[3] .. ', above stage ' .. A[o + 8] ..
            ' of the job that runs after it'
        end
        if why then return redis.error_reply('RELAYQ_INVALID after ' .. why) end
      end
    end
  end
  local out, groups, batches = {}, {}, {}
  local function add(t, f, v) t[#t + 1], t[#t + 2] = f, v end
  -- Per limit key met: the limit under which a new job may be parked here, or false.
  local keyed, parks = redis.call('HMGET', B .. ':settings', 'keyed', 'kl'), {}
  local function parks_at(lk)
    if parks[lk] == nil then
      local max = keyed[1] and tonumber(redis.call('HGET', B .. ':klim', lk) or keyed[2] or '')
      parks[lk] = (max and max <= PARK_AHEAD) or false
    end
    return parks[lk]
  end
  for i = 0, n - 1 do
    local o = o0 + i * F
    local g, b, dk, by, lk = A[o + 6], A[o + 7], A[o + 9], A[o + 10], A[o + 11]
    local held = dk ~= '' and redis.call('HGET', B .. ':dedupe', dk)
    if held then
      out[#out + 1] = tonumber(held)
      out[#out + 1] = 1
    else
      local id = redis.call('INCR', B .. ':seq')
      local ra = A[o + 3] ~= '' and tonumber(A[o + 3]) or NOW + tonumber(A[o + 4])
      -- A job without a group is ready at once when it has no batch or joins its batch's
      -- released stage: nothing below that stage is unfinished (SPEC B3 turns lower ones
      -- away). Other jobs with a group or a batch start blocked; promotion below decides.
      -- A job that runs after others starts blocked (SPEC D2); the pass below decides.
      local ready = g == '' and (b == '' or (rel[b] and tonumber(A[o + 8]) <= rel[b]))
        and not deps[i]
      local fields = {'p', A[o + 1], 'pr', A[o + 2], 'ra', s(ra), 'ma', A[o + 5],
        'at', '0', 'ca', s(NOW), 'f', fixed_fields(A[o + 2], A[o + 5], g, b,
          b ~= '' and A[o + 8] or '', by, dk, lk), 'st', ready and 'ready' or 'blocked'}
      if by ~= '' then add(fields, 'by', by) end
      if lk ~= '' then add(fields, 'lk', lk) end
      if dk ~= '' then
        add(fields, 'dk', dk)
        redis.call('HSET', B .. ':dedupe', dk, s(id))
      end
      if g ~= '' then
        local gm = okey(ra, id)
        add(fields, 'g', g)
        add(fields, 'gm', gm)
        redis.call('ZADD', gk(g), A[o + 2], gm)
        groups[g] = true
      end
      if b ~= '' then
        add(fields, 'b', b)
        add(fields, 's', A[o + 8])
        redis.call('ZADD', bk(b) .. ':live', A[o + 8], id)
        redis.call('SADD', bk(b) .. ':jobs', id)
        batches[b] = true
      end
      redis.call('HSET', jk(id), unpack(fields))
      if ready then
        stat('ready', 1)
        if ra > NOW then
          redis.call('ZADD', B .. ':delay', s(ra), id)
        elseif lk ~= '' and parks_at(lk) then
          -- SPEC K4: parked at once behind PARK_AHEAD of its key's jobs in B:ready.
          local m = okey(ra, id)
          redis.call('ZADD', kwk(lk), A[o + 2], m)
          if redis.call('ZRANK', kwk(lk), m) >= PARK_AHEAD and ahead_is_ready(lk) then
            redis.call('ZREM', kwk(lk), m)
            redis.call('ZADD', kpk(lk), A[o + 2], m)
            redis.call('SADD', B .. ':kpk', lk)
          else
            redis.call('ZADD', B .. ':ready', A[o + 2], m)
          end
        else
          ready_add(A[o + 2], okey(ra, id), lk ~= '' and lk or nil)
        end
      else
        stat('blocked', 1)
      end
      out[#out + 1] = id
      out[#out + 1] = 0
    end
  end
  -- SPEC D: the call's edges, now that each job has its id. A parent still unfinished
  -- is counted and learns of the child; one that failed cancels a child that keeps the
  -- Cancel policy (down what already runs after that child); one that succeeded, or
  -- failed under Run, counts for nothing. Jobs left waiting for nothing are freed once
  -- all are stored.
  -- Every count is stored before the first cancel below: a cancel may empty a stage,
  -- and the release that follows readies the next stage's jobs that wait for nothing.
  local freed, cancels = {}, {}
  for i = 0, n - 1 do
    local dep = deps[i]
    if dep and out[2 * i + 2] == 0 then
      local id = out[2 * i + 1]
      local policy = dep.policy
      if policy == '' then
        policy = redis.call('HGET', bk(A[o0 + i * F + 7]), 'af') or 'cancel'
      end
      local left, failed, parents = 0, nil, {}
      for _, r in ipairs(dep.refs) do
        local p = r.call and out[2 * r.n + 1] or r.n
        parents[#parents + 1] = s(p)
        local pst = get(p, 'st')
        if pst == 'dead' or pst == 'cancelled' then
          if policy ~= 'run' and not failed then failed = {p, pst} end
        elseif pst ~= 'succeeded' then
          left = left + 1
          redis.call('SADD', B .. ':dep:' .. s(p), s(id))
        end
      end
      redis.call('HSET', jk(id), 'aft', table.concat(parents, ','), 'dl', s(left))
      if policy == 'run' then redis.call('HSET', jk(id), 'af', 'run') end
      if failed then
        cancels[#cancels + 1] = {id, failed}
      elseif left == 0 then
        freed[#freed + 1] = id
      end
    end
  end
  for _, c in ipairs(cancels) do
    -- Cancelled meanwhile, down the graph from an earlier one: it stays so.
    if get(c[1], 'st') == 'blocked' then
      finish(c[1], 'cancelled', 'cancelled: job ' .. s(c[2][1]) ..
        ', which it runs after, ended ' .. c[2][2])
    end
  end
  for _, id in ipairs(freed) do
    if get(id, 'st') == 'blocked' and not waits(id) then free(id) end
  end
  -- Only a batch whose floor is above its released stage (or that has none yet) has a
  -- stage to release. At the released stage, ungrouped jobs went in ready above and
  -- grouped ones are their groups' business, so its jobs are not read again.
  -- (A batch whose only new jobs were cancelled at once, SPEC D4, may have none left.)
  for b in pairs(batches) do
    local f = floor(b)
    if not rel[b] or (f and rel[b] < f) then release_stage(b) end
  end
  for g in pairs(groups) do settle_group(g) end
  return out
end
