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
-- max_waiting counts delayed jobs too: checked before anything is written
local fqMaxWaiting = fqFresh and fqGiven ~= '' and fqSplitLimits(fqGiven).maxWaiting
local fqRecord = nil
local fqAcct = nil -- the job's account (its opts' fqAcct), kept in its held meta
if fqMaxWaiting then
  local refused = nil
  refused, fqRecord = fqCheckWaiting(fqLimitsKey, KEYS[10], KEYS[4], fqTenant, fqMaxWaiting, 1,
    ARGV.batch and ARGV.batch ~= '' and cjson.decode(ARGV.batch) or nil,
    tonumber(fqTime[1]) * 1000 + math.floor(tonumber(fqTime[2]) / 1000))
  if refused then return refused end
end
if fqFresh then
  local opts = cmsgpack.unpack(ARGV.opts)
  opts['fqReady'] = fqReady -- its first ready time, kept for its re-runs (see add_jobs)
  if fqHeld then opts['fqLim'] = 1 end -- fairqueue_worker releases its tenant's next at once
  -- What the pass places it with once BullMQ promotes it: kept in the job itself, so it
  -- goes when the job does (however it goes: run, removed, drained, obliterated).
  opts['fqMeta'] = fqDelayedMeta(fqLevel, fqWeight, fqTenant)
  if fqAccountMetaSplit(opts['fqAcct']) then fqAcct = opts['fqAcct'] end
  ARGV.opts = cmsgpack.pack(opts) -- what addDelayedJob stores
end
local jobId = fqBullmqAddDelayed()
if fqRecord and type(jobId) == 'string' then fqRecord() end
if fqHeld and type(jobId) == 'string' then
  redis.call('ZADD', KEYS[4], 'XX', string.format('%.17g', fqHeldScore), jobId)
  redis.call('ZADD', fqLimitsKey .. ':later:' .. fqTenant, fqReady, jobId)
  redis.call('HSET', fqLimitsKey .. ':meta', jobId, fqHeldMeta(fqLevel, fqWeight, nil, fqAcct))
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
