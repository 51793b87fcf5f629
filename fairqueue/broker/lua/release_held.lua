--[[
  Release held jobs of tenants that have room, atomically: one call decides each
  tenant's room (its limits, the released jobs it still occupies as BullMQ's own sets
  say, its rate window) and moves that many of its held jobs, oldest first, from the
  delayed set to the prioritized set at their fair places (placed by the fair clock as
  new arrivals of their flows, and indexed for the wait bound from now: a held job does
  not wait against the bound while its tenant is at its own limit). Nothing else runs
  while a script does, so two callers (the loop, a worker, an enqueue) can never release
  the same job twice or more jobs than the room.

  Mode 'pullback' (pause_tenant): the tenant's released jobs that no worker has taken go
  back to the front of its held list, so none of them starts after the pause returns;
  mode 'scan' (pause_tenant, paged) does the same for its jobs fairqueue never held
  (added before it had limits), found by their payload's tenantId. ARGV for
  'scan': the cursor's score and member ('' from the start), the first held job when
  the scan began ('' none), where, and (where 'prioritized') the cursor's ties. Returns
  {moved, cursor score, cursor member, done}, and the cursor's ties where 'prioritized'.

  KEYS[1..8]  BullMQ's prioritized, delayed, active, completed, failed, marker, meta,
              events
  KEYS[9..13] fairqueue's state, flows, fweights, ready, jobs
  KEYS[14]    the limits key L (tenant_limits.lua lists the keys beside it)
  KEYS[15]    BullMQ's wait list (the 'scan' of where 'wait'; a release call takes held
              jobs promoted there by hand, and limited tenants' jobs Queue.retryJobs
              moved there, back)
  Mode 'probe' (an open breaker's probe): as 'release' for one given paused tenant, one
  job released despite the pause; the reply's seventh element is that job's id ('' none).

  ARGV        job key prefix, fairness ('time'/'jobs'), mode ('release'/'pullback'),
              tenants ('' = the loop's step: the tenants due, L:due; else
              '\n'-separated), the most jobs to release in this call; then, for
              'scan' only, cursor_score, cursor_member, boundary, where
              ('prioritized', 'wait', 'delayed') and cursor_ties
  Returns {released, held left (of the tenants given; the loop's step: every held job),
  next wake ms (-1: none; the given tenants' next rate window, or in the loop's step when
  the next tenant falls due), held by max_active, held by rate, held by pause (of the
  tenants visited)}.

  The loop's step does work in proportion to what can move, whatever the number of
  limited tenants: it visits the tenants due (L:due, tenant_limits.lua), made due by
  what can give them room: a job held, a delayed job's due time, a rate window, and
  BullMQ's events of their released jobs (fqHearEvents). See docs/design.md, "Releasing
  at scale".
]]
--- @argv prefix fairness mode tenants most cursor_score? cursor_member? boundary? where? cursor_ties?
--- @include fair_clock
--- @include tenant_limits
--- @include rerun_meta
local prefix, byTime = ARGV.prefix, ARGV.fairness == 'time'
local mode, budget = ARGV.mode, tonumber(ARGV.most)
local L = KEYS[14]
local K = {prioritized = KEYS[1], state = KEYS[9], flows = KEYS[10], fweights = KEYS[11],
  ready = KEYS[12], jobs = KEYS[13]}
-- A page of a sweep over L:tenants in progress, each made due now (SSCAN returns every
-- member present for the whole sweep at least once). A sweep starts at the first call and
-- when events were lost, so no tenant waits for an event it will never hear.
local function fqSweepDue(L, now)
  local cursor = redis.call('GET', L .. ':sweep')
  if not cursor then return end
  local page = redis.call('SSCAN', L .. ':tenants', cursor, 'COUNT', {{RELEASE_SWEEP_PAGE}})
  for _, t in ipairs(page[2]) do fqDue(L, t, now) end
  if page[1] == '0' then
    redis.call('DEL', L .. ':sweep')
  else
    redis.call('SET', L .. ':sweep', page[1])
  end
