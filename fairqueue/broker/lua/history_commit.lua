--[[
  Write one page of the queue's history, as the loop computed it from BullMQ's events
  stream (``fairqueue.broker.history``, ``fairqueue.scheduling.attempts``): once or not
  at all. Fenced by the leader lock and by the cursor the page was read from, so a page
  a former leader read, or one read twice, is never recorded twice. The writes are per
  bucket and per flow, not per job: Redis does the least a page needs.

  KEYS[1] fq:hist (hash: cursor, ord, since)  KEYS[2] the leader lock  KEYS[3] fq:run
  KEYS[4] fq:state  KEYS[5] fq:flows  KEYS[6] fq:fweights  KEYS[7] BullMQ's active list
  KEYS[8] fq:seen (zset: flow -> when its estimate was last written, ms)
  KEYS[9] BullMQ's prioritized set (its head: the virtual time a settlement is read at)
  KEYS[10] fq:rw (the re-placements in progress: reweight_page.lua)
  ARGV    token, lock ttl ms, the cursor the page was read from, the new cursor ('': keep),
          the new ord, bucket key prefix ('<prefix>:<queue>:fq:hist:'), seconds a bucket
          is kept, tenants kept per bucket, ms a flow's state is kept after its last write
          (its c:/d:/p: fields; at most 64 flows forgotten per call), then
          sections, each a count and its items:
          bucket increments (bucket, field, n), tenant starts (bucket, member, n), runs
          ended (job id), runs started (job id, run), fq:state writes (field, text),
          settlements (member, level, turns), re-placements of flows measured for the
          first time (member, level, ratio, shift turns), then the usage ledger's (absent: none):
          its header (key prefix '<prefix>:<queue>:fq:use:', seconds a day is kept, the
          token of the epoch a new day's counters get, with Redis's clock), increments (day, field, n) and maxima (day,
          field, value), fields '<stat>:<tenant>\n<job type>'
  Bucket keys (same hash tag as the queue): <bucket prefix><start second> (hash: s:<level>
  started, a:<level> became ready, o:<level> over the bound, w:<level>:<bin> waits, r
  retried, g gap ms, t:<level> worker ms, R:<level> retries) and <bucket prefix>t:<start
  second> (zset '<level>\n<tenant>' -> started, trimmed to the most served).
  A settlement (one a flow a page) moves the flow's waiting jobs and its last tag by its
  whole turns (a flow whose jobs ran long waits longer from its next turn on, not only
  behind its backlog; a refund moves its last tag only), at the
  flow's weight and its level's total as they are now: begun here in fq:rw, paged by
  reweight_page.lua; while a move of the flow is in progress, kept in its balance
  ('d:<member>') for a later page. A flow
  with no work left (no last tag ahead of the virtual time its first waiting job stands
  for) gets it carried instead, 'p:<member>' in fq:state, added to its next job's cost
  when that is placed (fair_clock.lua's fqPlace). Work: a few commands per settled flow,
  and one read of the head (O(log n) at 1M waiting) per page that settles any.
  Usage keys: <use prefix><day> (hash: the day's cumulative counters, and 'epoch', set
  when the day's hash is created, so counters Redis lost start a new epoch) and <use
  prefix>dirty (zset: '<day>\n<tenant>\n<job type>' -> the commit that last changed it;
  the loop writes those rows to the database and removes what it wrote).
  Returns 1 recorded, 0 the cursor moved (nothing written), -1 lock lost.
]]
--- @argv token ttl cursor new_cursor ord bucket_prefix bucket_ttl keep_tenants idle_ms
--- @argv sections...
--- @include fair_clock
--- @include lock_fence
if not fqHoldLock(KEYS[2], ARGV.token, ARGV.ttl) then return -1 end
if (redis.call('HGET', KEYS[1], 'cursor') or '') ~= ARGV.cursor then return 0 end
local bucketPrefix, expireS = ARGV.bucket_prefix, tonumber(ARGV.bucket_ttl)
local keepTenants, idleMs = tonumber(ARGV.keep_tenants), tonumber(ARGV.idle_ms)
-- The sections are read in order, each from ARGV's position 'at' (their first's, to start).
local at = #ARGV - #ARGV.sections + 1
local function section(width)
  local n = tonumber(ARGV[at]) or 0
  local first = at + 1
  at = first + n * width
  return first, first + n * width - 1
end

local from, to = section(3)
local expiring = {}
for i = from, to, 3 do
  local key = bucketPrefix .. ARGV[i]
  redis.call('HINCRBY', key, ARGV[i + 1], ARGV[i + 2])
  expiring[key] = true
end
for key in pairs(expiring) do redis.call('EXPIRE', key, expireS) end

from, to = section(3)
local trimmed = {}
for i = from, to, 3 do
  local key = bucketPrefix .. 't:' .. ARGV[i]
  redis.call('ZINCRBY', key, ARGV[i + 2], ARGV[i + 1])
  trimmed[key] = true
end
for key in pairs(trimmed) do
  local extra = redis.call('ZCARD', key) - keepTenants
  if extra > 0 then redis.call('ZREMRANGEBYRANK', key, 0, extra - 1) end
  redis.call('EXPIRE', key, expireS)
end

-- The runs this page ended, then those it started and did not see end (in that order: a
-- job that ended and started again is running).
from, to = section(1)
for i = from, to, 1000 do redis.call('HDEL', KEYS[3], unpack(ARGV, i, math.min(i + 999, to))) end
from, to = section(2)
for i = from, to, 1000 do redis.call('HSET', KEYS[3], unpack(ARGV, i, math.min(i + 999, to))) end
from, to = section(2)
if to >= from then redis.call('HSET', KEYS[4], unpack(ARGV, from, to)) end
-- Flows whose estimate this page wrote are seen now; flows not seen for idleMs forget
-- their estimate and balance (bounded state: a few per call, whatever the tenant count).
local now = fqNowMs()
for i = from, to, 2 do
  if string.sub(ARGV[i], 1, 2) == 'c:' then
    redis.call('ZADD', KEYS[8], now, string.sub(ARGV[i], 3))
  end
end
local idle = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now - idleMs, 'LIMIT', 0, 64)
for _, member in ipairs(idle) do
  redis.call('HDEL', KEYS[4], 'c:' .. member, 'd:' .. member, 'p:' .. member)
