--[[
  Per-tenant limits, included by add_jobs and release_held. Limits decide whether a
  tenant's next job may be taken; the fair clock decides which (fair_clock.lua places a
  job when it is released, as a new arrival of its flow).

  A tenant with limits (or paused) has its jobs *held*: in BullMQ's delayed set at a
  far-future score (the year 9999), so getJobCounts, getDelayed and bull-board show them
  as delayed, never as lost or failed, and no stock worker takes them (BullMQ promotes
  only delayed jobs whose time has come). release_held moves them to the prioritized set
  with their fair tags as the tenant gets room.

  Keys, all beside the queue's own (L is the queue's fq:lim key):
    L               hash: tenant -> "max_active\nrate_max\nrate_ms\nmax_waiting" (''
                    for no limit), as the tenant's latest enqueue resolved them
    L:paused        hash: tenant -> 1, set by pause_tenant
    L:catchup       hash: tenant -> 1, set by resume_tenant until its held jobs are out
    L:pchg          hash: tenant -> how many times pause_tenant or resume_tenant changed
                    L:paused, so a rebuild from the database tells a pause or resume
                    made while it read the rows (and then keeps it)
    L:tenants       set: tenants with held jobs or released ones not finished
    L:held:<t>      list: the tenant's held job ids, oldest first (released in this order)
    L:hrank:<t>     zset: the same ids scored in the list's order (fqRankTail, fqRankFront,
                    fqRankBefore; dropped as they leave it), so a held job's place is a
                    ZRANK, O(log n), not a walk of the list (job_status)
    L:out:<t>       set: its released jobs not finished yet (running, takeable, or about
                    to run again): the slots it occupies, checked against BullMQ's own
                    state at every release, so no counter can drift
    L:rate:<t>      zset: job id -> when it was released, within the rate window
    L:bucket:<t>    hash: tokens, at: the pacing bucket of its rate limit
    L:meta          hash: held or released job id -> "level\nweight\ncost ms"
    L:later:<t>     zset: its delayed jobs held until due, by due time (ms)
    L:resv:<t>      hash: batch token -> "jobs left:expiry ms", room a batch added over
                    several calls reserved (fqCheckWaiting)
    L:synced        set once the database's limits and pauses were brought here
    L:due           zset: tenant -> when the release step next visits it (ms): the
                    tenants that can move, so a call never walks every limited tenant
    L:owner         hash: released job id -> its tenant, so an event of the job (BullMQ's
                    events stream: it started, finished, failed, was removed) makes the
                    tenant due
    L:evpos         the last id of BullMQ's events stream the release step read
    L:evadded       the stream's entries-added when it was last found empty (Redis 7), so
                    entries after that are told from entries trimmed unread
    L:sweep         SSCAN cursor over L:tenants while a sweep makes every tenant due (the
                    first call, or events lost to the stream's trimming)
]]
--- @include wire
local fqHeldMs = {{HELD_MS}}
local fqHeldScore = fqHeldMs * 4096 -- BullMQ's delayed score: timestamp * 0x1000
-- Past every fair score: where BullMQ re-adds a job that runs again (its hash's priority
-- is the cap), counter added.
local fqRerunScore = {{CAP_SCORE}}
-- The backoff a released job of a held tenant carries (fairqueue.broker.common
-- .RETRY_HELD_MS): its failed attempts land in BullMQ's delayed set this far ahead.
local fqRetryHeldMs = {{RETRY_HELD_MS}}

-- Visit tenant t no later than `at` (ms; 0: at the next call): whatever can give a
-- tenant room or jobs to release marks it (a job held, a delayed one's due time, an event
-- of one of its released jobs, a rate window), so the release step's work follows what
-- can move, not how many tenants have limits.
local function fqDue(L, t, at)
  redis.call('ZADD', L .. ':due', 'LT', at, t)
end

