end
local fqPrefix, fqToken, fqTtl = ARGV.prefix, ARGV.token, ARGV.ttl
local fqBound, fqMaxPayload = tonumber(ARGV.bound), tonumber(ARGV.max_payload)
if not fqHoldLock(KEYS[16], fqToken, fqTtl) then return {-1, 0, 0, 0} end
local fqKeys = {prioritized = KEYS[10], state = KEYS[11], flows = KEYS[12], fweights = KEYS[13],
  ready = KEYS[14], jobs = KEYS[15]}
redis.call('DEL', KEYS[4]) -- the check's gate: the leader checks at its own pace
local stalled = fqBullmqStalled()
local recovered, aged, held = 0, 0, 0
if #stalled == 0 then return {1, 0, 0, 0} end
local fqAnyHolds = redis.call('EXISTS', KEYS[17] .. ':paused', KEYS[17] .. ':catchup') > 0
local fqHoldingMemo = {}
local fqNow = fqNowMs()
local fqClockState = fqClock(fqKeys)
fqClockState.byTime = ARGV.fairness == 'time'
for _, jobId in ipairs(stalled) do
  -- Only what BullMQ just put on the wait list (not a paused queue's list), and not a job
  -- it marked to fail: the worker that takes it fails it.
  local doomed = redis.call('HEXISTS', fqPrefix .. jobId, 'defa') == 1
  if not doomed and redis.call('LREM', KEYS[2], -1, jobId) == 1 then
    local level, tenant, weight, ready, account, accountWeight = fqForeign(fqKeys, fqPrefix,
      jobId, fqNow, fqMaxPayload)
    if level and fqHolding(KEYS[17], tenant, fqAnyHolds, fqHoldingMemo) then
      fqRehold(KEYS[17], fqKeys.prioritized, KEYS[18], KEYS[8], fqKeys.ready, fqPrefix .. jobId,
        jobId, tenant, level, weight, ready, account, accountWeight)
      held = held + 1
    elseif level then
      local overdue = fqNow - ready > fqBound
      local score, behind = fqPlace(fqKeys, fqClockState, level, tenant, weight, nil, true,
        account, accountWeight)
      -- As changePriority would: the hash at the cap, the job in the prioritized set (the
      -- wait list's move already set BullMQ's marker for the workers).
      redis.call('HSET', fqPrefix .. jobId, 'priority', fqCap)
      redis.call('ZADD', fqKeys.prioritized, string.format('%.17g',
        score or (fqCap * fqScore)), jobId)
      fqPlaced(fqKeys, fqClockState, score)
      fqLineJoin(fqKeys, fqPrefix, fqFlowMember(level, tenant), jobId, ready, score, behind, overdue)
      fqIndexOnce(fqKeys, jobId, ready)
      recovered = recovered + 1
      if overdue then aged = aged + 1 end
    else
      redis.call('RPUSH', KEYS[2], jobId) -- gone meanwhile: leave it as BullMQ put it
    end
  end
end
return {1, recovered, aged, held}