end
if #idle > 0 then redis.call('ZREM', KEYS[8], unpack(idle)) end

local vt, base = nil, 0 -- read once, for the first settlement or re-placement
local function readVt()
  if vt then return end
  -- The virtual time as the next placement reads it: what the first job waiting
  -- stands for (fqStartOf), never less than the one recorded, and recorded when it
  -- moved, so the next add never reads an earlier one (a head taken since may stand
  -- for less); nothing waiting, every flow has finished (the next add starts afresh).
  local st = redis.call('HMGET', KEYS[4], 'vt', 'base', 'rbDelta', 'rbCursor')
  vt, base = tonumber(st[1]) or 0, tonumber(st[2]) or 0
  local head = redis.call('ZRANGEBYSCORE', KEYS[9], fqFloor * fqScore, fqBelowCap,
    'WITHSCORES', 'LIMIT', 0, 1)
  if #head == 0 then
    vt = math.huge
  else
    local start = fqStartOf({base = base, delta = tonumber(st[3]),
      cursor = tonumber(st[4])}, tonumber(head[2]))
    if start > vt then
      vt = start
      redis.call('HSET', KEYS[4], 'vt', string.format('%.17g', start))
    end
  end
end
-- A flow's step of debt turns, in tags: at its weight and the spacing its jobs were
-- placed at (its catch-up's: a turn of its own, not the level's split now, which moved a
-- flow placed densely beside others many of their turns; docs/design.md, "Service is
-- worker time"); a flow of an account the same one level up: its account's spacing in
-- the level over the account's weight times the account split its last job was placed
-- at (docs/design.md, "Accounts"); without them, its share now. FairClock._share.
local function tagsOf(member, level, rank, debt)
  local row = redis.call('HMGET', KEYS[6], member, 's\n' .. member)
  local w = tonumber(row[1]) or 1
  local spacing = tonumber(row[2])
  if spacing then return fqScale * debt * spacing / ((4 - rank) * w) end
  local total = tonumber(redis.call('HGET', KEYS[4], 'W:' .. level)) or w
  local of, part = fqFlowAccountSplit(row[2])
  if of then
    local st = fqAccountStateSplit(redis.call('HGET', KEYS[6], fqAccountMember(level, of)))
    if st and st.A > 0 then
      if st.spacing and part then
        total = st.spacing * part / st.A
      else
        total = total * st.T / st.A
      end
    end
  end
  return fqScale * debt * total / ((4 - rank) * w) -- a level's weight: 4 less its rank
end
local function g(x) return string.format('%.17g', x) end
-- Begin placing the flow's waiting jobs again, t -> vt + tags + (t - vt) * ratio, none
-- behind vt (reweight_page.lua's pages, at the loop's ticks, from the head up; repay: each
-- moved job's fqPaid scaled by the ratio); its last tag moves with them at once when it
-- moves back (a job placed meanwhile goes behind them), else when the pages are done.
local function replace(member, level, last, ratio, tags, repay)
  redis.call('HSET', KEYS[10], member, table.concat({g(vt), g(ratio), g(last), level, '', '',
    g(base), g(tags), repay and 'paid' or ''}, '\n'))
  local moved = fqReplaced(last, vt, ratio, tags)
  if moved > last then redis.call('ZADD', KEYS[5], g(moved), member) end
end
local function settle(member, level, debt, text)
  local last = tonumber(redis.call('ZSCORE', KEYS[5], member))
  local rank = fqLevelRank[level]
  readVt()
  if rank and not (last and last > vt) then
    -- No work left (retired, or passed by the virtual time): carried to the flow's next
    -- job, which pays it with its own turn (fqPlace), so a flow that keeps emptying
    -- settles its overruns too.
    redis.call('HINCRBYFLOAT', KEYS[4], 'p:' .. member, text) -- the page's text
  elseif last and rank then
    local tags = tagsOf(member, level, rank, debt)
    if tags < 0 then
      -- a refund: its next jobs placed earlier (its waiting jobs moved earlier at each
      -- page's jitter would put equal flows out of step: a turn's noise either way)
      redis.call('ZADD', KEYS[5], g(last + tags), member)
    elseif redis.call('HEXISTS', KEYS[10], member) == 0 then
      -- paid at once: its waiting jobs move later, not only the jobs placed after them
      replace(member, level, last, 1, tags, false)
    else
      -- its jobs are being moved: kept in its balance (in turns of the typical time now,
      -- as the page's), for a page after the move to settle
      local st = redis.call('HMGET', KEYS[4], 'typ', 'unit')
      redis.call('HINCRBYFLOAT', KEYS[4], 'd:' .. member,
        g(debt / fqTurnScale(tonumber(st[1]), tonumber(st[2]))))
    end
  end
end

from, to = section(3)
for i = from, to, 3 do settle(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 2]) end

-- Flows measured for the first time, off what their jobs paid cold (member, level, ratio,
-- shift turns; ratio 1: a flow's cold runs that ended later, their overrun the shift):
-- their waiting jobs are placed again from the virtual time at the ratio, the shift
-- later (replace), each moved job's fqPaid scaled with it, whichever way they move (a
-- cheaper flood's backlog repaid only by its jobs' charges would be repaid when it
-- drained). A flow with no work, or with a move in progress, gets the shift as a
-- settlement.
-- Work: a few commands a flow, at most once per flow (its first measurement).
from, to = section(4)
for i = from, to, 4 do
  local member, level, ratio, shift = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]),
    tonumber(ARGV[i + 3])
  local last = tonumber(redis.call('ZSCORE', KEYS[5], member))
  local rank = fqLevelRank[level]
  readVt()
  if rank and last and last > vt and redis.call('HEXISTS', KEYS[10], member) == 0 then
    replace(member, level, last, ratio, tagsOf(member, level, rank, shift), ratio ~= 1)
  elseif shift ~= 0 then
    settle(member, level, shift, ARGV[i + 3])
  end
