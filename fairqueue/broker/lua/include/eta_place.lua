--[[
  Read-only: where the fair clock would place a new job of a flow now, and who is asking,
  for job_status and estimate_start (fairqueue.broker.status_reads; the measured service
  rate, the history's buckets, it reads beside them).
  Included by job_status and estimate_start; writes nothing.

  fqEtaClock reads the clock as fqClock does (the virtual time moved to the first tagged
  job waiting; nothing tagged waiting: every flow idle, the clock starts afresh), and
  fqEtaPlace mirrors fqPlace (docs/design.md, "The rule", "Joining a level"): the flow's
  last tag, its counted weight and horizon, its level's total less the flows the virtual
  time has passed (at most EXPIRE_PER_CALL, as fqExpire retires them), the level's
  frontier for a joining flow, its cost in turns. fairqueue.scheduling.estimate.place is
  the same arithmetic in Python, and the tests hold both to what the add script does.

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

-- Where n new jobs of (level, tenant, weight) would be placed now. Returns a table: the
-- inputs the Python model takes (last, counted, horizon, total, frontier, cost) and the
-- last job's tag and score (nil: no room, parked at the cap).
local function fqEtaPlace(K, c, level, tenant, weight, explicitMs, byTime, n)
  local member = fqFlowMember(level, tenant)
  local p = {last = nil, counted = 0, horizon = nil, total = 0, frontier = nil, cost = 1}
  if not c.fresh then
    local row = redis.call('HMGET', K.fweights, member, 'j\n' .. member, 's\n' .. member)
    p.last = tonumber(redis.call('ZSCORE', K.flows, member))
    p.counted, p.horizon, p.spacing = tonumber(row[1]) or 0, tonumber(row[2]), tonumber(row[3])
    p.total = c.totals[level] or 0
    local gone = redis.call('ZRANGEBYSCORE', K.flows, '-inf', string.format('%.17g', c.vt),
      'LIMIT', 0, fqEtaExpire)
    local prefix = fqFlowPrefix(level)
    for i = 1, #gone do
      if string.sub(gone[i], 1, #prefix) == prefix then
        p.total = p.total - (tonumber(redis.call('HGET', K.fweights, gone[i])) or 0)
      end
      if gone[i] == member then p.last, p.counted, p.horizon, p.spacing = nil, 0, nil, nil end
    end
    local others = p.total - p.counted
    if p.counted == 0 and others > 0 then
      local top = redis.call('ZREVRANGEBYSCORE', K.flows, '+inf',
        '(' .. string.format('%.17g', c.vt), 'WITHSCORES', 'LIMIT', 0, fqFrontierScan)
      local fields = {}
      for i = 1, #top, 2 do
        if string.sub(top[i], 1, #prefix) == prefix then
          if not p.frontier then p.frontier = tonumber(top[i + 1]) end
          fields[#fields + 1] = 's\n' .. top[i]
        end
      end
      if #fields > 0 then -- the densest spacing among them (fqFrontier)
        for _, spacing in ipairs(redis.call('HMGET', K.fweights, unpack(fields))) do
          spacing = tonumber(spacing)
          if spacing and (not p.frontierSpacing or spacing < p.frontierSpacing) then
            p.frontierSpacing = spacing
          end
        end
      end
    end
  end
  if byTime and c.typical then
    local estimate = tonumber(redis.call('HGET', K.state, 'c:' .. member))
    if estimate then
      p.cost = fqCostTurns(estimate, c.typical)
    elseif explicitMs then
      p.cost = fqCostTurns(explicitMs, c.typical)
    end
  end
  -- fqPlace, n times over (a batch of one flow: each job a step further)
  local last, counted, horizon, total = p.last, p.counted, p.horizon, p.total
  local spacing = p.spacing
  local tag = nil
  for i = 1, n do
    local others = total - counted
    local all = others + weight
    local start = c.vt
    if last and last > start then start = last end
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
    tag = start + fqScale * p.cost * share / ((4 - fqLevelRank[level]) * weight)
    total, counted = all, weight
    if not joined and horizon and start >= horizon then horizon = nil end
    if not last or tag > last then last = tag end
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
-- accounts' states (one HMGET); a read a flow: its line's LRANGE, and its held list's
-- EXISTS only when one of them has jobs held. At 1M waiting or held and 10,000 tenants:
-- at most 39 commands on 16 flows' keys (usually 23).
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
    -- EXISTS, where a limited tenant is rare among them); else each is looked at
    local heldKeys = {}
    for i = 1, n do heldKeys[i] = L .. ':held:' .. tenants[i] end
    local anyHeld = redis.call('EXISTS', unpack(heldKeys)) > 0
    local stateAt = 0
    for i = 1, n do
      local held = 0
      if paused[i] or (anyHeld and redis.call('EXISTS', heldKeys[i]) == 1) then held = 1 end
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
-- cut to integers). The jobs ahead of the last of n: those with lower scores now and the
-- n - 1 placed before it.
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
    fqEtaNum(c.delta), fqEtaNum(c.cursor), fqEtaNum(p.spacing), fqEtaNum(p.frontierSpacing)}
end
