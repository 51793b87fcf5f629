end
local fqToken, fqTtl, fqPrefix = ARGV.token, ARGV.ttl, ARGV.prefix
local fqPage, fqBound = tonumber(ARGV.page), tonumber(ARGV.bound)
local fqMaxPayload, fqDry = tonumber(ARGV.max_payload), ARGV.dry == '1'
if not fqDry and not fqHoldLock(KEYS[13], fqToken, fqTtl) then return {-1, 0, 0, 0, 0} end
local fqKeys = {prioritized = KEYS[4], state = KEYS[8], flows = KEYS[9], fweights = KEYS[10],
  ready = KEYS[11], jobs = KEYS[12]}
local fqNow = fqNowMs()
local candidates = {}
local waitIds = redis.call('LRANGE', KEYS[1], -fqPage, -1)
for i = #waitIds, 1, -1 do candidates[#candidates + 1] = {waitIds[i], false, true} end
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

local adopted, aged, parked, held = 0, 0, 0, 0
local fqClockState = nil
local fqLimitsKey = KEYS[14]
local fqAnyHolds = #candidates > 0
  and redis.call('EXISTS', fqLimitsKey .. ':paused', fqLimitsKey .. ':catchup') > 0
local fqHoldingMemo = {}
if not fqDry then
  fqClockState = fqClock(fqKeys)
  fqClockState.byTime = ARGV.fairness == 'time'
end
for _, candidate in ipairs(candidates) do
  local jobId, wasParked, inWait = candidate[1], candidate[2], candidate[3]
  local level, tenant, weight, ready, account, accountWeight
  local meta = redis.call('HGET', fqKeys.jobs, jobId)
  if meta then -- one of fairqueue's delayed jobs: indexed already, placed now
    level, weight, ready, tenant = string.match(meta, '^([^\n]*)\n([^\n]*)\n([^\n]*)\n(.*)$')
    weight, ready = tonumber(weight), tonumber(ready) or fqNow
  else
    level, tenant, weight, ready, account, accountWeight = fqForeign(fqKeys, fqPrefix, jobId,
      fqNow, fqMaxPayload)
  end
  if level and not fqDry then -- one of its flow's delayed jobs no longer (add_delayed)
    redis.call('ZREM', KEYS[17] .. ':' .. level .. ':' .. tenant, jobId)
  end
  if level and not fqDry and fqHolding(fqLimitsKey, tenant, fqAnyHolds, fqHoldingMemo) then
    if inWait then redis.call('LREM', KEYS[1], -1, jobId) end
    if meta then redis.call('HDEL', fqKeys.jobs, jobId) end
    fqRehold(fqLimitsKey, fqKeys.prioritized, KEYS[15], KEYS[16], fqKeys.ready,
      fqPrefix .. jobId, jobId, tenant, level, weight, ready, account, accountWeight)
    held = held + 1
  elseif level then
    local overdue = fqNow - ready > fqBound
    if fqDry then
      adopted = adopted + 1
      if overdue then aged = aged + 1 end
    else
      local score, behind = fqPlace(fqKeys, fqClockState, level, tenant, weight, nil, true,
        account, accountWeight)
      if not score and wasParked then
        parked = parked + 1
        break -- still no room: the parked jobs behind it have none either
      else
        -- At the cap, as every placed job's hash keeps it (see add_jobs): changePriority's
        -- own ARGV (priority, job key prefix, job id, lifo) over fairqueue's, read above.
        ARGV[1], ARGV[2], ARGV[3], ARGV[4] = fqCap, fqPrefix, jobId, '0'
        if fqBullmqChange() == 0 then
          if score then fqSetScore(fqKeys, jobId, score) end
          fqPlaced(fqKeys, fqClockState, score)
          fqLineJoin(fqKeys, fqPrefix, fqFlowMember(level, tenant), jobId, ready, score, behind,
            overdue)
          if meta then
            redis.call('HDEL', fqKeys.jobs, jobId)
          else
            fqIndexOnce(fqKeys, jobId, ready)
          end
          adopted = adopted + 1
          if overdue then aged = aged + 1 end
        end
      end
    end
  end
end
return {1, adopted, aged, parked, #candidates, held}