end

-- The usage ledger: cumulative counters per day, written with the page (once or never).
local head = at
from, to = section(3)
if to >= from then
  local usePrefix, dayTtl, epoch = ARGV[head + 1], tonumber(ARGV[head + 2]), ARGV[head + 3]
  local version = redis.call('HINCRBY', KEYS[1], 'uv', 1)
  local dirtyKey = usePrefix .. 'dirty'
  local days = {}
  local function touch(day, field)
    local key = usePrefix .. day
    if not days[key] then
      -- a new epoch whenever the day's hash is new: the token and Redis's clock
      redis.call('HSETNX', key, 'epoch', epoch .. '-' .. now)
      days[key] = true
    end
    redis.call('ZADD', dirtyKey, version, day .. '\n' .. string.sub(field, 3))
    return key
  end
  from, to = section(3)
  for i = from, to, 3 do
    redis.call('HINCRBY', touch(ARGV[i], ARGV[i + 1]), ARGV[i + 1], ARGV[i + 2])
  end
  from, to = section(3)
  for i = from, to, 3 do
    local key = touch(ARGV[i], ARGV[i + 1])
    local value = tonumber(ARGV[i + 2])
    if value > (tonumber(redis.call('HGET', key, ARGV[i + 1])) or -1) then
      redis.call('HSET', key, ARGV[i + 1], value)
    end
  end
  for key in pairs(days) do redis.call('EXPIRE', key, dayTtl) end
  redis.call('EXPIRE', dirtyKey, dayTtl)
end

if ARGV.new_cursor ~= '' then
  redis.call('HSET', KEYS[1], 'cursor', ARGV.new_cursor, 'ord', ARGV.ord)
else
  redis.call('HSET', KEYS[1], 'ord', ARGV.ord)
end
-- fq:run holds the attempts running now; an entry whose end the stream never showed (a
-- job removed while it ran) is dropped once the hash outgrows the active list.
if redis.call('HLEN', KEYS[3]) > 2 * redis.call('LLEN', KEYS[7]) + 1000 then
  local scan = redis.call('HSCAN', KEYS[3], '0', 'COUNT', 1000)
  for i = 1, #scan[2], 2 do
    if not redis.call('LPOS', KEYS[7], scan[2][i]) then redis.call('HDEL', KEYS[3], scan[2][i]) end
  end
end
return 1
