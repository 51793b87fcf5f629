--[[
  Read-only: one job's state as BullMQ's sets hold it, how many jobs BullMQ pops before
  it, and what an estimate of its start needs (fairqueue.broker.status_reads
  .StatusReads.job_status). O(log n) in the prioritized set and in the tenant's held jobs
  (a ZRANK in their index, L:hrank:<t>); the wait and active lists are walked (LPOS),
  which fairqueue keeps short. At 1M waiting or 1M held: two ZRANK/ZSCORE-sized reads
  of about 20 levels each (a held job its index lacks, held before it existed: an LPOS
  of at most HELD_PLACE_SCAN more); who is asking (fqEtaAsking, a waiting or held job's):
  ASKING_SCAN flows, about 23 commands, whatever the number of tenants. The history's
  buckets the reader reads beside it (StatusReads: nothing here uses them).

  KEYS[1..6]  BullMQ's prioritized set and wait list; fairqueue's state, flows,
              fweights; the limits key L
  KEYS[7..11] BullMQ's active list, delayed, completed and failed sets, paused list
  KEYS[12]    the job's hash
  ARGV        job id, fairness ('time'/'jobs')
  Returns     {now ms, wait list length, state, position (jobs popped before it; -1
              unknown), score ('' none), level, tenant, due ms, processedOn, finishedOn,
              limits encoded, paused, catching up, held, occupied, placement of a new
              job of its flow (a held job's, fqEtaReply, else {}), clock (a waiting job's),
              who is asking (fqEtaAsking; {} unless waiting or held), the
              tenant's counted weight in its flow (a waiting job's), its account and
              the account's weight ('': none; its flow's, or a held job's meta's)
]]
--- @argv id fairness
--- @include eta_place
local fqEtaHeldMs = {{HELD_MS}}
local fqEtaRetryHeldMs = {{RETRY_HELD_MS}}
local K = {prioritized = KEYS[1], wait = KEYS[2], state = KEYS[3], flows = KEYS[4],
  fweights = KEYS[5]}
local L = KEYS[6]
local id = ARGV.id
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local waitLen = redis.call('LLEN', K.wait)
local state, ahead, score, due, tenant, level = 'gone', -1, '', '', '', ''
local limits, paused, catchup, held, occupied, place = '', 0, 0, 0, 0, {}
local account, accountW = '', ''


-- A held job's place among its tenant's held jobs (-1: not known): its rank in
-- L:hrank:<t> (tenant_limits.lua), O(log n), plus the held jobs the index lacks (held
-- before it existed, so at the front of the list). A job the index lacks is looked for
-- among those only, at most {{HELD_PLACE_SCAN}} of them, so the call stays bounded.
local heldLen = nil -- the tenant's held list's length, once read (fqHeldPlace)
local function fqHeldPlace(L, t, jobId)
  local heldKey, rankKey = L .. ':held:' .. t, L .. ':hrank:' .. t
  heldLen = redis.call('LLEN', heldKey)
  local unindexed = heldLen - redis.call('ZCARD', rankKey)
  if unindexed < 0 then unindexed = 0 end
  local rank = redis.call('ZRANK', rankKey, jobId)
  if rank then return rank + unindexed end
  if unindexed == 0 then return -1 end
  local pos = redis.call('LPOS', heldKey, jobId, 'MAXLEN',
    math.min(unindexed, {{HELD_PLACE_SCAN}}))
  return pos or -1
end

local fields = redis.call('HMGET', KEYS[12], 'data', 'processedOn', 'finishedOn')
-- a job's hash holds its data: EXISTS only for a hash without any of these fields
local exists = fields[1] ~= false or fields[2] ~= false or fields[3] ~= false
  or redis.call('EXISTS', KEYS[12]) == 1
local function tenantOf()
  local data = fields[1] or ''
  local lv, tn = string.match(data, '^{"priorityLevel":"(%a+)","tenantId":"([^"\\]*)"[,}]')
  if tn then return tn, lv end
  local ok, decoded = pcall(cjson.decode, data)
  if ok and type(decoded) == 'table' then
    local tid = decoded['tenantId']
    if tid == cjson.null then tid = '(internal)' -- levels.INTERNAL_TENANT
    elseif type(tid) ~= 'string' then tid = 'default' end
    local named = decoded['priorityLevel']
    if type(named) ~= 'string' then named = '' end
    return tid, named
  end
  return 'default', ''
