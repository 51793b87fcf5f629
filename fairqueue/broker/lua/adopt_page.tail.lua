end
local fqToken, fqTtl, fqPrefix = ARGV[1], ARGV[2], ARGV[3]
local fqPage, fqBound = tonumber(ARGV[4]), tonumber(ARGV[5])
local fqMaxPayload, fqDry = tonumber(ARGV[6]), ARGV[7] == '1'
if not fqDry and not fqHoldLock(KEYS[13], fqToken, fqTtl) then return {-1, 0, 0, 0, 0} end
local fqK = {prioritized = KEYS[4], state = KEYS[8], flows = KEYS[9], fweights = KEYS[10],
  ready = KEYS[11], jobs = KEYS[12]}
local fqNow = fqNowMs()
local fqNames = {critical = true, high = true, normal = true, low = true}

local function fqNormalize(p)
  if p == nil or p <= 0 then return 'normal' end
  if p == 1 then return 'critical' end
  if p <= 3 then return 'high' end
  if p <= 5 then return 'normal' end
  return 'low'
end

-- level, tenant, weight and ready time of a job without meta in fq:jobs: another
-- producer's, or one of fairqueue's that runs again (a retry, a stalled job's recovery,
-- a retried failed job). Its ready time is its first one: fqReady in its opts for
-- fairqueue's jobs (Redis's clock, the second its index entry is under), else BullMQ's
-- timestamp plus the delay it was added with (the hash's delay is a backoff's once it
-- was retried). Its tenant weight is the one its flow counts now (1 if the flow has no
-- work).
local function fqForeign(jobId)
  local f = redis.call('HMGET', fqPrefix .. jobId, 'data', 'opts', 'timestamp', 'priority')
  if not (f[1] or f[2] or f[3]) then return nil end -- no such job (removed meanwhile)
  local tenant, level = 'default', nil
  if f[1] and #f[1] <= fqMaxPayload and string.find(f[1], '^%s*{') then
    local ok, data = pcall(cjson.decode, f[1])
    if ok and type(data) == 'table' then
      if type(data['tenantId']) == 'string' and data['tenantId'] ~= '' then
        tenant = data['tenantId']
      end
      if type(data['priorityLevel']) == 'string' and fqNames[data['priorityLevel']] then
        level = data['priorityLevel']
      end
    end
  end
  local ok, opts = pcall(cjson.decode, f[2] or 'null')
  if not (ok and type(opts) == 'table') then opts = {} end
  if not level then
    local requested = nil
    if type(opts['priority']) == 'number' then requested = opts['priority'] end
    level = fqNormalize(requested or tonumber(f[4]))
  end
  local ready = tonumber(opts['fqReady'])
  if not ready then
    local delay = 0
    if type(opts['delay']) == 'number' and opts['delay'] > 0 then delay = opts['delay'] end
    ready = (tonumber(f[3]) or fqNow) + delay
    if ready > fqNow then ready = fqNow end
  end
  local weight = tonumber(redis.call('HGET', fqK.fweights, level .. '\n' .. tenant)) or 1
  return level, tenant, weight, ready
end

-- Index a job by its ready second unless it is indexed there already: a job that runs
-- again keeps the entry of its first wait while it is in the prioritized set (the walk
-- drops an entry only when the job is not waiting), so each job has one entry.
local function fqIndexOnce(K, jobId, readyMs)
  local second = string.format('%d', math.floor(readyMs / 1000))
  if not redis.call('LPOS', K.ready .. ':' .. second, jobId) then
    fqIndex(K, jobId, readyMs)
  end
end

local candidates = {}
local waitIds = redis.call('LRANGE', KEYS[1], -fqPage, -1)
for i = #waitIds, 1, -1 do candidates[#candidates + 1] = {waitIds[i], false} end
if #candidates < fqPage then
  local low = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. string.format('%.17g',
    fqFloor * fqScore), 'LIMIT', 0, fqPage - #candidates)
  for i = 1, #low do candidates[#candidates + 1] = {low[i], false} end
end
if #candidates < fqPage then
  local parked = redis.call('ZRANGEBYSCORE', KEYS[4], string.format('%.17g',
    fqCap * fqScore), '+inf', 'LIMIT', 0, fqPage - #candidates)
  for i = 1, #parked do candidates[#candidates + 1] = {parked[i], true} end
end

local adopted, aged, parked = 0, 0, 0
local fqC = nil
if not fqDry then fqC = fqClock(fqK) end
for _, candidate in ipairs(candidates) do
  local jobId, wasParked = candidate[1], candidate[2]
  local level, tenant, weight, ready
  local meta = redis.call('HGET', fqK.jobs, jobId)
  if meta then -- one of fairqueue's delayed jobs: indexed already, placed now
    level, weight, ready, tenant = string.match(meta, '^([^\n]*)\n([^\n]*)\n([^\n]*)\n(.*)$')
    weight, ready = tonumber(weight), tonumber(ready) or fqNow
  else
    level, tenant, weight, ready = fqForeign(jobId)
  end
  if level then
    local overdue = fqNow - ready > fqBound
    if fqDry then
      adopted = adopted + 1
      if overdue then aged = aged + 1 end
    else
      local score = fqPlace(fqK, fqC, level, tenant, weight, overdue)
      if not score and wasParked then
        parked = parked + 1
        break -- still no room: the parked jobs behind it have none either
      else
        -- At the cap, as every placed job's hash keeps it (see add_jobs).
        ARGV[1], ARGV[2], ARGV[3], ARGV[4] = fqCap, fqPrefix, jobId, '0'
        if fqBullmqChange() == 0 then
          if score then fqSetScore(fqK, jobId, score) end
          fqPlaced(fqK, fqC, score)
          if meta then
            redis.call('HDEL', fqK.jobs, jobId)
          else
            fqIndexOnce(fqK, jobId, ready)
          end
          adopted = adopted + 1
          if overdue then aged = aged + 1 end
        end
      end
    end
  end
end
return {1, adopted, aged, parked, #candidates}