end

-- Whether stream id a ('ms-seq') comes after b.
local function fqStreamAfter(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, bm = tonumber(am), tonumber(bm)
  return am > bm or (am == bm and tonumber(as) > tonumber(bs))
end

-- BullMQ's events since the last call (at most RELEASE_EVENTS a call): each of a job
-- fairqueue released (L:owner) makes its tenant due now, for a started, finished,
-- failed, retried or removed job may give it room. With no released job out, the read
-- skips to the stream's end. The stream is trimmed (BullMQ keeps about 10,000 events):
-- when its first entry is past the last one read, events may be lost, and a sweep makes
-- every tenant due instead.
local function fqHearEvents(L, eventsKey, now)
  local posKey = L .. ':evpos'
  local pos = redis.call('GET', posKey)
  if not pos or redis.call('HLEN', L .. ':owner') == 0 then
    local last = redis.call('XREVRANGE', eventsKey, '+', '-', 'COUNT', 1)[1]
    redis.call('SET', posKey, last and last[1] or '0-0')
    if not pos then redis.call('SET', L .. ':sweep', '0') end
    return
  end
  local first = redis.call('XRANGE', eventsKey, '-', '+', 'COUNT', 1)[1]
  local lost = false
  if pos ~= '0-0' and not (first and not fqStreamAfter(first[1], pos)) then
    -- the stream starts past the last entry read, or is empty: trimmed past it, or nothing
    -- written since. An empty stream tells by its last id. A stream read to its end while
    -- empty (L:evadded holds how many entries it had taken then, Redis 7) tells by its
    -- count: entries taken since, beyond those it holds, were trimmed unread. Otherwise
    -- the gap counts as lost.
    local added, last
    local ok, info = pcall(redis.call, 'XINFO', 'STREAM', eventsKey)
    if ok then
      for i = 1, #info, 2 do
        if info[i] == 'entries-added' then added = tonumber(info[i + 1]) end
        if info[i] == 'last-generated-id' then last = info[i + 1] end
      end
    end
    if not first then
      lost = last ~= nil and fqStreamAfter(last, pos)
      if last then redis.call('SET', posKey, last) end
      if added then redis.call('SET', L .. ':evadded', added) end
    else
      local then_added = tonumber(redis.call('GET', L .. ':evadded'))
      lost = not (then_added and added and added - then_added <= redis.call('XLEN', eventsKey))
    end
  end
  if lost then redis.call('SET', L .. ':sweep', '0', 'NX') end
  local entries = redis.call('XRANGE', eventsKey, '(' .. pos, '+', 'COUNT', {{RELEASE_EVENTS}})
  local seen = {}
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    for i = 1, #fields, 2 do
      if fields[i] == 'jobId' then
        local t = redis.call('HGET', L .. ':owner', fields[i + 1])
        if t and not seen[t] then
          seen[t] = true
          fqDue(L, t, now)
        end
        break
      end
    end
  end
  if #entries > 0 then
    redis.call('SET', posKey, entries[#entries][1])
    redis.call('DEL', L .. ':evadded')
  end
end

local general = ARGV.tenants == '' -- the loop's step: the tenants due (L:due), not given ones
local tenants = {}
for t in string.gmatch(ARGV.tenants, '[^\n]+') do tenants[#tenants + 1] = t end

if mode == 'holds' then -- pause_tenant / resume_tenant changed L:paused or L:catchup
  fqSyncHolds(L, K.state)
  return {0, 0, -1, 0, 0, 0}
end

if mode == 'scan' and (ARGV.where == 'delayed' or ARGV.where == 'wait') then
  -- pause_tenant or a first limit, after the prioritized scan: a page of the tenant's
  -- jobs in BullMQ's delayed set that are not held (delayed when it had no limits, or a
  -- backoff), each held until it is due (L:later, its due time from its score), or of
  -- BullMQ's wait list (another producer's, or a stalled job a worker recovered), each
  -- held. Cursor: for 'delayed' (score, member) as above, for 'wait' the index from the
  -- list's tail (where workers take from). Returns {moved, cursor score, member, done}.
  local t, page, now = tenants[1], tonumber(ARGV.most), fqNowMs()
  local needle = cjson.encode(t)
  local found, moved, seen = {}, 0, 0
  local lastScore, lastMember = ARGV.cursor_score, ARGV.cursor_member
  if ARGV.where == 'wait' then
    local from = tonumber(ARGV.cursor_score) or 0
    local ids = redis.call('LRANGE', KEYS[15], -(from + page), -(from + 1))
    for i = #ids, 1, -1 do found[#found + 1] = ids[i]; found[#found + 1] = false end
  else
    local min = '-inf'
    if lastScore ~= '' then min = lastScore end
    found = redis.call('ZRANGEBYSCORE', KEYS[2], min, '(' .. string.format('%.17g', fqHeldScore),
      'WITHSCORES', 'LIMIT', 0, page + 1)
  end
  local kept = 0 -- wait list ids left in place (the next page starts past them)
  for i = 1, #found, 2 do
    local id, score = found[i], found[i + 1]
    if not (score and lastScore ~= '' and tonumber(score) == tonumber(lastScore)
        and id <= lastMember) then
      if seen == page then break end
      seen = seen + 1
      if score then lastScore, lastMember = score, id end
      local data = redis.call('HGET', prefix .. id, 'data')
      local level, tenant, weight, ready, account, accountWeight = nil, nil, nil, nil, nil, nil
      if data and string.find(data, needle, 1, true) then
        level, tenant, weight, ready, account, accountWeight = fqForeign(K, prefix, id, now, #data)
      end
      if level and tenant == t then
        fqRerunLeaves(L, t, prefix .. id, id)
        if redis.call('HEXISTS', L .. ':meta', id) == 0 then
          redis.call('HSET', L .. ':meta', id, fqHeldMeta(level, weight, nil,
            account and fqAccountMeta(account, accountWeight)))
        end
        if score then -- delayed: held until it is due, then behind its held jobs
          fqUnindex(K.ready, prefix .. id, id, math.floor(tonumber(score) / 4096))
          redis.call('ZADD', KEYS[2], 'XX', string.format('%.17g', fqHeldScore), id)
          redis.call('ZADD', L .. ':later:' .. t, math.floor(tonumber(score) / 4096), id)
          fqAccountHeld(L, t, id)
          redis.call('SADD', L .. ':tenants', t)
          fqDue(L, t, math.floor(tonumber(score) / 4096))
        else
          redis.call('LREM', KEYS[15], -1, id)
          fqUnindex(K.ready, prefix .. id, id, ready)
          fqHoldJob(L, K.prioritized, KEYS[2], KEYS[8], id, t, nil)
        end
        moved = moved + 1
      elseif not score then
        kept = kept + 1
      end
    end
  end
  local done = seen < page and 1 or 0
  if ARGV.where == 'wait' then
    lastScore, lastMember = tostring((tonumber(ARGV.cursor_score) or 0) + kept), ''
  end
  return {moved, lastScore, lastMember, done}
end

if mode == 'scan' then
  -- pause_tenant, after 'pullback': a page of the prioritized set in score order from a
  -- cursor (score, member), for the tenant's jobs fairqueue never tracked (added while
  -- the tenant had no limits): each is held too, before the tenant's other held jobs
  -- (ahead of the first one held when the scan began, boundary), in its old order.
  -- Members tie on a score (two flows' jobs at one tag; every parked job at the cap, a
  -- flood's thousands): ties sort by member, and the cursor also carries how many members
  -- at its score up to its member are still in the set (ties), so a page starts within
  -- the run, not at its head (which would fill the page with members already seen and
  -- end the scan early). It starts {{TIE_SLACK}} members before that count, in case some
  -- left meanwhile, and skips what it has seen by member.
  local t, page = tenants[1], tonumber(ARGV.most)
  local fromScore, fromMember, boundary = ARGV.cursor_score, ARGV.cursor_member, ARGV.boundary
  local fromTies = tonumber(ARGV.cursor_ties) or 0
  local min, offset = '-inf', 0
  if fromScore ~= '' then
    min = fromScore
    offset = math.max(0, fromTies - {{TIE_SLACK}})
  end
  local found = redis.call('ZRANGEBYSCORE', K.prioritized, min, '+inf', 'WITHSCORES', 'LIMIT',
    offset, fromTies - offset + page + 1)
  local moved, lastScore, lastMember, seen = 0, fromScore, fromMember, 0
  local ties = fromTies -- members at lastScore up to lastMember still in the set
  local heldKey = L .. ':held:' .. t
  local needle = cjson.encode(t) -- a quick filter before decoding (any JSON spacing)
  for i = 1, #found, 2 do
    local id, score = found[i], found[i + 1]
    -- ties sort by member: skip what a previous page already looked at
    if not (fromScore ~= '' and tonumber(score) == tonumber(fromScore) and id <= fromMember) then
      if seen == page then break end
      seen = seen + 1
      if lastScore == '' or tonumber(score) ~= tonumber(lastScore) then ties = 0 end
      lastScore, lastMember = score, id
      ties = ties + 1 -- taken back below if the job is held
      local data = redis.call('HGET', prefix .. id, 'data')
      if data and string.find(data, needle, 1, true)
          and redis.call('SISMEMBER', L .. ':out:' .. t, id) == 0 then
        local ok, decoded = pcall(cjson.decode, data)
        if ok and type(decoded) == 'table' and tostring(decoded.tenantId) == t then
          local rank = tonumber(score) % 4
          local level = fqRankLevel[rank] or 'normal'
          local weight = redis.call('HGET', K.fweights, fqFlowMember(level, t)) or '1'
          -- out of the ready-time index until it is released: its paused time is not
          -- waiting, and the release indexes it once
          fqUnindex(K.ready, prefix .. id, id, fqReadyOf(prefix, id))
          fqHoldJob(L, K.prioritized, KEYS[2], KEYS[8], id, t, fqHeldMeta(level, weight, nil,
            fqJobAccount(prefix .. id)))
          redis.call('RPOP', heldKey) -- fqHoldJob appended it: it goes before the boundary
          local inserted = -1
          if boundary ~= '' then
            inserted = redis.call('LINSERT', heldKey, 'BEFORE', boundary, id)
          end
          if inserted <= 0 then
            redis.call('RPUSH', heldKey, id) -- its index entry stays at the tail
          else
            fqRankBefore(L, t, id, boundary)
          end
          moved = moved + 1
          ties = ties - 1
        end
      end
    end
  end
  local done = seen < page and 1 or 0
  return {moved, lastScore, lastMember, done, ties}
end

if mode == 'pullback' then
  local moved = 0
  for _, t in ipairs(tenants) do
    -- its retries that BullMQ re-added, or that wait out a backoff, are held first
    fqOccupied(L, prefix, KEYS[4], KEYS[5], K.prioritized, t, true, KEYS[2], KEYS[8],
      K.ready, fqNowMs())
    local back = {}
    for _, id in ipairs(redis.call('SMEMBERS', L .. ':out:' .. t)) do
      local score = redis.call('ZSCORE', K.prioritized, id)
      if score then back[#back + 1] = {tonumber(score), id} end
    end
    table.sort(back, function(a, b) return a[1] > b[1] end)
    for _, entry in ipairs(back) do
      local id = entry[2]
      fqHoldJob(L, K.prioritized, KEYS[2], KEYS[8], id, t, nil)
      -- fqHoldJob appends; a pulled-back job goes back to the front, in its old order
      redis.call('RPOP', L .. ':held:' .. t)
      redis.call('LPUSH', L .. ':held:' .. t, id)
      fqRankFront(L, t, id)
      redis.call('SREM', L .. ':out:' .. t, id)
      fqAccountLeaves(L, t, id)
      redis.call('ZREM', L .. ':rate:' .. t, id)
      moved = moved + 1
    end
  end
  return {moved, 0, -1, 0, 0, 0}
end

-- A call holds Redis at most about RELEASE_CALL_US: past it, no further tenant is
-- visited and no further job placed (the rest stay due: the next call goes on), once it
-- has made RELEASE_SURE_VISITS visits and released RELEASE_SURE_JOBS jobs (so a call
-- always makes progress, and what it does for a few tenants does not depend on timing).
local deadline = nil
local function fqTimeUp()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if not deadline then deadline = us + {{RELEASE_CALL_US}} end
  return us > deadline
end
fqTimeUp()
local now = fqNowMs()
-- Held jobs that BullMQ's Queue.promoteJobs (bull-board's "Promote all") moved to its
-- wait list, which workers serve before every prioritized job, and a limited tenant's
-- failed jobs that Queue.retryJobs (bull-board's "Retry all") moved there: the ones no
-- worker took yet go back to their place among the tenant's held jobs at this call
-- (every 20 ms in the loop), not at the next adoption tick (250 ms). At most
-- RELEASE_WAIT_PAGE jobs from the list's tail (where workers take from) are looked at,
-- within the call's time: jobs fairqueue holds or released (L:meta), and, while any
-- tenant has limits or is held, the others (their payload read as the adoption reads it,
-- up to RELEASE_WAIT_PAYLOAD bytes: a larger one waits for the adoption). One LLEN when
-- the list is empty, as it is for fairqueue's jobs.
if redis.call('LLEN', KEYS[15]) > 0 then
  local ids = redis.call('LRANGE', KEYS[15], -{{RELEASE_WAIT_PAGE}}, -1)
  local anyHolds = redis.call('EXISTS', L .. ':paused', L .. ':catchup') > 0
  local anyLimits = anyHolds or redis.call('HLEN', L) > 0
  local memo = {}
  for i = #ids, 1, -1 do
    local id = ids[i]
    if redis.call('HEXISTS', L .. ':meta', id) == 1 then
      local ok, data = pcall(cjson.decode, redis.call('HGET', prefix .. id, 'data') or 'null')
      local t = ok and type(data) == 'table' and data.tenantId
      if t and t ~= cjson.null and fqHolding(L, tostring(t), anyHolds, memo) then
        redis.call('LREM', KEYS[15], -1, id)
        fqRehold(L, K.prioritized, KEYS[2], KEYS[8], K.ready, prefix .. id, id, tostring(t),
          nil, nil, fqReadyOf(prefix, id))
      end
      if fqTimeUp() then break end -- payloads to decode (up to MAX_PAYLOAD_BYTES each)
    elseif anyLimits then
      -- re-added by BullMQ without fairqueue (Queue.retryJobs): held again if its tenant
      -- is limited, at the level, weight and first ready time the adoption would give it
      local level, t, weight, ready, account, accountWeight = fqForeign(K, prefix, id, now,
        {{RELEASE_WAIT_PAYLOAD}})
      if level and fqHolding(L, t, anyHolds, memo) then
        redis.call('LREM', KEYS[15], -1, id)
        fqRehold(L, K.prioritized, KEYS[2], KEYS[8], K.ready, prefix .. id, id, t, level,
          weight, ready, account, accountWeight)
      end
      if fqTimeUp() then break end
    end
  end
end
if general then
  -- the loop's step also heals the add script's flag (after a queue was obliterated and
  -- its K.state forgotten, say): two reads when nothing changed
  fqSyncHolds(L, K.state)
  fqHearEvents(L, KEYS[8], now)
  fqSweepDue(L, now)
  tenants = redis.call('ZRANGEBYSCORE', L .. ':due', '-inf', now, 'LIMIT', 0, {{RELEASE_VISITS}})
end
local released, left, wake = 0, 0, -1
local probeId = '' -- mode 'probe': the job released
local heldBy = {max_active = 0, rate = 0, paused = 0}
local c = nil
local visits, work = 0, 0 -- tenants visited, their released jobs walked (fqOccupied)
local accounts = {} -- the accounts visited (fqAccountVisit)
for _, t in ipairs(tenants) do
  local heldKey = L .. ':held:' .. t
  local outKey = L .. ':out:' .. t
  if visits > 0 then
    if visits >= {{RELEASE_SURE_VISITS}} and fqTimeUp() then break end -- the next call goes on
    work = work + redis.call('SCARD', outKey)
    if general and work > {{RELEASE_VISIT_WORK}} then break end
  end
  visits = visits + 1
  -- its delayed jobs that are due join its held jobs, behind those (add_delayed)
  local laterKey = L .. ':later:' .. t
  local due = redis.call('ZRANGEBYSCORE', laterKey, '-inf', now, 'LIMIT', 0, 1000)
  if #due > 0 then
    redis.call('RPUSH', heldKey, unpack(due))
    fqRankTail(L, t, due)
    redis.call('ZREM', laterKey, unpack(due))
  end
  local tokens = nil -- the rate bucket's tokens, when the tenant has a rate limit
  local encoded = redis.call('HGET', L, t)
  -- its account's state, when the account has limits (once per call and account)
  local acctId = fqAccountOf(L, t)
  local acct = acctId and fqAccountVisit(L, accounts, acctId, prefix, KEYS[4], KEYS[5],
    K.prioritized, now)
  local byAccount = nil -- the account's limit that keeps its held jobs, if it binds
  local waits = false -- it waits for a slot of its account (L:await)
  local paused = redis.call('HEXISTS', L .. ':paused', t) == 1
  -- the slots it occupies, checked against BullMQ's own sets at every visit: a tenant
  -- stays in L:tenants until its last released job has finished, so none is left behind;
  -- a limited or paused tenant's jobs that BullMQ made takeable again (retries) are held
  local lim = fqSplitLimits(encoded or nil)
  local since = lim.rateMax and lim.rateMs and now - lim.rateMs
  local occupied, takeable, takeableOld = fqOccupied(L, prefix, KEYS[4], KEYS[5], K.prioritized,
    t, encoded ~= false or paused or redis.call('HEXISTS', L .. ':catchup', t) == 1, KEYS[2],
    KEYS[8], K.ready, now, since)
  local later = redis.call('EXISTS', laterKey) == 1
  local held = redis.call('LLEN', heldKey)
  local nextVisit = now + {{RELEASE_BACKSTOP_MS}} -- events and timers come sooner
  local cut = false -- room left that the call's budget or time did not reach
  if held > 0 then
    local count, reason = held, nil
    if paused then
      count, reason = 0, 'paused'
      -- an open breaker's probe: one job of the paused tenant, whatever else holds
      -- (the caller checked that nothing but the breaker holds it here)
      if mode == 'probe' then count = 1 end
    else
      count, reason, tokens = fqLimitRoom(lim, count, occupied, L .. ':rate:' .. t,
        L .. ':bucket:' .. t, takeable, takeableOld, now)
      -- its account's limits hold too (account_limits.lua): the smaller room, and the
      -- account's reason when it is the account's that binds
      if acct then
        -- the account's tenants that waited for its slots go first, in their order
        -- (release_room's waiting_ahead)
        local ahead = 0
        if acct.lim.maxActive then
          local waitKey = L .. ':await:' .. acctId
          ahead = redis.call('ZRANK', waitKey, t) or redis.call('ZCARD', waitKey)
        end
        local room, why, atokens = fqLimitRoom(acct.lim, count, acct.occupied + ahead,
          acct.rateKey, acct.bucketKey, acct.takeable, acct.old, now)
        acct.tokens = atokens
        -- and no account has more than TAKEABLE_CAP released jobs untaken (its L:aout
        -- stays small: fqAccountVisit walks it)
        if {{TAKEABLE_CAP}} - acct.takeable < room then
          room, why = math.max(0, {{TAKEABLE_CAP}} - acct.takeable), nil
        end
        if room < count then count, reason, byAccount = room, why, why end
      end
      -- a resumed tenant's backlog drains with the slots the others leave: while other
      -- jobs wait, a few of its jobs takeable at a time, not its whole backlog ahead of
      -- their new arrivals; while none does, every slot is free for it (up to the
      -- takeable cap below), so it drains at the workers' pace
      if redis.call('HEXISTS', L .. ':catchup', t) == 1
          and redis.call('ZCARD', K.prioritized) > takeable then
        local room = {{CATCHUP_AHEAD}} - takeable
        if room < 0 then room = 0 end
        if room < count then count, reason = room, 'paused' end
      end
      -- and no limited tenant has more than TAKEABLE_CAP released jobs untaken, so its
      -- L:out set (checked at every step and every limited add) stays small whatever its
      -- backlog: a max_waiting-only tenant's 50,000 waiting jobs wait held
      local room = {{TAKEABLE_CAP}} - takeable
      if room < 0 then room = 0 end
      if room < count then count = room end
    end
    -- cut by nothing but this call's budget: the next call goes on with it
    local allowed = count
    if count > budget - released then count = budget - released end
    local done, placed, indexed, popped = 0, 0, {}, {}
    while done < count do
      if released >= {{RELEASE_SURE_JOBS}} and fqTimeUp() then break end
      local id = redis.call('LPOP', heldKey)
      if not id then break end
      done = done + 1
      popped[done] = id
      local meta = redis.call('HGET', L .. ':meta', id)
      if redis.call('EXISTS', prefix .. id) == 0 or not meta then
        redis.call('HDEL', L .. ':meta', id) -- removed while held (remove, drain, clean)
        redis.call('HDEL', L .. ':owner', id)
      elseif not redis.call('ZSCORE', KEYS[2], id) then
        redis.call('SADD', outKey, id) -- promoted by hand: takeable already, it occupies
        redis.call('HSET', L .. ':owner', id, t)
      else
        if not c then
          c = fqClock(K)
          c.byTime = byTime
        end
        local level, weight, cost, account, accountWeight = fqHeldMetaSplit(meta)
        redis.call('ZREM', KEYS[2], id)
        fqGuardRetries(prefix .. id)
        local score, behind, cold, paid = fqPlace(K, c, level, t, tonumber(weight),
          tonumber(cost), true, account, accountWeight)
        if score and paid then -- what it paid, for the pass's charge (as add_jobs')
          redis.call('HDEL', prefix .. id, cold and 'fqCost' or 'fqPaid')
          redis.call('HSET', prefix .. id, cold and 'fqPaid' or 'fqCost', string.format('%.6g', paid))
        end
        redis.call('ZADD', K.prioritized, string.format('%.17g', score or fqCap * fqScore), id)
        fqPlaced(K, c, score)
        if score and behind then fqLinePush(K, fqFlowMember(level, t), {id}) end
        -- indexed once: a job pulled back by a pause and released again keeps its entry
        if redis.call('HSETNX', prefix .. id, 'fqRel', now) == 1 then indexed[#indexed + 1] = id end
        probeId = id
        redis.call('SADD', outKey, id)
        redis.call('HSET', L .. ':owner', id, t)
        if lim.rateMax then redis.call('ZADD', L .. ':rate:' .. t, now, id) end
        if acctId then redis.call('SADD', L .. ':aout:' .. acctId, id) end
        if acct then
          if acct.lim.rateMax then redis.call('ZADD', acct.rateKey, now, id) end
          acct.occupied, acct.takeable = acct.occupied + 1, acct.takeable + 1
        end
        redis.call('XADD', KEYS[8], '*', 'event', 'waiting', 'jobId', id, 'prev', 'delayed')
        released = released + 1
        placed = placed + 1
      end
    end
    fqIndexMany(K, indexed, now) -- one RPUSH for the tenant's released jobs
    fqRankDrop(L, t, popped) -- one ZREM: they left the held list
    if acctId and #popped > 0 then redis.call('SREM', L .. ':aheld:' .. acctId, unpack(popped)) end
    if acct and acct.tokens then
      acct.tokens = acct.tokens - placed
      redis.call('HSET', acct.bucketKey, 'tokens', string.format('%.17g', acct.tokens), 'at', now)
      redis.call('PEXPIRE', acct.bucketKey, acct.lim.rateMs * 2)
    end
    if tokens then
      tokens = tokens - placed
      redis.call('HSET', L .. ':bucket:' .. t, 'tokens', string.format('%.17g', tokens), 'at', now)
      redis.call('PEXPIRE', L .. ':bucket:' .. t, lim.rateMs * 2)
    end
    held = redis.call('LLEN', heldKey)
    cut = done < allowed and held > 0
    if held == 0 and redis.call('HDEL', L .. ':catchup', t) == 1 then -- caught up
      fqSyncHolds(L, K.state)
    end
    if held == 0 and not later and redis.call('SCARD', outKey) == 0 then
      redis.call('SREM', L .. ':tenants', t)
      nextVisit = nil
    elseif held > 0 then
      left = left + held
      if reason then heldBy[reason] = heldBy[reason] + held end
      if byAccount == 'rate' then
        local at = fqRateWake(acct.lim, acct.tokens, acct.rateKey, now)
        if wake < 0 or at < wake then wake = at end
        -- a tenant served now comes after those the account's rate left waiting, so its
        -- tenants take the account's rate in turn
        nextVisit = now + at + (placed > 0 and 1 or 0)
      elseif byAccount == 'max_active' then
        -- a slot of the account freed makes it due (fqAccountWake)
        -- (served some now: behind the others waiting, so they take its slots in turn)
        redis.call('ZADD', L .. ':await:' .. acctId, placed > 0 and 'GT' or 'NX', now, t)
        waits = true
      elseif reason == 'rate' then
        local at = fqRateWake(lim, tokens, L .. ':rate:' .. t, now)
        if wake < 0 or at < wake then wake = at end
        nextVisit = now + at
      end
    end
  elseif occupied == 0 and not later then
    redis.call('SREM', L .. ':tenants', t)
    nextVisit = nil
  end
  if cut then nextVisit = now end -- room left that this call had no time for
  -- served, or no longer held by its account's slots: its turn among the waiting goes
  if acctId and not waits then redis.call('ZREM', L .. ':await:' .. acctId, t) end
  if nextVisit and later then
    local first = redis.call('ZRANGE', laterKey, 0, 0, 'WITHSCORES')
    if first[2] and tonumber(first[2]) < nextVisit then nextVisit = tonumber(first[2]) end
  end
  if nextVisit then
    redis.call('ZADD', L .. ':due', nextVisit, t)
  else
    redis.call('ZREM', L .. ':due', t)
  end
  if released >= budget then break end
end
if released > 0 and redis.call('HEXISTS', KEYS[7], 'paused') == 0 then
  redis.call('ZADD', KEYS[6], 0, '0') -- wake the workers (BullMQ's base marker)
end
if general then
  -- every held job (the held score: held, and delayed ones held until due), and when
  -- the next tenant falls due
  local at = string.format('%.17g', fqHeldScore)
  left = redis.call('ZCOUNT', KEYS[2], at, at)
  local first = redis.call('ZRANGE', L .. ':due', 0, 0, 'WITHSCORES')
  wake = -1
  if first[2] then wake = math.max({{RELEASE_AGAIN_MS}}, tonumber(first[2]) - now) end
end
if mode == 'probe' then
  return {released, left, wake, heldBy.max_active, heldBy.rate, heldBy.paused, probeId}
end
return {released, left, wake, heldBy.max_active, heldBy.rate, heldBy.paused}
