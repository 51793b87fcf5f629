--[[
  Retry a page of failed jobs as fair turns inside their tenants' limits (an operator's
  "retry failed"): each job of the page whose tenant matches leaves BullMQ's failed set
  (its finishedOn, processedOn and failedReason dropped, as BullMQ's own job.retry()
  does; its attempts made are kept, as there) and is either held (its tenant has limits,
  or is paused or catching up: tenant_limits.lua's fqRehold, released by release_held in
  its fair order within the limits) or placed by the fair clock like a new arrival of its
  flow (a job whose first wait is past the bound at its flow's next turn), never at the
  front of the queue as BullMQ's retry puts it (priority 0, the wait list).

  KEYS[1..5]  BullMQ's failed, prioritized, delayed, events, marker
  KEYS[6..10] fairqueue's state, flows, fweights, ready, jobs
  KEYS[11]    the limits key L
  ARGV        job key prefix, fairness ('time'/'jobs'), tenant ('' for every tenant),
              page size, cursor score, cursor member ('' from the oldest), wait bound ms,
              payload cap bytes, one job id ('' for every failed job: with an id only
              that job is looked at, an O(log n) read of the failed set)
  Returns {retried, held, cursor score, cursor member, done (1/0)}.
]]
--- @argv prefix fairness tenant page from_score from_member bound max_payload job
--- @include fair_clock
--- @include tenant_limits
--- @include rerun_meta
local prefix, byTime, only = ARGV.prefix, ARGV.fairness == 'time', ARGV.tenant
local page = tonumber(ARGV.page)
local fromScore, fromMember = ARGV.from_score, ARGV.from_member
local bound, maxPayload = tonumber(ARGV.bound), tonumber(ARGV.max_payload)
local K = {prioritized = KEYS[2], state = KEYS[6], flows = KEYS[7], fweights = KEYS[8],
  ready = KEYS[9], jobs = KEYS[10]}
local L = KEYS[11]
local min = '-inf'
if fromScore ~= '' then min = fromScore end
local found
if ARGV.job ~= '' then
  local jobScore = redis.call('ZSCORE', KEYS[1], ARGV.job)
  found = jobScore and {ARGV.job, jobScore} or {}
else
  found = redis.call('ZRANGEBYSCORE', KEYS[1], min, '+inf', 'WITHSCORES', 'LIMIT', 0, page + 1)
end
local now = fqNowMs()
local anyHolds = redis.call('EXISTS', L .. ':paused', L .. ':catchup') > 0
local memo = {}
local c = nil
local retried, held, seen = 0, 0, 0
local lastScore, lastMember = fromScore, fromMember
local placed = false
for i = 1, #found, 2 do
  local id, score = found[i], found[i + 1]
  if not (fromScore ~= '' and tonumber(score) == tonumber(fromScore) and id <= fromMember) then
    if seen == page then break end
    seen = seen + 1
    lastScore, lastMember = score, id
    local level, tenant, weight, ready, account, accountWeight = fqForeign(K, prefix, id, now,
      maxPayload)
    if level and (only == '' or tenant == only) then
      local jobKey = prefix .. id
      redis.call('ZREM', KEYS[1], id)
      redis.call('HDEL', jobKey, 'finishedOn', 'processedOn', 'failedReason')
      redis.call('HSET', jobKey, 'priority', fqCap) -- where BullMQ re-adds its re-runs
      if fqHolding(L, tenant, anyHolds, memo) then
        fqRehold(L, K.prioritized, KEYS[3], KEYS[4], K.ready, jobKey, id, tenant, level,
          weight, ready, account, accountWeight)
        held = held + 1
      else
        if not c then
          c = fqClock(K)
          c.byTime = byTime
        end
        local score2 = fqPlace(K, c, level, tenant, weight, nil, true, account, accountWeight)
        redis.call('ZADD', K.prioritized, string.format('%.17g', score2 or fqCap * fqScore), id)
        fqPlaced(K, c, score2)
        fqIndexOnce(K, id, ready)
        redis.call('XADD', KEYS[4], '*', 'event', 'waiting', 'jobId', id, 'prev', 'failed')
        placed = true
      end
      retried = retried + 1
    end
  end
end
if placed then redis.call('ZADD', KEYS[5], 0, '0') end -- wake the workers
local done = seen < page and 1 or 0
return {retried, held, lastScore, lastMember, done}
