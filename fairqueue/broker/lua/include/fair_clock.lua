--[[
  fairqueue's fair clock, included by add_jobs, add_delayed and adopt_page.

  Places jobs by weighted fair queueing with a self-clocked virtual time
  (fairqueue.scheduler.FairClock is the same rule in Python, and the tests hold the two
  together). A flow is a (level, tenant) pair; its weight is the level's weight split
  among the level's tenants with work by their tenant weights. A job's tag is
  max(flow's last tag, virtual time) + SCALE * level total / (level weight * tenant
  weight). Its place in BullMQ's prioritized set is the score
    FLOOR * 2^32 + floor((tag - base) * SUB) * 4 + the level's rank (critical 0 .. low 3)
  written over the score BullMQ's own add gave it (priority * 2^32 + a FIFO counter): the
  whole 53-bit score is fairqueue's fixed-point tag, so the order keeps 1/SUB of a tag's
  resolution at any backlog (ties go to the higher weight, then the job id). The job's
  BullMQ priority (its hash's and opts' priority) is the cap: BullMQ's own scripts re-add
  a job that runs again (a retry, a promoted backoff, a rate-limited re-add) at that
  priority, behind everything, where the pass adopts it by the fair clock (docs/design.md, "Every attempt is a turn"). The virtual time is the start tag of the first
  tagged job waiting, read from its score (its finish tag less one turn of a lone
  weight-1 tenant of its level: a start tag or a little past it), never going back; a
  flow whose last tag is not ahead of it has no work left and stops counting towards its
  level's total.

  Keys (the table K):
    K.prioritized  BullMQ's prioritized set (read: the head of the tag band)
    K.state        hash: vt, base, rbDelta, rbCursor (a paged rebase in progress),
                   W:<level> (sum of the weights of the level's flows with work),
                   holds (set while a tenant is paused or catching up: tenant_limits.lua)
    K.flows        zset: "<level>\n<tenant>" -> last tag, flows with work
    K.flows .. ':' .. "<level>\n<tenant>"
                   list: a flow's line, the ids of its placed jobs in the order placed
                   (fqLinePush), for an overdue job to take its flow's first place
    K.fweights     hash: "<level>\n<tenant>" -> the weight counted in W:<level>;
                   "j\n<level>\n<tenant>" -> a joining flow's catch-up horizon (fqPlace);
                   "s\n<level>\n<tenant>" -> the share its last job was placed with
                   (its spacing: a flow joining beside its backlog is placed at it)
    K.jobs         hash: delayed job id -> "<level>\n<weight>\n<ready ms>\n<tenant>", where
                   fairqueue 0.1 kept a delayed job's meta (now in its opts: fqMeta);
                   read and emptied by the pass
    K.ready        zset: second -> second, the seconds (Redis's clock) in which jobs
                   became ready; K.ready .. ':' .. second is a list of those jobs' ids
                   (a few bytes a job: fairqueue's index costs little beside BullMQ's)
  Service is worker time (docs/design.md, "Service is worker time"): with fairness by time, a job's step is
  multiplied by its cost in turns, its flow's estimated run time over the queue's
  typical one (fqCostTurns, the same grid as fairqueue.scheduling.order.cost_turns), and
  the pass charges a flow what its attempts used beyond that (history_record). The
  estimates live in K.state: 'typ' (the queue's typical run time, ms) and
  'c:<level>\n<tenant>' (a flow's, ms), 'p:<level>\n<tenant>' (a charge carried to a flow's
  next job: what its runs overran after it had no work, history_commit.lua); 'unit' is the typical time when the queue last
  started from idle (or was first measured), and a cost in turns is placed times
  typ / unit (fqTurnScale, as fairqueue.scheduling.order.turn_scale), so tags placed
  while the typical time moves stay in one currency.
  Constants FLOOR, CAP, SCALE, SUB, EXPIRE_PER_CALL and the cost bounds are filled in when
  the script loads.
]]
--- @include wire
local fqFloor = {{FLOOR}}
local fqCap = {{CAP}}
local fqScale = {{SCALE}}
local fqExpirePerCall = {{EXPIRE_PER_CALL}}
local fqFrontierScan = {{FRONTIER_SCAN}}
local fqLineScan, fqLineTrimEvery, fqLineTtl = {{LINE_SCAN}}, {{LINE_TRIM_EVERY}}, {{LINE_TTL_MS}}
local fqSub = {{SUB}}
local fqMinCost, fqMaxCost, fqDeadBand = {{MIN_COST}}, {{MAX_COST}}, {{COST_DEAD_BAND}}
local fqScore = 4294967296
-- The first score at the cap, as text once (a float's %.17g costs more than a placement).
local fqBelowCap = '({{CAP_SCORE}}'
-- A level's rank (its weight is 4 less its rank: critical 4 .. low 1).
local fqLevelRank = {critical = 0, high = 1, normal = 2, low = 3}
local fqRankLevel = {[0] = 'critical', [1] = 'high', [2] = 'normal', [3] = 'low'}

local function fqNowMs()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The virtual time a head at score stands for: its finish tag (as the score keeps it)
-- less one turn of a lone weight-1 tenant of its level (the rank in the score's low bits).
local function fqStartOf(c, score)
  local units = score - fqFloor * fqScore
  local tag = c.base + math.floor(units / 4) / fqSub
  if c.cursor and score <= c.cursor then tag = tag + c.delta end
  return tag - fqScale / (4 - units % 4) -- a level's weight is 4 less its rank
end

-- A job's cost in turns: its estimate over the queue's typical run time, on a grid of
-- quarter powers of two, 1 within the dead band or with nothing measured yet.
local function fqCostTurns(estimate, typical)
  if not estimate or not typical or estimate <= 0 or typical <= 0 then return 1 end
  local ratio = estimate / typical
  if ratio > 1 / fqDeadBand and ratio < fqDeadBand then return 1 end
  local quarters = math.floor(math.log(ratio) / math.log(2) * 4 + 0.5)
  if quarters < -16 then quarters = -16 elseif quarters > 16 then quarters = 16 end
  return 2 ^ (quarters / 4)
end

-- How long a turn is in tags now: the typical run time over the unit (K.state 'unit'),
-- within the cost bounds; 1 with either unknown.
local function fqTurnScale(typical, unit)
  if not typical or not unit or typical <= 0 or unit <= 0 then return 1 end
  local scale = typical / unit
  if scale < fqMinCost then return fqMinCost elseif scale > fqMaxCost then return fqMaxCost end
  return scale
end

-- A write of K.state: at once, or (a call whose clock defers its writes: c.defer) kept in
-- c.pending for the one HSET of fqFlush, where the last value of each field is written.
-- (Allocation-light on purpose: in Redis a script's tables and strings cost more than the
-- Lua that fills them, through the garbage collector over the loaded scripts.)
local function fqStateSet(K, c, field, value)
  if c.defer then
    local pending = c.pending
    if not pending then
      pending = {}
      c.pending = pending
    end
    pending[field] = value
  else
    redis.call('HSET', K.state, field, value)
  end
end

-- The virtual time and the score mapping, read once per script call: nothing else runs
-- while a script does, so only its own placements can change the head (fqPlaced).
-- defer (the add script): K.state's writes wait for fqFlush, one HSET (and an HDEL of
-- the fields an idle reset clears that nothing wrote again) instead of one per step.
-- costMember (optional): a flow whose worker-time estimate ('c:<flow>') comes in the
-- same read, instead of an HGET on first use (fqCostOf): a lone job's flow.
local function fqClock(K, defer, costMember)
  -- With the typical run time and the levels' totals in the same read (nothing in these
  -- scripts writes 'typ'; the totals serve a memo until something else writes them), and
  -- the tenant limits' 'holds' flag (a tenant paused or catching up), and the unit.
  local st
  if costMember then
    st = redis.call('HMGET', K.state, 'vt', 'base', 'rbDelta', 'rbCursor', 'typ',
      'W:critical', 'W:high', 'W:normal', 'W:low', 'holds', 'unit', 'c:' .. costMember,
      'p:' .. costMember)
  else
    st = redis.call('HMGET', K.state, 'vt', 'base', 'rbDelta', 'rbCursor', 'typ',
      'W:critical', 'W:high', 'W:normal', 'W:low', 'holds', 'unit')
  end
  local c = {vt = tonumber(st[1]) or 0, base = tonumber(st[2]) or 0,
    delta = tonumber(st[3]), cursor = tonumber(st[4]), typical = tonumber(st[5]) or false,
    costs = false, readTotals = {critical = tonumber(st[6]) or 0, high = tonumber(st[7]) or 0,
      normal = tonumber(st[8]) or 0, low = tonumber(st[9]) or 0}, holds = st[10],
    defer = defer}
  c.scale = fqTurnScale(c.typical, tonumber(st[11]))
  if costMember and c.typical then
    c.costs = {[costMember] = st[12] and fqCostTurns(tonumber(st[12]), c.typical) or false}
    c.carried = {[costMember] = tonumber(st[13]) or 0}
  end
  local head = redis.call('ZRANGEBYSCORE', K.prioritized, fqFloor * fqScore,
    fqBelowCap, 'WITHSCORES', 'LIMIT', 0, 1)
  if #head == 0 then
    -- Nothing tagged is waiting, so every flow is idle: start afresh at the floor. A
    -- level's total other than 0 means flows are counted (kept with their weights), so
    -- the read already says a reset is due; only a clean-looking state asks whether flows
    -- are left (an EXISTS). With a queue kept empty by its workers, every add resets.
    local t = c.readTotals
    local counted = t.critical ~= 0 or t.high ~= 0 or t.normal ~= 0 or t.low ~= 0
    if c.base ~= c.vt or c.delta or counted or redis.call('EXISTS', K.flows) == 1 then
      redis.call('UNLINK', K.flows, K.fweights)
      if defer then
        -- fqFlush deletes what the read found of rbDelta, rbCursor and the totals (not
        -- all six blindly), less what this call writes again; base and vt already set
        -- and equal need no write.
        c.cleared = st
        if not (st[1] and st[2] and c.base == c.vt) then
          fqStateSet(K, c, 'base', c.vt)
          fqStateSet(K, c, 'vt', c.vt)
        end
      else
        redis.call('HDEL', K.state, 'rbDelta', 'rbCursor', 'W:critical', 'W:high',
          'W:normal', 'W:low')
        redis.call('HSET', K.state, 'base', c.vt, 'vt', c.vt)
      end
      t.critical, t.high, t.normal, t.low = 0, 0, 0, 0
      c.flowsEmpty = true -- until a memo writes them: nothing to read or retire
    end
    -- Nothing is placed: a turn is the typical time from here on (the unit).
    if st[5] and st[11] ~= st[5] then
      fqStateSet(K, c, 'unit', st[5])
      c.scale = 1
    end
    c.base, c.delta, c.cursor = c.vt, nil, nil
    return c
  end
  c.headScore = tonumber(head[2])
  local start = fqStartOf(c, c.headScore)
  if start > c.vt then
    c.vt = start
    fqStateSet(K, c, 'vt', string.format('%.17g', start))
  end
  return c
end

-- The cost in turns of a job of flow member placed now: 1 when fairness counts jobs
-- (c.byTime false); else from the flow's estimate in K.state (what its runs measured),
-- times the turn's length now (c.scale: fqTurnScale),
-- read once per call and flow. explicitMs, the caller's cost= (ms), places a job only of
-- a flow with nothing measured yet: a declared cost never buys share once runs are
-- measured (docs/design.md, "Service is worker time"). A second result, true: the flow
-- has nothing measured (a cold start), the cost is a guess its runs will settle.
-- With the cost, its flow's estimate read on first use, the flow's carried charge
-- ('p:<member>' in K.state: what its runs overran, or underran, after it had no work
-- left, in turns as placed now; history_commit.lua) goes into c.carried[member].
local function fqCostOf(K, c, member, explicitMs)
  if not c.byTime then return 1 end
  if not c.typical then return 1, true end
  local turns = nil -- false: nothing measured for the flow
  if c.costs then turns = c.costs[member] end
  if turns == nil then
    local row = redis.call('HMGET', K.state, 'c:' .. member, 'p:' .. member)
    local estimate = tonumber(row[1])
    turns = estimate and fqCostTurns(estimate, c.typical) or false
    if not c.costs then c.costs, c.carried = {}, {} end -- made on first use: most calls have none
    c.costs[member] = turns
    c.carried[member] = tonumber(row[2]) or 0
  end
  if turns then return turns * c.scale end
  if explicitMs then return fqCostTurns(explicitMs, c.typical) * c.scale, true end
  return c.scale, true
end

-- A waiting job's tag placed again (FairClock's replaced_tag): its distance from the anchor
-- times the ratio, the shift later; a refund (shift < 0) never behind the anchor nor onto
-- another of its flow (within twice the refund of the anchor, half as far from it).
local function fqReplaced(tag, anchor, ratio, shift)
  return math.max(anchor + (tag - anchor) * ratio / 2, anchor + shift + (tag - anchor) * ratio)
end

-- The score of a tag of a level; nil when there is no room (the job waits, parked).
local function fqScoreOf(c, tag, level)
  local score = fqFloor * fqScore + math.floor((tag - c.base) * fqSub) * 4 + fqLevelRank[level]
  if c.cursor and score <= c.cursor then score = score - c.delta * fqSub * 4 end
  if score < fqFloor * fqScore then score = fqFloor * fqScore + fqLevelRank[level] end
  if score >= fqCap * fqScore then return nil end
  return score
end

-- A call's memo of the flows it places (c.memo, set by add_jobs for a call of more than
-- one job): each flow's last tag and counted weight and each level's total read once per
-- call, written once by fqFlush.
-- Nothing else runs while a script does, so the memo is the flows' state until then.
local function fqNewMemo()
  return {flows = {}, totals = {}, dirtyTotals = {}, groups = {}, fields = {}}
end

-- Write what the memo changed (one ZADD, one HSET of the weights, one of K.state: the
-- totals with the clock's deferred writes, c.pending), after one HDEL of the fields an
-- idle reset cleared (c.cleared: the clock's read) that nothing wrote again.
local function fqFlush(K, c)
  local m = c.memo
  if not m and not c.defer then return end
  local totals = {}
  if c.defer then
    local pending, cleared = c.pending, c.cleared
    c.pending, c.cleared = nil, nil
    if cleared then
      local drops = totals -- empty until the HDEL is sent: the same table serves the HSET
      if cleared[3] then drops[#drops + 1] = 'rbDelta' end
      if cleared[4] then drops[#drops + 1] = 'rbCursor' end
      for level, rank in pairs(fqLevelRank) do -- the totals, read at 6..9; one written
        -- below is not deleted
        local field = 'W:' .. level
        if cleared[6 + rank] and not (m and m.dirtyTotals[level])
          and not (pending and pending[field]) then
          drops[#drops + 1] = field
        end
      end
      if #drops > 0 then
        redis.call('HDEL', K.state, unpack(drops))
        totals = {}
      end
    end
    if pending then
      for field, value in pairs(pending) do
        totals[#totals + 1] = field
        totals[#totals + 1] = value
      end
    end
    if not m then
      if #totals > 0 then redis.call('HSET', K.state, unpack(totals)) end
      return
    end
  end
  local tags, weights = {}, {}
  for member, f in pairs(m.flows) do
    if f.tagDirty then
      tags[#tags + 1] = string.format('%.17g', f.last)
      tags[#tags + 1] = member
      f.tagDirty = false
    end
    if f.weightDirty then
      weights[#weights + 1] = member
      weights[#weights + 1] = f.counted
      f.weightDirty = false
    end
    if f.horizonDirty then
      weights[#weights + 1] = 'j\n' .. member
      weights[#weights + 1] = string.format('%.17g', f.horizon)
      f.horizonDirty = false
    end
    if f.spacingDirty then
      weights[#weights + 1] = 's\n' .. member
      weights[#weights + 1] = f.spacing
      f.spacingDirty = false
    end
  end
  for field, value in pairs(m.fields) do -- accounts' fields (fqAccountPut)
    weights[#weights + 1] = field
    weights[#weights + 1] = value
  end
  m.fields = {}
  for level in pairs(m.dirtyTotals) do
    totals[#totals + 1] = 'W:' .. level
    totals[#totals + 1] = m.totals[level]
  end
  m.dirtyTotals = {}
  if #tags > 0 then redis.call('ZADD', K.flows, unpack(tags)) end
  if #weights > 0 then redis.call('HSET', K.fweights, unpack(weights)) end
  if #tags > 0 or #weights > 0 then c.flowsEmpty = false end
  if #totals > 0 then redis.call('HSET', K.state, unpack(totals)) end
end

-- Retire flows the virtual time has passed (once per vt; a memo is written first, so the
-- scan sees every tag, and dropped after a retirement, so nothing stale is kept).
local function fqExpire(K, c)
  if c.expiredAt == c.vt then return end
  if c.flowsEmpty then c.expiredAt = c.vt; return end
  -- at most EXPIRE_PER_CALL flows a script call, however many jobs it places (a release
  -- of many tenants' jobs moves the virtual time at each): the rest retire in later calls
  local room = fqExpirePerCall - (c.expired or 0)
  if room <= 0 then return end
  fqFlush(K, c)
  local gone = redis.call('ZRANGEBYSCORE', K.flows, '-inf', c.vt, 'LIMIT', 0, room)
  c.expired = (c.expired or 0) + #gone
  if #gone > 0 then
    -- a command each for all of them, not five per flow
    local asked = {}
    for i = 1, #gone do asked[2 * i - 1], asked[2 * i] = gone[i], 's\n' .. gone[i] end
    local weights = redis.call('HMGET', K.fweights, unpack(asked))
    local byLevel, fields, lines = {}, {}, {}
    for i = 1, #gone do
      local level = string.match(gone[i], '^[^\n]*')
      local w, account = tonumber(weights[2 * i - 1]) or 0, fqFlowAccount(weights[2 * i])
      if account then
        -- a flow of an account: its level counts the account's weight until the account's
        -- last flow goes, and the account's state goes with it (docs/design.md, "Accounts")
        local g = fqAccountMember(level, account)
        local st = fqAccountStateSplit(redis.call('HGET', K.fweights, g))
        if st then st.T = st.T - w end
        if not st or st.T <= 0 then
          w = st and st.A or 0
          redis.call('HDEL', K.fweights, g)
        else
          w = 0
          redis.call('HSET', K.fweights, g, fqAccountStatePack(st))
        end
      end
      byLevel[level] = (byLevel[level] or 0) + w
      fields[#fields + 1], fields[#fields + 2], fields[#fields + 3] = gone[i], 'j\n' .. gone[i],
        's\n' .. gone[i]
      lines[i] = K.flows .. ':' .. gone[i] -- its line: no job of it waits
    end
    for level, w in pairs(byLevel) do
      if w ~= 0 then redis.call('HINCRBY', K.state, 'W:' .. level, -w) end
    end
    redis.call('HDEL', K.fweights, unpack(fields))
    redis.call('ZREM', K.flows, unpack(gone))
    redis.call('UNLINK', unpack(lines))
    c.readTotals = nil -- the totals changed: read them again
    if c.memo then c.memo = fqNewMemo() end
  end
  if #gone < room then c.expiredAt = c.vt end
end

-- The last tag of the level's flow that reaches furthest ahead of the virtual time, and
-- the least share the level's flows among them placed their last jobs with (nil: none
-- among the fqFrontierScan flows that reach furthest, of every level): where the
-- backlogs the level's tenants placed before a flow joined end, and their densest spacing
-- (an account's flows: their account's density, 'd\n<account member>').
-- With account: of that account's flows of the level among them, and the least account
-- split they were placed with ('n\n<member>'): the joining rule inside the account.
local function fqFrontier(K, c, level, account)
  fqFlush(K, c) -- the memo's tags too
  local top = redis.call('ZREVRANGEBYSCORE', K.flows, '+inf', '(' .. string.format('%.17g',
    c.vt), 'WITHSCORES', 'LIMIT', 0, fqFrontierScan)
  local prefix = fqFlowPrefix(level)
  local tags, fields = {}, {}
  for i = 1, #top, 2 do
    if string.sub(top[i], 1, #prefix) == prefix then
      tags[#tags + 1] = tonumber(top[i + 1])
      fields[#fields + 1] = 's\n' .. top[i] -- a spacing, or the flow's account and split
    end
  end
  if #tags == 0 then return nil end
  local frontier, densest, grouped = nil, nil, nil
  local row = redis.call('HMGET', K.fweights, unpack(fields))
  for j = 1, #tags do
    local spacing, owner, part = tonumber(row[j]), fqFlowAccountSplit(row[j])
    if account then
      spacing = part
      if owner == account then
        if not frontier then frontier = tags[j] end
        if spacing and (not densest or spacing < densest) then densest = spacing end
      end
    elseif owner then
      grouped = grouped or {}
      grouped[#grouped + 1] = fqAccountMember(level, owner)
    elseif spacing and (not densest or spacing < densest) then
      densest = spacing
    end
  end
  if account then return frontier, densest end
  -- the densest spacing among them: a backlog placed while fewer tenants had work is
  -- that dense, though its flow's last jobs (past an earlier horizon) may not be
  if grouped then -- an account's density, or its spacing where they are equal
    for _, value in ipairs(redis.call('HMGET', K.fweights, unpack(grouped))) do
      local st = fqAccountStateSplit(value)
      local spacing = st and (st.density or st.spacing)
      if spacing and (not densest or spacing < densest) then densest = spacing end
    end
  end
  return tags[1], densest
end

-- The flow's last tag moves on to tag when it is further: in the call's memo (m, f: the
-- flow's state, written once by fqFlush) or at once in fq:flows.
local function fqKeepLast(K, c, f, m, member, tag, last)
  if last and tag <= last then return end
  if m then
    f.last, f.tagDirty = tag, true
  else
    redis.call('ZADD', K.flows, string.format('%.17g', tag), member)
    c.flowsEmpty = false
  end
end

-- A flow joining its level's backlogs (none of its own, other accounts with work): where
-- those backlogs end (fqFrontier) when that is past its start, and the spacing it is
-- placed at until it gets there (the others' split, or their densest when less).
-- Returns horizon, catch-up spacing and joined (nil: it joins nothing, both kept).
local function fqJoin(K, c, level, start, others, horizon, catchUp)
  local joined, frontierSpacing = fqFrontier(K, c, level)
  if not (joined and joined > start) then return horizon, catchUp, nil end
  if frontierSpacing and frontierSpacing < others then return joined, frontierSpacing, joined end
  return joined, others, joined
end

-- Write an account flow's fields (field, value, ...): at once, or with a memo in its
-- pending fields (fqFlush's HSET).
local function fqAccountPut(K, c, fields)
  local m = c.memo
  if m then
    for i = 1, #fields, 2 do m.fields[fields[i]] = fields[i + 1] end
  else
    redis.call('HSET', K.fweights, unpack(fields))
    c.flowsEmpty = false
  end
end

-- An account's state in a level (its member g, fqAccountStatePack's field): read once
-- per call with a memo, or in the flow's own read (fqPlace: f.pre) when the job's
-- account is the one its flow counts under; {T = 0}: no flow of it has work.
local function fqAccountState(K, c, f, g)
  local m = c.memo
  local st = m and m.groups[g]
  local pre, preOf = f.pre, f.preOf
  f.pre, f.preOf = nil, nil
  if f.inner == nil then f.inner = false end -- a flow of none before (a new one)
  if st then return st end
  if c.flowsEmpty then
    st = nil
  elseif preOf == g then
    st = fqAccountStateSplit(pre)
  else
    st = fqAccountStateSplit(redis.call('HGET', K.fweights, g))
  end
  st = st or {T = 0, A = 1}
  if m then m.groups[g] = st end
  return st
end

-- A job's cost with the charge its flow carried (fqCostOf's c.carried: what its runs
-- overran after it had no work, paid with this job's turn): a refund past its cost is left
-- for the flow's next job, each paying at least the least cost, so none is placed at or
-- behind its start (FairClock.place). Returns the cost to place it at, the charge carried
-- and what is left of it (nil: nothing).
local function fqPay(c, member, cost)
  local carried = c.carried and c.carried[member] or 0
  local pay = cost + carried
  local least = cost < fqMinCost and cost or fqMinCost
  if pay < least then return least, carried, pay - least end
  return pay, carried, nil
end

-- The job was placed: what its flow carried is paid, or what is left of it kept.
local function fqPaidCarried(K, c, member, carried, left)
  if carried == 0 then return end
  c.carried[member] = left or 0
  if left then
    redis.call('HSET', K.state, 'p:' .. member, string.format('%.17g', left))
  else
    redis.call('HDEL', K.state, 'p:' .. member)
  end
end

-- fqPlace for a flow of an account (docs/design.md, "Accounts"): the level's accounts
-- share it by account weight (a tenant without an account is one of its own weight), an
-- account's tenants share its part by tenant weight; an account joining the level is
-- placed at the spacing of the backlogs reaching furthest until it reaches their end, as
-- a tenant joining its account's flows with work is inside the account (unless its
-- account is catching up itself). FairClock.place(account=...) is the same rule.
-- Bounded work: two HMGETs of fweights, one frontier read on a join, one HSET.
local function fqPlaceInAccount(K, c, f, member, level, weight, explicitMs, stored, account,
    accountWeight)
  local g = fqAccountMember(level, account)
  local st = fqAccountState(K, c, f, g)
  local m = c.memo
  local levelTotal = m and m.totals[level] or (c.readTotals and c.readTotals[level])
  if not levelTotal then
    levelTotal = tonumber(redis.call('HGET', K.state, 'W:' .. level)) or 0
  end
  if m then m.totals[level] = levelTotal end
  local last, counted = f.last, f.counted
  if stored and counted > 0 then weight = counted end
  local mates = st.T - counted
  if mates < 0 then mates = 0 end
  if stored and mates > 0 then accountWeight = st.A end
  local others = levelTotal - (st.T > 0 and st.A or 0)
  local start = c.vt
  local behind = last and last > start
  if behind then start = last end
  local horizon = st.horizon
  local joined = nil
  local catchUp = st.spacing or others
  if counted == 0 and others > 0 and mates == 0 then
    horizon, catchUp, joined = fqJoin(K, c, level, start, others, horizon, catchUp)
  end
  local catching = horizon and start < horizon
  local split = others + accountWeight
  if catching then split = catchUp end
  -- one level down: a tenant joining its account's flows with work
  local inner, newInner = f.inner, false
  if counted == 0 and mates > 0 and not catching then
    local found, densest = fqFrontier(K, c, level, account)
    if found and found > start then
      if not densest or densest > mates then densest = mates end
      inner, newInner = {found, densest}, true
    end
  end
  local part = mates + weight
  local innerDone = inner and start >= inner[1]
  if inner and not innerDone then part = inner[2] end
  local share = split * part / accountWeight
  local cost, cold = fqCostOf(K, c, member, explicitMs)
  local pay, carried, left = fqPay(c, member, cost)
  local tag = start + fqScale * pay * share / ((4 - fqLevelRank[level]) * weight)
  local score = fqScoreOf(c, tag, level)
  if score then fqPaidCarried(K, c, member, carried, left) end
  if not score then return score, behind, cold and cost or nil end
  local total = others + accountWeight
  if total ~= levelTotal then
    if m then
      m.totals[level], m.dirtyTotals[level] = total, true
    else
      fqStateSet(K, c, 'W:' .. level, total)
      if c.readTotals then c.readTotals[level] = total end
    end
  end
  -- what changed only: a flow with work placed again beside the same flows writes none
  local density = split * part / (mates + weight)
  if density == split then density = nil end -- read as its spacing
  local horizonNow = st.horizon
  if joined then
    horizonNow = joined
  elseif horizon and start >= horizon then
    horizonNow = nil -- caught up: its share as any account's
  end
  local fields = nil -- made only when something changed (a flow placed again: nothing)
  if st.T ~= mates + weight or st.A ~= accountWeight or st.spacing ~= split
      or st.density ~= density or st.horizon ~= horizonNow then
    st.T, st.A, st.spacing, st.density, st.horizon = mates + weight, accountWeight, split,
      density, horizonNow
    fields = {g, fqAccountStatePack(st)}
  end
  local innerNow = f.inner
  if newInner then innerNow = inner elseif innerDone then innerNow = false end
  if counted ~= weight then
    f.counted = weight
    fields = fields or {}
    fields[#fields + 1], fields[#fields + 2] = member, weight
  end
  if f.account ~= account or f.part ~= part or innerNow ~= f.inner then
    f.account, f.part, f.inner = account, part, innerNow
    fields = fields or {}
    fields[#fields + 1] = 's\n' .. member
    fields[#fields + 1] = fqFlowAccountPack(account, part, innerNow and innerNow[1],
      innerNow and innerNow[2])
  end
  if fields then fqAccountPut(K, c, fields) end
  fqKeepLast(K, c, f, m, member, tag, last)
  return score, behind, cold and cost or nil, c.byTime and cost or nil
end

-- Place one job of (level, tenant, weight); returns its score (nil: no room). Every job,
-- an overdue one included, takes its flow's next turn and is charged for it: an overdue
-- job never takes a turn from another flow (docs/design.md, "The wait bound").
-- A flow that joins a level whose other tenants have backlogs is placed at their spacing
-- (the level's weight split among the others, as their jobs were placed) until it
-- reaches where those backlogs end (its horizon), so it gets its round-robin turn from
-- its first job instead of paying for theirs (docs/design.md, "Joining a level").
-- explicitMs: the caller's cost= (ms) or nil. Returns the job's score (nil: parked),
-- whether its flow had a job waiting ahead of it (its line is kept only then: fqLinePush),
-- and, for a job placed with nothing measured for its flow (fairness by time), the cost
-- it paid (turns times the turn's length: the add script keeps it in the job's fqPaid,
-- so the pass charges the job's run against what it paid, not against a later estimate),
-- and with fairness by time the cost it paid whatever its flow's estimate (fqCost: the
-- same, for a job placed by its flow's estimate: a young estimate's error is owed).
-- stored: weight is the one stored with the job when it was enqueued (a delayed or held
-- job, a rerun), not looked up now: a flow with work places it by the weight it counts
-- (the newer one, after a weight change: reweight.lua), so a stored weight never undoes it.
local function fqPlace(K, c, level, tenant, weight, explicitMs, stored, account, accountWeight)
  fqExpire(K, c)
  local member = fqFlowMember(level, tenant)
  local m = c.memo
  local f = m and m.flows[member]
  if not f and c.flowsEmpty then
    f = {last = nil, counted = 0} -- the flows were cleared by this call's clock
    if m then m.flows[member] = f end
  elseif not f then
    -- a job of an account: its account's state in the same read (fqAccountState)
    local g = account and fqAccountMember(level, account)
    local row
    if g then
      row = redis.call('HMGET', K.fweights, member, 'j\n' .. member, 's\n' .. member, g)
    else
      row = redis.call('HMGET', K.fweights, member, 'j\n' .. member, 's\n' .. member)
    end
    local of, part, innerHorizon, innerSplit = fqFlowAccountSplit(row[3])
    f = {last = tonumber(redis.call('ZSCORE', K.flows, member)),
      counted = tonumber(row[1]) or 0, horizon = tonumber(row[2]), spacing = tonumber(row[3]),
      account = of, part = part, inner = innerHorizon and {innerHorizon, innerSplit} or false,
      pre = g and row[4], preOf = g}
    if m then m.flows[member] = f end
  end
  -- A flow with work keeps the account it counts under (none: its own account).
  if f.counted > 0 then account = f.account end
  if account then
    return fqPlaceInAccount(K, c, f, member, level, weight, explicitMs, stored, account,
      accountWeight or 1)
  end
  local levelTotal = m and m.totals[level] or (c.readTotals and c.readTotals[level])
  if not levelTotal then
    levelTotal = tonumber(redis.call('HGET', K.state, 'W:' .. level)) or 0
  end
  if m then m.totals[level] = levelTotal end
  local last, counted = f.last, f.counted
  if stored and counted > 0 then weight = counted end
  local others = levelTotal - counted
  local total = others + weight
  local start = c.vt
  local behind = last and last > start
  if behind then start = last end
  local horizon = f.horizon
  local joined = nil
  -- While it catches up, a joining flow keeps the spacing it joined at: that of the
  -- backlog reaching furthest, whatever tenants joined since (others before the upgrade).
  local catchUp = f.spacing or others
  if counted == 0 and others > 0 then
    horizon, catchUp, joined = fqJoin(K, c, level, start, others, horizon, catchUp)
  end
  local share = total
  if horizon and start < horizon then share = catchUp end
  local cost, cold = fqCostOf(K, c, member, explicitMs)
  -- A charge its runs left after the flow had no work: paid with this job's turn.
  local pay, carried, left = fqPay(c, member, cost)
  local tag = start + fqScale * pay * share / ((4 - fqLevelRank[level]) * weight)
  local score = fqScoreOf(c, tag, level)
  if score then fqPaidCarried(K, c, member, carried, left) end
  if score then
    -- Placed: the flow counts towards its level (a parked job changes nothing), and its
    -- spacing is kept for a flow joining beside it.
    local spaced = f.spacing ~= share
    if counted ~= weight then
      if m then
        m.totals[level], m.dirtyTotals[level] = total, true
        f.counted, f.weightDirty = weight, true
      else
        fqStateSet(K, c, 'W:' .. level, total)
        if spaced then
          redis.call('HSET', K.fweights, member, weight, 's\n' .. member, share)
        else
          redis.call('HSET', K.fweights, member, weight)
        end
        if c.readTotals then c.readTotals[level] = total end
        c.flowsEmpty = false
      end
    elseif spaced and not m then
      redis.call('HSET', K.fweights, 's\n' .. member, share)
    end
    if spaced then
      f.spacing = share
      if m then f.spacingDirty = true end
    end
    if joined then
      f.horizon = joined
      if m then f.horizonDirty = true
      else redis.call('HSET', K.fweights, 'j\n' .. member, string.format('%.17g', joined)) end
    elseif horizon and start >= horizon then
      f.horizon, f.horizonDirty = nil, false -- caught up: its share as any tenant's
      redis.call('HDEL', K.fweights, 'j\n' .. member)
    end
    fqKeepLast(K, c, f, m, member, tag, last)
  end
  return score, behind, cold and cost or nil, c.byTime and cost or nil
end

-- After placing a job at score (nil: parked): a job ahead of the head is the new head,
-- and the virtual time moves to what it stands for.
local function fqPlaced(K, c, score)
  if score and (not c.headScore or score < c.headScore) then
    c.headScore = score
    local start = fqStartOf(c, score)
    if start > c.vt then
      c.vt = start
      fqStateSet(K, c, 'vt', string.format('%.17g', start))
    end
  end
end

-- The BullMQ priority of a score (nil: parked at the cap).
local function fqPriorityOf(score)
  if not score then return fqCap end
  return math.floor(score / fqScore)
end

-- Put a job BullMQ just added or re-added at fqPriorityOf(score) at its fairqueue score
-- (BullMQ already stored that priority in the job hash).
local function fqSetScore(K, jobId, score)
  -- A score is a whole number below 2^53: '%d' writes it exactly, without %.17g's cost.
  redis.call('ZADD', K.prioritized, 'XX', string.format('%d', score), jobId)
end

-- Index a job by the second it became ready, for the pass's overdue count (its level is
-- in its score; a delayed job's meta is in K.jobs): no payload is ever decoded for it.
-- The second is registered in K.ready when its list is made (RPUSH returns the new length:
-- the number pushed when the list was new). A list that exists was registered when it was
-- made, in the same script: the index's scripts delete a second's list with or before
-- its K.ready entry, in one call (index_walk, forget_obliterated), never the entry alone.
local function fqIndexMany(K, jobIds, readyMs)
  if #jobIds == 0 then return end
  local second = string.format('%d', math.floor(readyMs / 1000))
  if redis.call('RPUSH', K.ready .. ':' .. second, unpack(jobIds)) == #jobIds then
    redis.call('ZADD', K.ready, 'NX', second, second)
  end
end
local function fqIndex(K, jobId, readyMs)
  fqIndexMany(K, {jobId}, readyMs)
end

-- A flow's line (K.flows .. ':' .. member): the ids of its placed jobs in the order they
-- were placed, so that an overdue job can take its flow's first place (fqLineFront): a
-- job placed with nothing of its flow waiting ahead (about to run) is left out, so a flow
-- whose jobs never wait behind each other (a queue its workers keep empty) keeps no line. Ids
-- of jobs that left (taken, removed, or back at the cap to run again) are trimmed off its
-- front each time it passes another fqLineTrimEvery ids, when it also gets fqLineTtl to
-- live: a line nothing was added to for that long is dropped (its flow's overdue jobs then
-- take their turns at the back, as any job). Bounded work per push: one RPUSH, and every
-- fqLineTrimEvery ids an LRANGE of 2 * fqLineTrimEvery and a ZSCORE each.
local function fqLineTrim(K, key)
  local ids = redis.call('LRANGE', key, 0, 2 * fqLineTrimEvery - 1)
  local gone = 0
  for i = 1, #ids do
    local score = tonumber(redis.call('ZSCORE', K.prioritized, ids[i]))
    if score and score >= fqFloor * fqScore and score < fqCap * fqScore then break end
    gone = i
  end
  if gone > 0 then redis.call('LTRIM', key, gone, -1) end
end

local function fqLinePush(K, member, ids)
  if #ids == 0 then return end
  local key = K.flows .. ':' .. member
  local n = redis.call('RPUSH', key, unpack(ids))
  if n == #ids or math.floor(n / fqLineTrimEvery) ~= math.floor((n - #ids) / fqLineTrimEvery) then
    fqLineTrim(K, key)
    redis.call('PEXPIRE', key, fqLineTtl)
  end
end

-- When a job became ready (the wait bound's start), from its hash's fqRel, opts (decoded)
-- and timestamp: its first release when its tenant's limit held it, else fqReady in its
-- opts, else BullMQ's timestamp plus its delay, never later than now.
local function fqReadyFrom(released, opts, timestamp, now)
  local ready = tonumber(released) or tonumber(opts['fqReady'])
  if ready then return ready end
  local delay = 0
  if type(opts['delay']) == 'number' and opts['delay'] > 0 then delay = opts['delay'] end
  ready = (tonumber(timestamp) or now) + delay
  if ready > now then ready = now end
  return ready
end

-- The same, read from the job's hash.
local function fqReadyOf(prefix, jobId)
  local f = redis.call('HMGET', prefix .. jobId, 'fqRel', 'opts', 'timestamp')
  local ok, opts = pcall(cjson.decode, f[2] or 'null')
  if not (ok and type(opts) == 'table') then opts = {} end
  return fqReadyFrom(f[1], opts, f[3], fqNowMs())
end

-- An overdue job just placed at score (its flow's next turn, charged to its flow) takes
-- the place of its flow's first waiting job, if that job became ready no sooner, and that
-- job takes its turn at the back: the flow's turns (the scores it holds) are the same,
-- so no other flow is moved, and within its own line the overdue job goes first. The
-- first fqLineScan ids of the line are looked at; what is not found there (a line
-- dropped, or a flow placed before its line was kept) leaves the job where it is.
-- Returns the job's score.
local function fqLineFront(K, prefix, member, jobId, readyMs, score)
  local key = K.flows .. ':' .. member
  local ids = redis.call('LRANGE', key, 0, fqLineScan - 1)
  local first, firstScore, firstAt, gone = nil, score, nil, 0
  for i = 1, #ids do
    local s = ids[i] ~= jobId and tonumber(redis.call('ZSCORE', K.prioritized, ids[i]))
    if s and s >= fqFloor * fqScore and s < fqCap * fqScore then
      if s < firstScore then first, firstScore, firstAt = ids[i], s, i - 1 end
    elseif not first and gone == i - 1 then
      gone = i -- left: trimmed off the front
    end
  end
  if first and fqReadyOf(prefix, first) >= readyMs then
    redis.call('ZADD', K.prioritized, string.format('%d', firstScore), jobId)
    redis.call('ZADD', K.prioritized, string.format('%d', score), first)
    redis.call('LSET', key, firstAt, jobId)
    if gone > 0 then redis.call('LTRIM', key, gone, -1) end
    fqLinePush(K, member, {first})
    return firstScore
  end
  if gone > 0 then redis.call('LTRIM', key, gone, -1) end
  fqLinePush(K, member, {jobId})
  return score
end

-- A job placed again (adopted, recovered) at score: it joins its flow's line where its
-- flow had a job waiting ahead of it (fqPlace's behind), at the front if it is overdue
-- (fqLineFront), else at the back.
local function fqLineJoin(K, prefix, member, jobId, readyMs, score, behind, overdue)
  if score and behind and overdue then
    fqLineFront(K, prefix, member, jobId, readyMs, score)
  elseif score and behind then
    fqLinePush(K, member, {jobId})
  end
end
