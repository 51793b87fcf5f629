--[[
  Read-only: where a new job (or n jobs) of a flow would be placed now, how many jobs
  BullMQ would pop before the last of them, what holds its tenant, and the service rate
  of the last half minute (fairqueue.broker.status_reads.StatusReads.estimate).

  KEYS[1..7]  BullMQ's prioritized set and wait list; fairqueue's state, flows,
              fweights; the limits key L; fq:hist
  ARGV        level, tenant, tenant weight, cost ms ('' none), fairness ('time'/'jobs'),
              jobs n, history bucket seconds, buckets to read
  Returns     {now ms, wait list length, placement (fqEtaReply), limits encoded, paused,
              catching up, held, occupied, history, who is asking (fqEtaAsking)}
  Worst case (1M waiting, 10,000 tenants): O(log n) for the place and the jobs ahead,
  ASKING_SCAN flows and the rate window's buckets (at most the tenants a bucket keeps
  each): a few hundred commands, whatever the number of tenants.
]]
--- @argv level tenant weight cost fairness count bucket_s buckets
--- @include eta_place
local K = {prioritized = KEYS[1], wait = KEYS[2], state = KEYS[3], flows = KEYS[4],
  fweights = KEYS[5], hist = KEYS[7]}
local L = KEYS[6]
local level, tenant, weight = ARGV.level, ARGV.tenant, tonumber(ARGV.weight)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local etaClock = fqEtaClock(K)
local placement = fqEtaPlace(K, etaClock, level, tenant, weight, tonumber(ARGV.cost),
  ARGV.fairness == 'time', tonumber(ARGV.count))
local limits = redis.call('HGET', L, tenant) or ''
local paused = redis.call('HEXISTS', L .. ':paused', tenant)
local catchup = redis.call('HEXISTS', L .. ':catchup', tenant)
local held = redis.call('LLEN', L .. ':held:' .. tenant)
local occupied = redis.call('SCARD', L .. ':out:' .. tenant)
return {now, redis.call('LLEN', K.wait), fqEtaReply(etaClock, placement, K), limits, paused,
  catchup, held, occupied, fqEtaRate(K, now, tonumber(ARGV.bucket_s), tonumber(ARGV.buckets)),
  fqEtaAsking(K, L, etaClock, now, tonumber(ARGV.bucket_s), tonumber(ARGV.buckets))}