-- A released job's entry in its tenant's rate log moves from its release time to when
-- its attempt started (BullMQ's processedOn, the worker's clock), once a worker took it:
-- the log counts starts. rateKey: L:rate:<t> (or an account's). An entry the window
-- trimmed while its job waited untaken comes back at its start (the start counts in the
-- window it falls in; the next trim drops it if that is past).
local function fqStamp(rateKey, jobKey, jobId)
  local started = tonumber(redis.call('HGET', jobKey, 'processedOn'))
  if started then redis.call('ZADD', rateKey, 'GT', started, jobId) end
end

--- @include account_limits

-- L:hrank:<t> keeps each held job's place in L:held:<t> as a score, ascending in the
-- list's order: appended ids count up by one from the last, an id pushed to the front
-- goes fqRankGap below the first, and one inserted before another (a pause's scan puts
-- the tenant's untracked jobs ahead of its held ones, in order) goes one above its
-- predecessor, or fqRankGap below it when it has none. Scores stay whole numbers far
-- inside a double's 2^53 (the key goes with its last job, and starts again from 0); when
-- two places run out of room between them the job shares its predecessor's score, and
-- its rank is off by the ties (ZRANK orders them by id), never by more. Every write is
-- O(log n).
local fqRankGap = 67108864 -- 2^26: room for that many jobs inserted before one place
local function fqRankTail(L, t, ids)
  if #ids == 0 then return end
  local key = L .. ':hrank:' .. t
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local at = tonumber(last[2]) or 0
  local args = {}
  for i, id in ipairs(ids) do
    args[#args + 1] = string.format('%.17g', at + i)
    args[#args + 1] = id
  end
  redis.call('ZADD', key, unpack(args))
end

local function fqRankFront(L, t, id)
  local key = L .. ':hrank:' .. t
  redis.call('ZREM', key, id)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local at = (tonumber(first[2]) or fqRankGap) - fqRankGap
  redis.call('ZADD', key, string.format('%.17g', at), id)
end

local function fqRankBefore(L, t, id, boundary)
  local key = L .. ':hrank:' .. t
  redis.call('ZREM', key, id)
  local limit = tonumber(redis.call('ZSCORE', key, boundary))
  if not limit then return fqRankTail(L, t, {id}) end
  local prev = redis.call('ZREVRANGEBYSCORE', key, '(' .. string.format('%.17g', limit), '-inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  local at = limit - fqRankGap
  if prev[2] then
    at = tonumber(prev[2]) + 1
    if at >= limit then at = tonumber(prev[2]) end
  end
  redis.call('ZADD', key, string.format('%.17g', at), id)
end

local function fqRankDrop(L, t, ids)
  if #ids > 0 then redis.call('ZREM', L .. ':hrank:' .. t, unpack(ids)) end
end

-- Hold a job BullMQ just added to its prioritized set (or re-hold a released one).
local function fqHoldJob(L, prioritizedKey, delayedKey, eventsKey, jobId, tenant, meta)
  redis.call('ZREM', prioritizedKey, jobId)
  redis.call('ZADD', delayedKey, string.format('%.17g', fqHeldScore), jobId)
  redis.call('RPUSH', L .. ':held:' .. tenant, jobId)
  fqRankTail(L, tenant, {jobId})
  fqAccountHeld(L, tenant, jobId)
  if meta then redis.call('HSET', L .. ':meta', jobId, meta) end
  redis.call('SADD', L .. ':tenants', tenant)
  fqDue(L, tenant, 0)
  redis.call('XADD', eventsKey, '*', 'event', 'delayed', 'jobId', jobId, 'delay', fqHeldMs)
end

-- Whether a job of tenant t is held rather than placed: the tenant has limits, or is
-- paused or catching up (anyHolds: L:paused or L:catchup has anyone at all). memo: a
-- call's answers by tenant.
local function fqHolding(L, t, anyHolds, memo)
  local known = memo[t]
  if known ~= nil then return known end
  known = redis.call('HEXISTS', L, t) == 1 or (anyHolds and (
    redis.call('HEXISTS', L .. ':paused', t) == 1 or redis.call('HEXISTS', L .. ':catchup', t) == 1))
  memo[t] = known
  return known
end

-- A released job of tenant t that runs again (BullMQ re-added it: a retry, a promoted
-- backoff, a stalled job's recovery): it no longer occupies a slot until it is released
-- again, and the start of its last attempt stays in the rate log under another member,
-- so the next release of the same job counts as a start of its own.
local function fqRerunLeaves(L, t, jobKey, jobId)
  if redis.call('SREM', L .. ':out:' .. t, jobId) == 0 then return end
  fqAccountLeaves(L, t, jobId)
  local rateKey = L .. ':rate:' .. t
  fqStamp(rateKey, jobKey, jobId)
  local at = redis.call('ZSCORE', rateKey, jobId)
  if at then
    redis.call('ZREM', rateKey, jobId)
    redis.call('ZADD', rateKey, at, jobId .. '#' .. at)
  end
end

-- Drop a job's entry from the ready-time index (K.ready .. ':' .. second, blanked as the
-- walk blanks one) for each ready time given (nil: none), and its fqRel mark: a held job
-- is indexed when it is released (release_held), so it has one entry and its held time
-- does not count against the wait bound. readyKey: K.ready; jobKey: its hash.
local function fqUnindex(readyKey, jobKey, jobId, readyMs)
  local released = redis.call('HGET', jobKey, 'fqRel')
  -- (not ipairs over {released, readyMs}: it stops at a nil released)
  for _, ms in pairs({tonumber(released) or false, readyMs or false}) do
    if ms then
      local key = readyKey .. ':' .. string.format('%d', math.floor(ms / 1000))
      local at = redis.call('LPOS', key, jobId)
      if at then redis.call('LSET', key, at, '') end
    end
  end
  if released then redis.call('HDEL', jobKey, 'fqRel') end
end

-- A job of a held tenant that BullMQ made takeable (a retry, a promoted backoff or
-- delayed job, a stalled job it recovered): back to the tenant's held jobs, behind those
-- held already, as a new arrival of its flow (every attempt is a turn, and goes through
-- the tenant's limits: a paused tenant's retries stay held). It must be out of BullMQ's
-- wait list already (the prioritized set's entry is dropped here). Its meta is kept, or
-- made from level and weight; readyMs: when it became ready (nil: unknown).
local function fqRehold(L, prioritizedKey, delayedKey, eventsKey, readyKey, jobKey, jobId, t,
    level, weight, readyMs, account, accountWeight)
  if redis.call('HEXISTS', L .. ':meta', jobId) == 1
      and redis.call('SISMEMBER', L .. ':out:' .. t, jobId) == 0 then
    -- held already (in L:held or L:later) and promoted by hand (job.promote(),
    -- Queue.promoteJobs): back to the held score, its place in line kept
    redis.call('ZREM', prioritizedKey, jobId)
    redis.call('ZADD', delayedKey, string.format('%.17g', fqHeldScore), jobId)
    return
  end
  fqRerunLeaves(L, t, jobKey, jobId)
  if redis.call('HEXISTS', L .. ':meta', jobId) == 0 then
    redis.call('HSET', L .. ':meta', jobId, fqHeldMeta(level or 'normal', weight or 1, nil,
      account and fqAccountMeta(account, accountWeight or 1)))
  end
  fqUnindex(readyKey, jobKey, jobId, readyMs)
  fqHoldJob(L, prioritizedKey, delayedKey, eventsKey, jobId, t, nil)
end

-- Before a held job is released: a job with attempts left gets the backoff
-- fqRetryHeldMs (its own kept as fqBackoff, false for none), so a worker's failed attempt
-- goes to BullMQ's delayed set out of reach instead of where an idle worker takes it at
-- once, and the release step holds it again (fqOccupied). opts: the job hash's JSON.
local function fqGuardRetries(jobKey)
  local raw = redis.call('HGET', jobKey, 'opts')
  if not raw or not string.find(raw, '"attempts"', 1, true) then return end
  local ok, opts = pcall(cjson.decode, raw)
  if not ok or type(opts) ~= 'table' or (tonumber(opts['attempts']) or 1) <= 1 then return end
  local b = opts['backoff']
  if type(b) == 'table' and b['type'] == 'fixed' and tonumber(b['delay']) == fqRetryHeldMs then
    return
  end
  opts['fqBackoff'] = b or false
  opts['backoff'] = {type = 'fixed', delay = fqRetryHeldMs}
  redis.call('HSET', jobKey, 'opts', cjson.encode(opts))
end

-- The job's own backoff (ms) before its next attempt, from fqBackoff and its attempts
-- made (BullMQ's fixed and exponential, without jitter; 0 for none or a custom one).
local function fqOwnBackoff(jobKey)
  local f = redis.call('HMGET', jobKey, 'opts', 'atm')
  local ok, opts = pcall(cjson.decode, f[1] or 'null')
  if not ok or type(opts) ~= 'table' then return 0 end
  local b = opts['fqBackoff']
  if type(b) == 'number' then return b end
  if type(b) ~= 'table' then return 0 end
  local delay = tonumber(b['delay']) or 0
  if b['type'] == 'exponential' then
    return math.floor(2 ^ ((tonumber(f[2]) or 1) - 1) * delay)
  elseif b['type'] == 'fixed' then
    return delay
  end
  return 0
end

-- The tenant's released jobs that have not finished, after dropping the finished ones
-- (gone, completed or failed in BullMQ's own sets): the slots it occupies, and how many
-- of them no worker has taken yet (still in the prioritized set). A released job whose
-- failed attempt BullMQ put fqRetryHeldMs ahead (fqGuardRetries) is held again, due
-- after its own backoff (L:later, or at once behind the tenant's held jobs); with hold
-- (the tenant has limits or is paused) so is one BullMQ made takeable again on its own
-- (at the cap, past every fair score: a retry of a job released before it had the guard)
-- or waiting out a backoff in the delayed set. So every attempt is released through the
-- tenant's limits and counted by its rate. now: Redis's clock, ms. since (the tenant has
-- a rate limit): where its window starts; each job's log entry is stamped with its start
-- (fqStamp), and the third result counts its untaken jobs whose release left the window
-- (they may still start within it).
local function fqOccupied(L, prefix, completedKey, failedKey, prioritizedKey, tenant, hold,
    delayedKey, eventsKey, readyKey, now, since)
  local outKey = L .. ':out:' .. tenant
  local rateKey = L .. ':rate:' .. tenant
  local n, takeable, old = 0, 0, 0
  for _, id in ipairs(redis.call('SMEMBERS', outKey)) do
    if redis.call('EXISTS', prefix .. id) == 0 or redis.call('ZSCORE', completedKey, id)
        or redis.call('ZSCORE', failedKey, id) then
      if since then fqStamp(rateKey, prefix .. id, id) end
      redis.call('SREM', outKey, id)
      fqAccountLeaves(L, tenant, id)
      redis.call('HDEL', L .. ':meta', id)
      redis.call('HDEL', L .. ':owner', id)
    else
      local score = tonumber(redis.call('ZSCORE', prioritizedKey, id))
      local due = not score and tonumber(redis.call('ZSCORE', delayedKey, id))
      if due then due = math.floor(due / 4096) end
      if due and due < fqHeldMs and due - now > fqRetryHeldMs / 2 then
        due = now + fqOwnBackoff(prefix .. id) -- a guarded retry: its own backoff from now
      elseif not hold then
        due = nil
      end
      if hold and score and score > fqRerunScore then
        fqRehold(L, prioritizedKey, delayedKey, eventsKey, readyKey, prefix .. id, id, tenant)
      elseif due and due <= now then
        fqRehold(L, prioritizedKey, delayedKey, eventsKey, readyKey, prefix .. id, id, tenant)
      elseif due and due < fqHeldMs then
        fqRerunLeaves(L, tenant, prefix .. id, id)
        fqUnindex(readyKey, prefix .. id, id, nil)
        redis.call('ZADD', delayedKey, 'XX', string.format('%.17g', fqHeldScore), id)
        redis.call('ZADD', L .. ':later:' .. tenant, due, id)
        fqAccountHeld(L, tenant, id)
        fqDue(L, tenant, due)
      else
        n = n + 1
        if score then
          takeable = takeable + 1
          if since and (tonumber(redis.call('ZSCORE', rateKey, id)) or 0) <= since then
            old = old + 1
          end
        elseif since then
          fqStamp(rateKey, prefix .. id, id)
        end
      end
    end
  end
  return n, takeable, old
end

-- What max_waiting counts: every unfinished job of the tenant that is not running:
-- held, delayed (held until due: L:later), released and not taken yet, and released jobs
-- waiting to run again (in BullMQ's delayed set: a retry's backoff).
local function fqWaitingOf(L, prioritizedKey, delayedKey, tenant)
  if string.byte(tenant, 1) == 10 then -- '\n<account>': an account's (account_limits.lua)
    return fqAccountWaiting(L, prioritizedKey, delayedKey, string.sub(tenant, 2))
  end
  return redis.call('LLEN', L .. ':held:' .. tenant) + redis.call('ZCARD', L .. ':later:' .. tenant)
    + fqNotTaken(L .. ':out:' .. tenant, prioritizedKey, delayedKey)
end

-- A batch added over several calls (more than one add call's jobs, or delayed jobs, one a
-- call) is checked against max_waiting whole by its first call, which reserves room for
-- the jobs of its later calls (L:resv:<t>: batch token -> 'jobs left:expiry ms'); its later
-- calls use that room instead of checking again, so a batch is added whole or refused
-- whole. Other adds count the reservations as waiting. A reservation whose producer died
-- mid-batch expires after fqReserveMs. Returns (this batch's entry or nil, the others'
-- reserved jobs, the expired entries).
local fqReserveMs = 60000
local function fqReservations(L, t, token, now)
  local entries = redis.call('HGETALL', L .. ':resv:' .. t)
  local mine, others, expired = nil, 0, {}
  for i = 1, #entries, 2 do
    local left, expires = string.match(entries[i + 1], '^(%d+):(%d+)$')
    if not left or tonumber(expires) <= now then
      expired[#expired + 1] = entries[i]
    elseif entries[i] == token then
      mine = tonumber(left)
    else
      others = others + tonumber(left)
    end
  end
  return mine, others, expired
end

-- Check a call's jobs of tenant t (count) against its max_waiting; batch: nil, or
-- {token = the batch's token, left = {tenant: its jobs in the batch's later calls}}.
-- Returns nil and a function that records the call (its reservation) once nothing else
-- refuses, or the refusal {'fq:backlog', t, max_waiting, waiting}. Writes nothing itself.
local function fqCheckWaiting(L, prioritizedKey, delayedKey, t, maxWaiting, count, batch, now)
  local token = batch and batch.token or ''
  local left = batch and batch.left and tonumber(batch.left[t]) or 0
  local mine, others, expired = fqReservations(L, t, token, now)
  if not mine then
    local waiting = fqWaitingOf(L, prioritizedKey, delayedKey, t) + others
    if waiting + count + left > maxWaiting then
      return {'fq:backlog', t, maxWaiting, waiting}
    end
  end
  return nil, function()
    local key = L .. ':resv:' .. t
    if #expired > 0 then redis.call('HDEL', key, unpack(expired)) end
    if left > 0 then
      redis.call('HSET', key, token, left .. ':' .. (now + fqReserveMs))
      redis.call('PEXPIRE', key, fqReserveMs * 2)
    elseif mine then
      redis.call('HDEL', key, token)
    end
  end
end

-- Keep the queue's K.state 'holds' flag (read by fqClock in the add script's one HMGET,
-- so a call without limited tenants pays nothing to learn that none is paused) in step
-- with L:paused and L:catchup. stateKey: K.state.
local function fqSyncHolds(L, stateKey)
  local want = redis.call('EXISTS', L .. ':paused', L .. ':catchup') > 0
  if want == (redis.call('HEXISTS', stateKey, 'holds') == 1) then return end
  if want then
    redis.call('HSET', stateKey, 'holds', 1)
  else
    redis.call('HDEL', stateKey, 'holds')
  end
end

-- A tenant's encoded limits as an add sends them: ending in '\np' when the producer's
-- plan lookup (the database) says it is paused. That mark is dropped; while Redis has not
-- had the database's copy rebuilt (no L:synced: it lost fairqueue's keys, or no loop has
-- run yet), it pauses the tenant here ('add', which the rebuild undoes if the database
-- does not say so), so a pause Redis forgot still holds the job. Returns the limits.
local function fqAddPause(L, t, encoded)
  if string.sub(encoded, -2) ~= '\np' then return encoded end
  if redis.call('EXISTS', L .. ':synced') == 0 then
    redis.call('HSETNX', L .. ':paused', t, 'add')
  end
  return string.sub(encoded, 1, -3)
end

-- Which tenants of an add call are held, or a refusal (max_waiting). given: the call's
-- JSON {tenant: encoded limits} ('' or nil when no tenant of the call has limits), and
-- {'\n<account>': encoded limits} for the accounts with limits of its jobs (their
-- tenants come with limits of their own, maybe empty ones, so they are held);
-- tenantAt: where a job's tenant is in its entry.
local function fqHeldTenants(L, prioritizedKey, given, jobs, tenantAt, delayedKey, batch)
  -- paused, or resumed and still draining its held jobs (a new job goes behind them)
  local anyPaused = redis.call('EXISTS', L .. ':paused', L .. ':catchup') > 0
  if (given == nil or given == '') and not anyPaused then return nil end
  local limits = {}
  if given ~= nil and given ~= '' then limits = cjson.decode(given) end
  local hold, counts, tacct = {}, {}, nil
  for _, job in ipairs(jobs) do
    local t = job[tenantAt]
    if hold[t] == nil then
      hold[t] = limits[t] ~= nil or (anyPaused and (redis.call('HEXISTS', L .. ':paused', t) == 1
        or redis.call('HEXISTS', L .. ':catchup', t) == 1))
    end
    if hold[t] then
      counts[t] = (counts[t] or 0) + 1
      local a = job.account and '\n' .. job.account
      if a and limits[a] then
        counts[a] = (counts[a] or 0) + 1
        tacct = tacct or {}
        tacct[t] = job.account
      end
    end
  end
  local records, now = {}, nil
  for t, encoded in pairs(limits) do
    local maxWaiting = fqSplitLimits(encoded).maxWaiting
    if maxWaiting and counts[t] then
      if not now then now = fqNowMs() end
      local refused, record = fqCheckWaiting(L, prioritizedKey, delayedKey, t, maxWaiting,
        counts[t], batch, now)
      if refused then return nil, refused end
      records[#records + 1] = record
    end
  end
  for _, record in ipairs(records) do record() end
  for t, encoded in pairs(limits) do
    if string.byte(t, 1) == 10 then
      redis.call('HSET', L .. ':acc', string.sub(t, 2), encoded)
    else
      redis.call('HSET', L, t, fqAddPause(L, t, encoded))
    end
  end
  if tacct then
    for t, a in pairs(tacct) do
      redis.call('HSET', L .. ':tacct', t, a)
      fqAcctMemo[t] = a
    end
  end
  return hold
end
