--[[
  Read-only: where a new job (or n jobs) of a flow would be placed now, how many jobs
  BullMQ would pop before the last of them, what holds its tenant, and who is asking
  (fairqueue.broker.status_reads.StatusReads.estimate, which reads the history's buckets,
  the service rate, beside it).

  What runs ahead of the job but is not on the fair clock yet counts as the flow's jobs
  placed before it: its delayed jobs due by the job's own ready time (now + delay: a
  job due later is placed behind it), found in KEYS[7]:<level>:<tenant> (add_delayed),
  and `extra` jobs the caller knows of (outbox rows not relayed yet). For a tenant whose
  jobs are held, those are held jobs ahead of it instead, with its own delayed jobs due
  by then (L:later:<t>). The jobs are placed one by one (fqEtaPlace, a fraction of a
  microsecond each) up to the n asked for, or {{ESTIMATE_PENDING_STEPS}} if more: past
  that, a flow's tags are evenly spaced, and the last tag is extrapolated from the pace of
  the second half of those placed (so a flow with 100,000 delayed jobs pending costs an
  estimate what 128 do; the tag halfway is kept by the same placing, so the flow's
  reads are done once). Worst case at 1M waiting and 10,000 tenants: the count asked
  (at most 10,000 steps, an estimate of a batch that large) or 128 steps, beside a few
  O(log n) reads (ZCOUNT of the prioritized set, of the flow's delayed jobs, of L:later;
  the scores of at most 128 delayed jobs already due, fqDelayedAhead, in two ZMSCOREs)
  and who is asking (about 23 commands).

  KEYS[1..6]  BullMQ's prioritized set and wait list; fairqueue's state, flows,
              fweights; the limits key L
  KEYS[7]     fq:dly, the flows' delayed jobs not placed yet (add_delayed)
  KEYS[8]     BullMQ's delayed set
  ARGV        level, tenant, tenant weight, cost ms ('' none), fairness ('time'/'jobs'),
              jobs n, delay ms, extra jobs ahead, the tenant's account ('': none) and its
              weight
  Returns     {now ms, wait list length, placement (fqEtaReply), limits encoded, paused,
              catching up, held, occupied, jobs of the flow placed before the n
              (delayed and extra; 0 for a held tenant, whose held count has them), who
              is asking (fqEtaAsking: ASKING_SCAN flows, whatever the number of tenants)}
]]
--- @argv level tenant weight cost fairness count delay extra
--- @argv account account_weight
--- @include eta_place
local K = {prioritized = KEYS[1], wait = KEYS[2], state = KEYS[3], flows = KEYS[4],
  fweights = KEYS[5]}
local L = KEYS[6]

-- The flow's delayed jobs that will be placed ahead of the job: those due by its ready
-- time (dueBy) that are still to be placed. The index keeps a job until the pass places
-- it, but a worker may take a promoted job before any pass does (an idle queue takes it
-- from the cap at once), and its entry then stays until it expires: so those already due
-- count only when still delayed or parked at the cap unplaced, checked newest first, at
-- most {{ESTIMATE_PENDING_STEPS}} (past that, if all checked were pending, the rest are
-- taken to be too: a loop that is down leaves them all pending). Their scores are read
-- in one ZMSCORE a set, not two ZSCOREs a job: a command costs a read more than a score.
local function fqDelayedAhead(index, prioritizedKey, delayedKey, now, dueBy)
  local ahead = redis.call('ZCOUNT', index, '(' .. now, dueBy)
  local due = redis.call('ZREVRANGEBYSCORE', index, now, '-inf', 'LIMIT', 0,
    {{ESTIMATE_PENDING_STEPS}})
  local pending = 0
  if #due > 0 then
    local placed = redis.call('ZMSCORE', prioritizedKey, unpack(due))
    local delayed = redis.call('ZMSCORE', delayedKey, unpack(due))
    for i = 1, #due do
      local score = tonumber(placed[i])
      if (score and score >= fqCap * fqScore) or delayed[i] then pending = pending + 1 end
    end
  end
  if #due == {{ESTIMATE_PENDING_STEPS}} and pending == #due then
    pending = redis.call('ZCOUNT', index, '-inf', now)
  end
  return ahead + pending
end
local level, tenant, weight = ARGV.level, ARGV.tenant, tonumber(ARGV.weight)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dueBy = string.format('%d', now + (tonumber(ARGV.delay) or 0))
local extra = tonumber(ARGV.extra) or 0
local limits = redis.call('HGET', L, tenant) or ''
local paused = redis.call('HEXISTS', L .. ':paused', tenant)
local catchup = redis.call('HEXISTS', L .. ':catchup', tenant)
local held = redis.call('LLEN', L .. ':held:' .. tenant)
  + redis.call('ZCOUNT', L .. ':later:' .. tenant, '-inf', dueBy)
local before = fqDelayedAhead(KEYS[7] .. ':' .. level .. ':' .. tenant, K.prioritized, KEYS[8],
  now, dueBy)
if limits ~= '' or paused == 1 or catchup == 1 then
  held, before = held + before + extra, 0
else
  before = before + extra
end
local count = tonumber(ARGV.count)
local n = count + before
local exact = math.min(n, math.max(count, {{ESTIMATE_PENDING_STEPS}}))
local etaClock = fqEtaClock(K)
local byTime, cost = ARGV.fairness == 'time', tonumber(ARGV.cost)
local account = ARGV.account ~= '' and ARGV.account or nil
local accountWeight = tonumber(ARGV.account_weight) or 1
local halfAt = math.max(1, math.floor(exact / 2))
local placement = fqEtaPlace(K, etaClock, level, tenant, weight, cost, byTime, exact, account,
  accountWeight, halfAt)
if n > exact and placement.score then
  -- evenly spaced past those placed: the pace of the second half of them (the tag
  -- halfway kept by the same placing), carried on
  local pace = (placement.tag - placement.halfTag) / math.max(1, exact - halfAt)
  placement.tag = placement.tag + (n - exact) * pace
  placement.score = fqScoreOf(etaClock, placement.tag, level)
end
placement.n = n
local occupied = redis.call('SCARD', L .. ':out:' .. tenant)
return {now, redis.call('LLEN', K.wait), fqEtaReply(etaClock, placement, K), limits, paused,
  catchup, held, occupied, before, fqEtaAsking(K, L, etaClock)}