end

-- a job is in one of BullMQ's sets at a time: the prioritized set first, so a waiting
-- job's status (the read that goes on to who is asking) skips the finished sets
local prioritizedScore = exists and redis.call('ZSCORE', K.prioritized, id)
if not exists then
  state = 'gone'
elseif prioritizedScore then
  local s = prioritizedScore
  state, score = 'waiting', s
  ahead = redis.call('ZRANK', K.prioritized, id) + waitLen
  local units = tonumber(s) - fqFloor * fqScore
  if units >= 0 and tonumber(s) < fqCap * fqScore then level = fqRankLevel[units % 4] end
elseif redis.call('ZSCORE', KEYS[9], id) then
  state = 'completed'
elseif redis.call('ZSCORE', KEYS[10], id) then
  state = 'failed'
else
  local at = redis.call('LPOS', K.wait, id)
  if at then
    state, ahead = 'waiting', waitLen - 1 - at -- workers take from the list's tail
  elseif redis.call('LPOS', KEYS[7], id) then
    state = 'active'
  else
    local d = tonumber(redis.call('ZSCORE', KEYS[8], id))
    if d then
      local ms = math.floor(d / 4096)
      tenant, level = tenantOf()
      if ms >= fqEtaHeldMs then
        local later = redis.call('ZSCORE', L .. ':later:' .. tenant, id)
        if later then
          state, due = 'delayed', later
        else
          state = 'held'
          ahead = fqHeldPlace(L, tenant, id)
        end
      elseif ms - now > fqEtaRetryHeldMs / 2 then
        state = 'held' -- a released job's failed attempt, about to be held again
      else
        state, due = 'delayed', ms
      end
    elseif redis.call('LPOS', KEYS[11], id) then
      state = 'held' -- the whole queue is paused (BullMQ's Queue.pause)
      tenant = 'queue paused'
    else
      state = 'unknown'
    end
  end
end

local heldClock = nil -- a held job's clock, read once for its placement and who is asking
if state == 'held' and tenant ~= 'queue paused' then
  limits = redis.call('HGET', L, tenant) or ''
  paused = redis.call('HEXISTS', L .. ':paused', tenant)
  catchup = redis.call('HEXISTS', L .. ':catchup', tenant)
  held = heldLen or redis.call('LLEN', L .. ':held:' .. tenant)
  occupied = redis.call('SCARD', L .. ':out:' .. tenant)
  local meta = redis.call('HGET', L .. ':meta', id) or ''
  local mlevel, mweight = string.match(meta, '^(%a+)\n(%d+)')
  if mlevel then level = mlevel end
  local _, _, _, macct, maw = fqHeldMetaSplit(meta)
  if macct then account, accountW = macct, maw end
  if fqLevelRank[level] then
    heldClock = fqEtaClock(K)
    local etaClock = heldClock
    local placement = fqEtaPlace(K, etaClock, level, tenant, tonumber(mweight) or 1, nil,
      ARGV.fairness == 'time', 1, macct, tonumber(maw) or 1)
    place = fqEtaReply(etaClock, placement, K)
  end
end
local clock, asking, fweight = {}, {}, ''
if state == 'waiting' and score ~= '' then
  local etaClock = fqEtaClock(K)
  clock = {fqEtaNum(etaClock.vt), fqEtaNum(etaClock.base), fqEtaNum(etaClock.delta),
    fqEtaNum(etaClock.cursor), fqEtaNum(etaClock.typical)}
  tenant = tenantOf()
  if level ~= '' then
    local member = fqFlowMember(level, tenant)
    local row = redis.call('HMGET', K.fweights, member, 's\n' .. member)
    fweight = row[1] or ''
    local of = fqFlowAccount(row[2])
    local st = of and fqAccountStateSplit(redis.call('HGET', K.fweights,
      fqAccountMember(level, of)))
    if st then account, accountW = of, st.A end
  end
  asking = fqEtaAsking(K, L, etaClock)
elseif state == 'held' and fqLevelRank[level] then
  asking = fqEtaAsking(K, L, heldClock or fqEtaClock(K))
end
return {now, waitLen, state, ahead, score, level, tenant == 'queue paused' and '' or tenant,
  due, fields[2] or '', fields[3] or '', limits, paused, catchup, held, occupied, place, clock,
  asking, fweight, account, accountW}
