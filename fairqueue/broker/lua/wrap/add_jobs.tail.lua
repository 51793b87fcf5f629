end
local fqKeys = {prioritized = KEYS[4], state = KEYS[10], flows = KEYS[11], fweights = KEYS[12],
  ready = KEYS[13], jobs = KEYS[14]}
local fqNow = fqNowMs()
local fqJobs
local fqByTime = ARGV.fairness == 'time'
-- A job's values, each job's in one named table (wire.lua's fqReadJobs). ARGV's first
-- three are written over with each job's for addPrioritizedJob, so every named argument
-- is read before the first job is added.
fqJobs = fqReadJobs(ARGV, #ARGV - #ARGV.jobs + 1) -- the jobs: the rest on
-- Tenants with limits, paused or catching up: their jobs are held (tenant_limits.lua). A
-- call with limits is checked (and may be refused) before anything is written; any other
-- call learns from the clock's read of K.state whether a tenant is paused at all.
-- (fqLim, the limits' key, is set only for a call that holds: few are.)
local fqGiven = ARGV.limits ~= '' and ARGV.limits or nil
local fqBatch = ARGV.batch ~= '' and ARGV.batch or nil
local fqLim = fqGiven and KEYS[15]
local fqHold, fqRefused = nil, nil
if fqGiven then
  fqHold, fqRefused = fqHeldTenants(fqLim, fqKeys.prioritized, fqGiven, fqJobs, 'tenant',
    KEYS[5],
    fqBatch and cjson.decode(fqBatch))
  if fqRefused then return fqRefused end
end
local fqReplies = {}
-- With fairness by time, the estimate of the call's flow (a lone job's, or a batch of one
-- flow's) comes in the clock's read; K.state's writes are deferred to fqFlush's one HSET.
local fqCostMember = nil
if fqByTime then
  local level, tenant = nil, nil
  for _, job in ipairs(fqJobs) do
    if not job.cost then -- no explicit cost: the flow's estimate is read
      if level == nil then
        level, tenant = job.level, job.tenant
      elseif job.level ~= level or job.tenant ~= tenant then
        level = false -- several flows: each read on first use
        break
      end
    end
  end
  if level then fqCostMember = fqFlowMember(level, tenant) end
end
local fqClockState = fqClock(fqKeys, true, fqCostMember)
if not fqGiven and fqClockState.holds then
  fqLim = KEYS[15]
  fqHold = fqHeldTenants(fqLim, fqKeys.prioritized, nil, fqJobs, 'tenant', KEYS[5])
end
fqClockState.byTime = fqByTime
-- A memo of the flows' state pays for itself from a call's second placement on.
if #fqJobs > 1 then fqClockState.memo = fqNewMemo() end
-- The packer leaves a slot for fqReady at the end of each job's packed opts (the last
-- key, a 9-byte uint64 of all ones; the priority is the cap already): the slot is
-- filled in as bytes, the same for every job of the call, instead of a repack per job.
local fqReadyPacked = cmsgpack.pack(fqNow)
if #fqReadyPacked ~= 9 then fqReadyPacked = nil end
local fqIndexed = {}
local fqLines, fqLineOrder = {}, {} -- each flow's placed ids, for one push per flow
-- BullMQ's packed args start (after a one-byte array header) with the queue's key prefix
-- and the custom job id: a job packed with an empty id is told by its bytes, without a
-- cmsgpack unpack per job (any other packing is unpacked and checked as before).
local fqNoId = cmsgpack.pack(string.sub(KEYS[3], 1, -3)) .. '\160'
local fqNoIdEnd = 1 + #fqNoId
for _, job in ipairs(fqJobs) do
  local priority, score, behind, paid, cost = 0, nil, false, nil, nil
  local slotted = fqReadyPacked and string.sub(job.opts, -17) == fqReadySlot
  if slotted then job.opts = string.sub(job.opts, 1, -10) .. fqReadyPacked end
  -- A job without a custom id is new; one with an id is new if its hash is not there.
  local fresh = string.sub(job.packed, 2, fqNoIdEnd) == fqNoId
  if not fresh then
    local args = cmsgpack.unpack(job.packed)
    fresh = args[2] == '' or redis.call('EXISTS', args[1] .. args[2]) == 0
  end
  local held = fresh and fqHold and fqHold[job.tenant]
  if fresh then
    if not held then
      score, behind, paid, cost = fqPlace(fqKeys, fqClockState, job.level, job.tenant, job.weight,
        job.cost, false, job.account, job.accountWeight)
    end
    priority = fqPriorityOf(score)
    if held or not slotted then
      local opts = cmsgpack.unpack(job.opts)
      opts['priority'] = fqCap -- where BullMQ re-adds it (retries): the back, for the pass
      opts['fqReady'] = fqNow -- its first ready time (Redis's clock), kept for its re-runs
      if held then opts['fqLim'] = 1 end -- fairqueue_worker releases its tenant's next at once
      job.opts = cmsgpack.pack(opts)
    end
  end
  ARGV[1], ARGV[2], ARGV[3] = job.packed, job.data, job.opts -- addPrioritizedJob's own ARGV
  -- A score is a whole number below 2^53: '%d' writes it exactly.
  fqScoreText = score and string.format('%d', score)
  local jobId = fqBullmqAdd()
  if held and type(jobId) == 'string' then
    fqHoldJob(fqLim, fqKeys.prioritized, KEYS[5], KEYS[8], jobId, job.tenant,
      fqHeldMeta(job.level, job.weight, job.cost,
        job.account and fqAccountMeta(job.account, job.accountWeight)))
  elseif fresh and type(jobId) == 'string' then
    fqPlaced(fqKeys, fqClockState, score)
    -- What it paid, for the pass's charge: placed cold (nothing measured for its flow),
    -- or by its flow's estimate.
    if paid and score then
      redis.call('HSET', string.sub(KEYS[3], 1, -3) .. jobId, 'fqPaid', string.format('%.6g', paid))
    elseif cost and score then
      redis.call('HSET', string.sub(KEYS[3], 1, -3) .. jobId, 'fqCost', string.format('%.6g', cost))
    end
    fqIndexed[#fqIndexed + 1] = jobId
    if score and behind then
      local member = fqFlowMember(job.level, job.tenant)
      local line = fqLines[member]
      if not line then
        line = {}
        fqLines[member] = line
        fqLineOrder[#fqLineOrder + 1] = member
      end
      line[#line + 1] = jobId
    end
  end
  fqReplies[#fqReplies + 1] = jobId
  fqReplies[#fqReplies + 1] = priority
end
fqFlush(fqKeys, fqClockState)
fqIndexMany(fqKeys, fqIndexed, fqNow)
for _, member in ipairs(fqLineOrder) do fqLinePush(fqKeys, member, fqLines[member]) end
return fqReplies
