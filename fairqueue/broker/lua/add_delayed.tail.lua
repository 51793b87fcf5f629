end
local fqArgs = cmsgpack.unpack(ARGV[1])
local fqFresh = fqArgs[2] == '' or redis.call('EXISTS', fqArgs[1] .. fqArgs[2]) == 0
local fqLevel, fqTenant, fqWeight, fqDelay = ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
local fqTime = redis.call('TIME')
local fqReady = tonumber(fqTime[1]) * 1000 + math.floor(tonumber(fqTime[2]) / 1000) + fqDelay
if fqFresh then
  local opts = cmsgpack.unpack(ARGV[3])
  opts['fqReady'] = fqReady -- its first ready time, kept for its re-runs (see add_jobs)
  ARGV[3] = cmsgpack.pack(opts)
end
local jobId = fqBullmqAddDelayed()
if fqFresh and type(jobId) == 'string' then
  local second = string.format('%d', math.floor(fqReady / 1000))
  redis.call('RPUSH', KEYS[7] .. ':' .. second, jobId)
  redis.call('ZADD', KEYS[7], 'NX', second, second)
  redis.call('HSET', KEYS[8], jobId, fqLevel .. '\n' .. fqWeight .. '\n' ..
    string.format('%d', fqReady) .. '\n' .. fqTenant)
end
return jobId
