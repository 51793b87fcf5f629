end
local fqArgs = cmsgpack.unpack(ARGV.packed_args)
local fqFresh = fqArgs[2] == '' or redis.call('EXISTS', fqArgs[1] .. fqArgs[2]) == 0
local fqLevel, fqTenant, fqWeight = ARGV.level, ARGV.tenant, ARGV.weight
local fqDelay = tonumber(ARGV.delay)
local fqTime = redis.call('TIME')
local fqReady = tonumber(fqTime[1]) * 1000 + math.floor(tonumber(fqTime[2]) / 1000) + fqDelay
local fqLimitsKey, fqGiven = KEYS[9], ARGV.limits
local fqHeld = fqFresh and (fqGiven ~= ''
  or redis.call('HEXISTS', fqLimitsKey .. ':paused', fqTenant) == 1
  or redis.call('HEXISTS', fqLimitsKey .. ':catchup', fqTenant) == 1)
local fqOpts = fqFresh and cmsgpack.unpack(ARGV.opts)
-- the job's account (its opts' fqAcct, kept in its held meta) and the account's limits
-- when it has some (a held job of its tenant counts for them)
local fqAcctMeta = fqOpts and fqAccountMetaSplit(fqOpts['fqAcct']) and fqOpts['fqAcct'] or nil
local fqAcct = fqAcctMeta and fqAccountMetaSplit(fqAcctMeta)
local fqAcctGiven = fqHeld and fqAcct and ARGV.account_limits ~= nil
  and ARGV.account_limits ~= '' and ARGV.account_limits
-- max_waiting counts delayed jobs too, its tenant's and its account's (as an undelayed
-- add checks both, fqHeldTenants): checked before anything is written
local fqRecords = {}
local fqBatch = ARGV.batch and ARGV.batch ~= '' and cjson.decode(ARGV.batch) or nil
local fqNow = tonumber(fqTime[1]) * 1000 + math.floor(tonumber(fqTime[2]) / 1000)
for _, check in ipairs({{fqTenant, fqFresh and fqGiven ~= '' and fqGiven},
    {fqAcct and '\n' .. fqAcct, fqAcctGiven}}) do
  local maxWaiting = check[2] and fqSplitLimits(check[2]).maxWaiting
  if maxWaiting then
    local refused, record = fqCheckWaiting(fqLimitsKey, KEYS[10], KEYS[4], check[1], maxWaiting,
      1, fqBatch, fqNow)
    if refused then return refused end
    fqRecords[#fqRecords + 1] = record
  end
end
if fqFresh then
  local opts = fqOpts
  opts['fqReady'] = fqReady -- its first ready time, kept for its re-runs (see add_jobs)
  if fqHeld then opts['fqLim'] = 1 end -- fairqueue_worker releases its tenant's next at once
  -- What the pass places it with once BullMQ promotes it: kept in the job itself, so it
  -- goes when the job does (however it goes: run, removed, drained, obliterated).
  opts['fqMeta'] = fqDelayedMeta(fqLevel, fqWeight, fqTenant)
  ARGV.opts = cmsgpack.pack(opts) -- what addDelayedJob stores
end
local jobId = fqBullmqAddDelayed()
if type(jobId) == 'string' then
  for _, record in ipairs(fqRecords) do record() end
end
if fqHeld and type(jobId) == 'string' then
  if fqAcctGiven then -- as an undelayed add writes them (fqHeldTenants)
    redis.call('HSET', fqLimitsKey .. ':acc', fqAcct, fqAcctGiven)
    redis.call('HSET', fqLimitsKey .. ':tacct', fqTenant, fqAcct)
    fqAcctMemo[fqTenant] = fqAcct
  end
  fqAccountHeld(fqLimitsKey, fqTenant, jobId) -- its account's max_waiting counts it
  redis.call('ZADD', KEYS[4], 'XX', string.format('%.17g', fqHeldScore), jobId)
  redis.call('ZADD', fqLimitsKey .. ':later:' .. fqTenant, fqReady, jobId)
  redis.call('HSET', fqLimitsKey .. ':meta', jobId, fqHeldMeta(fqLevel, fqWeight, nil, fqAcctMeta))
  redis.call('SADD', fqLimitsKey .. ':tenants', fqTenant)
  fqDue(fqLimitsKey, fqTenant, fqReady)
  if fqGiven ~= '' then
    redis.call('HSET', fqLimitsKey, fqTenant, fqAddPause(fqLimitsKey, fqTenant, fqGiven))
  end
elseif fqFresh and type(jobId) == 'string' then
  local second = string.format('%d', math.floor(fqReady / 1000))
  redis.call('RPUSH', KEYS[7] .. ':' .. second, jobId)
  redis.call('ZADD', KEYS[7], 'NX', second, second)
  -- its flow's delayed jobs not placed yet (KEYS[11]:<level>:<tenant>): entries the pass
  -- did not drop (the job was removed) go once they are {{DELAYED_KEEP_MS}} ms past due,
  -- and the key with its last job's; KEYS[11] itself is the set of those flows, so
  -- forget_obliterated.lua can find their keys without a scan
  local flowName = fqLevel .. ':' .. fqTenant
  local dly = KEYS[11] .. ':' .. flowName
  redis.call('SADD', KEYS[11], flowName)
  redis.call('ZADD', dly, fqReady, jobId)
  redis.call('ZREMRANGEBYSCORE', dly, '-inf', fqReady - fqDelay - {{DELAYED_KEEP_MS}})
  if redis.call('PTTL', dly) < fqDelay + {{DELAYED_KEEP_MS}} then
    redis.call('PEXPIRE', dly, fqDelay + {{DELAYED_KEEP_MS}})
  end
end
return jobId
