--[[
  Read-only: where the fair clock would place a new job of a flow now, and who is asking,
  for job_status and estimate_start (fairqueue.broker.status_reads; the measured service
  rate, the history's buckets, it reads beside them).
  Included by job_status and estimate_start; writes nothing.

  fqEtaClock reads the clock as fqClock does (the virtual time moved to the first tagged
  job waiting; nothing tagged waiting: every flow idle, the clock starts afresh), and
  fqEtaPlace mirrors fqPlace (docs/design.md, "The rule", "Joining a level", "Accounts"):
  the flow's last tag, its counted weight and horizon, its level's total less the flows
  the virtual time has passed (at most EXPIRE_PER_CALL, as fqExpire retires them), the
  level's frontier for a joining flow, its cost in turns; for a tenant of an account, the
  hierarchical rule (level, then account, then tenant: fqPlaceInAccount) from its
  account's state. fairqueue.scheduling.placing.place is the same arithmetic in Python,
  and the tests hold both to what the add script does. Bounded: a flow's reads, at most
  EXPIRE_PER_CALL retired flows' and two frontier scans (FRONTIER_SCAN flows each).

  K: prioritized, wait, state, flows, fweights (as fair_clock's K).
]]
--- @include fair_clock
local fqEtaExpire = {{EXPIRE_PER_CALL}}

local function fqEtaNum(x)
  if x == nil or x == false then return '' end
  return string.format('%.17g', x)
end

local function fqEtaClock(K)
  local st = redis.call('HMGET', K.state, 'vt', 'base', 'rbDelta', 'rbCursor', 'typ',
    'W:critical', 'W:high', 'W:normal', 'W:low')
  local c = {vt = tonumber(st[1]) or 0, base = tonumber(st[2]) or 0,
    delta = tonumber(st[3]), cursor = tonumber(st[4]), typical = tonumber(st[5]) or false,
    totals = {critical = tonumber(st[6]) or 0, high = tonumber(st[7]) or 0,
      normal = tonumber(st[8]) or 0, low = tonumber(st[9]) or 0}, fresh = false}
  local head = redis.call('ZRANGEBYSCORE', K.prioritized, fqFloor * fqScore,
    fqBelowCap, 'WITHSCORES', 'LIMIT', 0, 1)
  if #head == 0 then
    c.fresh = true
    c.base, c.delta, c.cursor = c.vt, nil, nil
    c.totals = {critical = 0, high = 0, normal = 0, low = 0}
    return c
  end
  c.headScore = tonumber(head[2])
  local start = fqStartOf(c, c.headScore)
  if start > c.vt then c.vt = start end
  return c
end

-- Where n new jobs of (level, tenant, weight) of account (nil: none) of accountWeight
-- would be placed now. Returns a table: the inputs the Python model takes (last,
-- counted, horizon, total, frontier, cost; for a flow of an account, the account's state
-- and the flow's catch-up inside it) and the last job's tag and score (nil: no room,
-- parked at the cap). A flow with work keeps the account it counts under (fqPlace).
-- halfAt (optional): the tag after that many jobs is kept too (p.halfTag), so a caller
-- that wants the pace between two counts places the jobs once, not twice.
local function fqEtaPlace(K, c, level, tenant, weight, explicitMs, byTime, n, account,
    accountWeight, halfAt)
  local member = fqFlowMember(level, tenant)
  local p = {last = nil, counted = 0, horizon = nil, total = 0, frontier = nil, cost = 1}
  local st = {T = 0, A = 1}
  local inner = false
  if c.fresh then
    p.account = account
  else
    local row = redis.call('HMGET', K.fweights, member, 'j\n' .. member, 's\n' .. member)
    p.last = tonumber(redis.call('ZSCORE', K.flows, member))
    p.counted, p.horizon = tonumber(row[1]) or 0, tonumber(row[2])
    local of, _, innerHorizon, innerSplit = fqFlowAccountSplit(row[3])
    if of then
      inner = innerHorizon and {innerHorizon, innerSplit} or false
    else
      p.spacing = tonumber(row[3])
    end
    p.total = c.totals[level] or 0
    -- the flows the virtual time has passed, as fqExpire retires them: a flow of none
    -- takes its weight off its level, an account's last flow its account's weight
    local gone = redis.call('ZRANGEBYSCORE', K.flows, '-inf', string.format('%.17g', c.vt),
      'LIMIT', 0, fqEtaExpire)
    local prefix = fqFlowPrefix(level)
    local goneT = {}
    for i = 1, #gone do
      if string.sub(gone[i], 1, #prefix) == prefix then
        local r = redis.call('HMGET', K.fweights, gone[i], 's\n' .. gone[i])
        local w, owner = tonumber(r[1]) or 0, fqFlowAccount(r[2])
        if owner then goneT[owner] = (goneT[owner] or 0) + w else p.total = p.total - w end
      end
      if gone[i] == member then
        p.last, p.counted, p.horizon, p.spacing, of, inner = nil, 0, nil, nil, nil, false
      end
    end
    if p.counted > 0 then account = of end
    p.account = account
    for owner, w in pairs(goneT) do
      local s = fqAccountStateSplit(redis.call('HGET', K.fweights,
        fqAccountMember(level, owner)))
      if s and s.T - w > 0 then
        if owner == account then st = s; st.T = s.T - w end
      else
        p.total = p.total - (s and s.A or 0)
        if owner == account then st = {T = 0, A = 1, gone = true} end
      end
    end
    if account and not goneT[account] then
      st = fqAccountStateSplit(redis.call('HGET', K.fweights,
        fqAccountMember(level, account))) or st
    end
    if p.counted == 0 then
      p.frontier, p.frontierSpacing = fqFrontier(K, c, level)
      if account and st.T - p.counted > 0 then
        p.innerFrontier, p.innerDensest = fqFrontier(K, c, level, account)
      end
    end
  end
  if account then
    p.accountWeight = accountWeight or 1
    p.accountT, p.accountA, p.accountSpacing, p.accountHorizon = st.T, st.A, st.spacing,
      st.horizon
    p.inner = inner
  end
  if byTime and c.typical then
    local estimate = tonumber(redis.call('HGET', K.state, 'c:' .. member))
    if estimate then
      p.cost = fqCostTurns(estimate, c.typical)
    elseif explicitMs then
      p.cost = fqCostTurns(explicitMs, c.typical)
    end
  end
  -- fqPlace (fqPlaceInAccount for a flow of an account), n times over (a batch of one
  -- flow: each job a step further)
  local last, counted, horizon, total = p.last, p.counted, p.horizon, p.total
  local spacing = p.spacing
  local tag = nil
  local rank = 4 - fqLevelRank[level]
  for i = 1, n do
    local start = c.vt
    if last and last > start then start = last end
    if account then
      local aw = p.accountWeight
      local mates = st.T - counted
      if mates < 0 then mates = 0 end
      local others = total - (st.T > 0 and st.A or 0)
      local h = st.horizon
      local joined = nil
      local catchUp = st.spacing or others
      if counted == 0 and others > 0 and mates == 0 and p.frontier and p.frontier > start then
        h, joined = p.frontier, p.frontier
        catchUp = others
        if p.frontierSpacing and p.frontierSpacing < others then catchUp = p.frontierSpacing end
      end
      local catching = h and start < h
      local split = others + aw
      if catching then split = catchUp end
      local newInner = false
      if counted == 0 and mates > 0 and not catching and p.innerFrontier
          and p.innerFrontier > start then
        local densest = p.innerDensest
        if not densest or densest > mates then densest = mates end
        inner, newInner = {p.innerFrontier, densest}, true
      end
      local part = mates + weight
      local innerDone = inner and start >= inner[1]
      if inner and not innerDone then part = inner[2] end
      tag = start + fqScale * p.cost * (split * part / aw) / (rank * weight)
      total = others + aw
      if joined then
        h = joined
      elseif h and start >= h then
        h = nil
      else
        h = st.horizon
      end
      st = {T = mates + weight, A = aw, spacing = split, horizon = h}
      if innerDone and not newInner then inner = false end
    else
      local others = total - counted
      local all = others + weight
      local joined = nil
      local catchUp = spacing or others
      if counted == 0 and others > 0 and i == 1 then
        joined = p.frontier
        if joined and joined > start then
          horizon = joined
          catchUp = others
          if p.frontierSpacing and p.frontierSpacing < others then catchUp = p.frontierSpacing end
        else
          joined = nil
        end
      end
      local share = all
      if horizon and start < horizon then share = catchUp end
      spacing = share
      tag = start + fqScale * p.cost * share / (rank * weight)
      total = all
      if not joined and horizon and start >= horizon then horizon = nil end
    end
    counted = weight
    if not last or tag > last then last = tag end
    if i == halfAt then p.halfTag = tag end
  end
  p.tag = tag
  p.score = fqScoreOf(c, tag, level)
  p.n = n
  return p
end

local fqEtaLevels = {'critical', 'high', 'normal', 'low'}

-- Who is asking now (fairqueue.scheduling.pace): the level totals; the ASKING_SCAN flows
-- whose last tags reach furthest past the virtual time, each {member, last tag, counted
-- weight, 1 if its tenant has jobs held or is paused, its jobs waiting among the last
-- ASKING_LINE_TAIL of its line (fqLinePush; -1: no line), the account it counts under
-- ('': none), that account's weight and its flows' tenant weights (0, 0: none)}: a flow
-- served past its weight while the queue was nearly idle has its last tag far ahead with
-- nothing waiting, so the tag distance alone is not its backlog. (The flows the history
-- saw served, fq:hist:t:<start>, the reader reads beside the script: nothing here uses
-- them.) Bounded: ASKING_SCAN flows, whatever the number of tenants. A command costs a
-- status read more than what it reads, so what the flows share is read at once: their
-- weights and accounts (one HMGET), their tenants' pauses (one HMGET), whether any of
-- their tenants has jobs held (one EXISTS), their lines' ids (one ZMSCORE), their
-- accounts' states (one HMGET); a read a flow: its line's LRANGE (a list each: no
-- command reads several), and its held list's EXISTS only until the held ones are all
-- found. At 1M waiting or held and 10,000 tenants: at most 39 commands on 16 flows' keys
-- (usually 23).
local fqEtaAskingScan = {{ASKING_SCAN}}
local fqEtaLineTail = {{ASKING_LINE_TAIL}}
local function fqEtaAsking(K, L, c)
  local out = {}
  for _, lv in ipairs(fqEtaLevels) do out[#out + 1] = c.totals[lv] or 0 end
  local top = {}
  if not c.fresh then
    top = redis.call('ZREVRANGEBYSCORE', K.flows, '+inf', '(' .. fqEtaNum(c.vt), 'WITHSCORES',
      'LIMIT', 0, fqEtaAskingScan)
  end
  local n = #top / 2
  out[#out + 1] = n
  if n > 0 then
    local fields, tenants, ids, lineAt, lineLen = {}, {}, {}, {}, {}
    for i = 1, n do
      local member = top[2 * i - 1]
      fields[2 * i - 1], fields[2 * i] = member, 's\n' .. member
      tenants[i] = string.match(member, '\n(.*)$') or ''
      local line = redis.call('LRANGE', K.flows .. ':' .. member, -fqEtaLineTail, -1)
      lineAt[i], lineLen[i] = #ids, #line
      for j = 1, #line do ids[#ids + 1] = line[j] end
    end
    -- its counted weight, and its account's pack (fqFlowAccountPack), for every flow
    local rows = redis.call('HMGET', K.fweights, unpack(fields))
    local paused = redis.call('HMGET', L .. ':paused', unpack(tenants))
    local scores = #ids > 0 and redis.call('ZMSCORE', K.prioritized, unpack(ids)) or {}
    local accounts, states = {}, {}
    for i = 1, n do
      local account = fqFlowAccount(rows[2 * i])
      if account then
        accounts[i] = account
        states[#states + 1] = fqAccountMember(string.match(top[2 * i - 1], '^[^\n]*'), account)
      end
    end
    if #states > 0 then states = redis.call('HMGET', K.fweights, unpack(states)) end
    -- a list exists while it holds a job: none of the held lists, no flow held (one
    -- EXISTS, where a limited tenant is rare among them); else each is looked at until
    -- as many were found as that EXISTS counted (it counts a key named twice twice)
    local heldKeys = {}
    for i = 1, n do heldKeys[i] = L .. ':held:' .. tenants[i] end
    local heldLeft = redis.call('EXISTS', unpack(heldKeys))
    local stateAt = 0
    for i = 1, n do
      local held = 0
      if paused[i] then
        held = 1 -- (its list not looked at: heldLeft stays at most what is left to find)
      elseif heldLeft > 0 and redis.call('EXISTS', heldKeys[i]) == 1 then
        held, heldLeft = 1, heldLeft - 1
      end
      out[#out + 1] = top[2 * i - 1]
      out[#out + 1] = top[2 * i]
      out[#out + 1] = rows[2 * i - 1] or '0'
      out[#out + 1] = held
      local waiting = -1
      if lineLen[i] > 0 then
        waiting = 0
        for j = lineAt[i] + 1, lineAt[i] + lineLen[i] do
          local s = tonumber(scores[j])
          if s and s >= fqFloor * fqScore and s < fqCap * fqScore then waiting = waiting + 1 end
        end
      end
      out[#out + 1] = waiting
      -- its account (none: ''), the account's weight and its flows' tenant weights
      local st = nil
      if accounts[i] then
        stateAt = stateAt + 1
        st = fqAccountStateSplit(states[stateAt])
      end
      out[#out + 1] = st and accounts[i] or ''
      out[#out + 1] = st and st.A or 0
      out[#out + 1] = st and st.T or 0
    end
  end
  return out
end

-- A placement's reply: the model's inputs and the result, as text (Lua numbers would be
-- cut to integers); then, for a flow of an account, its account, the account's weight
-- and state (T, A, spacing, horizon), the flow's catch-up inside it and the account's
-- frontier (fqFrontier). The jobs ahead of the last of n: those with lower scores now
-- and the n - 1 placed before it.
local function fqEtaReply(c, p, K)
  local ahead = ''
  if p.score then
    ahead = redis.call('ZCOUNT', K.prioritized, '-inf', '(' .. string.format('%d', p.score))
  else
    ahead = redis.call('ZCARD', K.prioritized)
  end
  ahead = ahead + (p.n or 1) - 1
  return {fqEtaNum(c.vt), fqEtaNum(c.base), c.fresh and 1 or 0, fqEtaNum(p.last), p.counted,
    fqEtaNum(p.horizon), p.total, fqEtaNum(p.frontier), fqEtaNum(p.cost), fqEtaNum(p.tag),
    p.score and string.format('%d', p.score) or '', ahead, fqEtaNum(c.typical),
    fqEtaNum(c.delta), fqEtaNum(c.cursor), fqEtaNum(p.spacing), fqEtaNum(p.frontierSpacing),
    p.account or '', fqEtaNum(p.accountWeight), fqEtaNum(p.accountT), fqEtaNum(p.accountA),
    fqEtaNum(p.accountSpacing), fqEtaNum(p.accountHorizon), fqEtaNum(p.inner and p.inner[1]),
    fqEtaNum(p.inner and p.inner[2]), fqEtaNum(p.innerFrontier), fqEtaNum(p.innerDensest)}
end
