--[[
  Record one page of the queue's history from BullMQ's events stream: per bucket of
  BUCKET seconds, the jobs workers started per level, the bucket each became ready in,
  their waits (a histogram, bins WAIT_EDGES), those over the bound, and the most served
  tenants. Stock workers, Node or Python, record nothing of fairqueue's: BullMQ itself
  XADDs an 'active' event with the job id whenever a worker takes a job (the entry's id
  is Redis's clock at that moment), so the pass reads the stream from its cursor, a
  bounded page per call, and looks each started job up once.

  A started job's level and tenant come from its data (fairqueue's priorityLevel and
  tenantId; a job without them: the level of the priority its producer asked for, the
  default tenant), its ready time is its timestamp plus its delay. A job whose hash is
  gone (removed on completion before the pass read it) or whose data is too large to
  decode (over ARGV[9] bytes; a call stops after ARGV[11] bytes of data) counts as started at an unknown level ('?'). A start of a
  job with more than one attempt by the time the pass reads it (ats > 1: retried) counts
  as started, field r, with no wait (its timestamp is its first add's, so a wait from it
  would include the earlier attempts and their backoff).
  BullMQ caps the stream (about 10,000 entries): entries added after the cursor and
  trimmed before the pass read them (counted from the stream's entries-added, Redis >= 7)
  are a gap, whose time span is added to the buckets it covers (field g, milliseconds
  unobserved), never guessed. The first call only sets the cursor at the stream's end.

  Worker time (decision 12): each start is remembered in KEYS[4] (fq:run: job id ->
  '<level>\n<tenant>\n<start ms>\n<turns it was charged>') until its 'completed' or
  'failed' event; its run time (between the two events, Redis's clock) then goes to the
  bucket (field t:<level>, ms of worker time) and, with fairness by time, updates the
  estimates the clock places jobs with (KEYS[5] fq:state 'typ' and 'c:<flow>', moving
  averages of the run times in ms, each run bounded to 1/16..16 times the typical one)
  and settles what the run used beyond or short of its turns: a flow's balance
  ('d:<flow>' in fq:state) moves its last tag in KEYS[6] fq:flows once it reaches a whole
  turn, so a flow whose jobs run long waits longer for its next turns.
  An attempt ends at its 'completed' or 'failed' event, or, when it failed with attempts
  left, at the 'waiting' or 'delayed' event that re-adds it (prev 'active'): those count
  as retries of its level (R:<level>). A stalled attempt has no end (its time is lost
  with its worker); its run entry is replaced when the job starts again.

  KEYS[1] BullMQ's events stream  KEYS[2] fq:hist (hash: cursor, ord, since)  KEYS[3] the leader lock
  KEYS[4] fq:run  KEYS[5] fq:state  KEYS[6] fq:flows  KEYS[7] fq:fweights
  ARGV    token, lock ttl ms, job key prefix ('<prefix>:<queue>:'), bucket key prefix
          ('<prefix>:<queue>:fq:hist:'), page size (entries), bucket seconds, retention
          seconds, wait bound ms, largest data decoded (bytes), tenants kept per bucket,
          data bytes decoded per call at most, what fairness counts ('time'/'jobs')
  Bucket keys (same hash tag as the queue): <bucket prefix><start second> (hash: s:<level>
  started, a:<level> became ready, o:<level> over the bound, w:<level>:<bin> waits, r
  retried, g gap ms) and <bucket prefix>t:<start second> (zset '<level>\n<tenant>' ->
  started, trimmed to the most served), each expiring after the retention.
  Returns {status (1 ok, -1 lock lost), entries read, jobs recorded, unknown, gap ms,
  more (1: the page was full or the byte budget ran out), starts per level (critical,
  high, normal, low; retried starts too), waits (level rank, ms, level rank, ms... of
  the first attempts: the rebalancer's metrics), flat [level, worker ms, retries]... of
  what this page finished and restarted}. A job's ready time is its opts' fqReady
  (Redis's clock, set by fairqueue's add scripts) where it has one.
]]
--- @include fair_clock
--- @include lock_fence
local token, ttl = ARGV[1], ARGV[2]
if not fqHoldLock(KEYS[3], token, ttl) then return {-1, 0, 0, 0, 0, 0, {}, {}, {}} end
local jobPrefix, bucketPrefix = ARGV[3], ARGV[4]
local pageSize, bucketS, retentionS = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local bound, maxData, keepTenants = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local byteBudget = tonumber(ARGV[11])
local byTime = ARGV[12] == 'time'
local runKey, stateKey, flowsKey, fweightsKey = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
-- Moving averages of run times: a flow's follows its own recent runs, the queue's typical
-- one changes slowly (it is every flow's yardstick).
local flowAlpha, typicalAlpha = 0.2, 0.05
local served = {} -- level -> {worker ms, retries} of this page
local typical = nil
local edges = {{WAIT_EDGES}}
local levelWeight = {critical = 4, high = 3, normal = 2, low = 1}
local levelRank = {critical = 0, high = 1, normal = 2, low = 3}
local startedBy, waits = {0, 0, 0, 0}, {}

local t = redis.call('TIME')
local nowS = tonumber(t[1])
local oldestS = math.floor((nowS - retentionS) / bucketS) * bucketS + bucketS

local function msOf(id)
  return tonumber(string.match(id, '^(%d+)'))
end
local function bucketOf(ms)
  return math.floor(ms / 1000 / bucketS) * bucketS
end
-- Stream ids compare as (ms, seq).
local function idAfter(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
local function waitBin(ms)
  local lo, hi = 1, #edges + 1 -- the number of edges <= ms, by bisection
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if edges[mid] <= ms then lo = mid + 1 else hi = mid end
  end
  return lo - 1
end
-- The level a producer's numeric priority stands for (fairqueue.levels.normalize_priority).
local function levelOfPriority(p)
  p = tonumber(p) or 0
  if p == 1 then return 'critical' end
  if p == 2 or p == 3 then return 'high' end
  if p >= 6 then return 'low' end
  return 'normal'
end

local incr, tenantIncr = {}, {}
-- The text forms read without decoding (see the 'active' events below): data that starts
-- {"priorityLevel":"<level>","tenantId":"<tenant>" (no quote or escape in the tenant) and
-- opts with a top-level integer fqReady.
local fastMeta = '^{"priorityLevel":"(%l+)","tenantId":"([^"\\]+)"[,}]'
local fastReady = '[{,]"fqReady":(%d+)[,}]'

-- A level's field names, made once per call.
local fieldsOf = {}
for level in pairs(levelWeight) do
  fieldsOf[level] = {s = 's:' .. level, a = 'a:' .. level, t = 't:' .. level,
    R = 'R:' .. level, o = 'o:' .. level, w = {}}
end
local function waitField(level, bin)
  local w = fieldsOf[level].w
  local name = w[bin]
  if not name then name = 'w:' .. level .. ':' .. bin; w[bin] = name end
  return name
end

local function add(bucket, fieldName, n)
  if bucket < oldestS then return end
  local row = incr[bucket]
  if not row then row = {}; incr[bucket] = row end
  row[fieldName] = (row[fieldName] or 0) + n
end

-- The stream's state: its first entry, its length and how many entries it ever had
-- (Redis >= 7: entries-added), so the entries trimmed after the cursor can be counted.
local function streamInfo()
  if redis.call('EXISTS', KEYS[1]) == 0 then return nil end
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  local out = {}
  for i = 1, #info, 2 do
    if info[i] == 'entries-added' then out.added = tonumber(info[i + 1]) end
    if info[i] == 'length' then out.length = tonumber(info[i + 1]) end
    if info[i] == 'first-entry' and type(info[i + 1]) == 'table' then out.first = info[i + 1][1] end
    if info[i] == 'last-entry' and type(info[i + 1]) == 'table' then out.last = info[i + 1][1] end
  end
  return out
end

local state = redis.call('HMGET', KEYS[2], 'cursor', 'ord', 'since')
local cursor, ord, since = state[1], tonumber(state[2]), tonumber(state[3]) or 0
-- While the cursor's own entry is still in the stream, nothing after it was trimmed
-- (BullMQ trims from the front), so the page is read without XINFO: from the cursor,
-- inclusive, and the cursor's entry dropped.
local info, entries = nil, nil
if cursor then
  local page = redis.call('XRANGE', KEYS[1], cursor, '+', 'COUNT', pageSize + 1)
  if page[1] and page[1][1] == cursor then
    table.remove(page, 1)
    entries = page
  end
end
if not entries then info = streamInfo() end
if not entries and not cursor then
  -- The first call: history starts now, at the end of the stream (what came before is
  -- no one's to record: the job hashes behind it may be long gone). ord: the number of
  -- entries the stream ever had up to the cursor.
  redis.call('HSET', KEYS[2], 'cursor', info and info.last or '0-0',
    'ord', info and info.added or 0, 'since', nowS * 1000)
  return {1, 0, 0, 0, 0, 0, {}, {}, {}}
end

local function servedOf(level)
  local row = served[level]
  if not row then row = {0, 0}; served[level] = row end
  return row
end

-- The state this call reads and writes, read once and written once at the end (nothing
-- else runs while a script does): the estimates and balances of fq:state (kept rounded
-- as they are stored, so a later read in the call sees what a re-read would), and the
-- runs this page starts (pending, written at the end; most end within the same page and
-- never reach fq:run) and those it ends (removed at the end).
local stateCache, stateDirty = {}, {}
local typicalDirty = false
local function stateOf(field)
  local v = stateCache[field]
  if v == nil then
    v = tonumber(redis.call('HGET', stateKey, field)) or false
    stateCache[field] = v
  end
  return v or nil
end
local function setState(field, value)
  local text = string.format('%.6g', value)
  stateCache[field], stateDirty[field] = tonumber(text), text
end
local pendingRuns, endedRuns = {}, {}
-- A run: {level, tenant, start ms, turns}, from this page's starts or from fq:run
-- ('<level>\n<tenant>\n<start ms>\n<turns>'); nil when unknown or already ended.
local function runOf(jobId)
  local run = pendingRuns[jobId]
  if run then
    pendingRuns[jobId] = nil
    endedRuns[jobId] = true
    return run
  end
  if endedRuns[jobId] then return nil end
  local text = redis.call('HGET', runKey, jobId)
  if not text then return nil end
  endedRuns[jobId] = true
  local level, tenant, startMs, turns = string.match(text, '^([^\n]*)\n(.*)\n([^\n]*)\n([^\n]*)$')
  return {level, tenant, tonumber(startMs), tonumber(turns) or 1}
end

-- A finished attempt of a job whose start was recorded: its worker time to its level, and
-- with fairness by time the estimates and the flow's charge.
local function finished(jobId, endMs, retried)
  local run = runOf(jobId)
  if not run then return end
  local level, tenant, startMs, turns = run[1], run[2], run[3], run[4]
  if not (level and startMs and levelWeight[level]) then return end
  local used = endMs - startMs
  if used < 0 then used = 0 end
  local names = fieldsOf[level]
  add(bucketOf(endMs), names.t, used)
  local row = servedOf(level)
  row[1] = row[1] + used
  if retried then
    add(bucketOf(endMs), names.R, 1)
    row[2] = row[2] + 1
  end
  if not byTime then return end
  if typical == nil then typical = tonumber(redis.call('HGET', stateKey, 'typ')) or false end
  local member = level .. '\n' .. tenant
  local bounded = used
  if typical then
    bounded = math.min(math.max(used, typical * fqMinCost), typical * fqMaxCost)
    -- What the run used beyond (or short of) the turns its flow paid at its start, kept
    -- as the flow's balance and settled a whole turn at a time (order.settle_debt).
    local debt = (stateOf('d:' .. member) or 0) + bounded / typical - turns
    if math.abs(debt) >= 1 then
      local last = tonumber(redis.call('ZSCORE', flowsKey, member))
      if last then
        local w = tonumber(redis.call('HGET', fweightsKey, member)) or 1
        local total = tonumber(redis.call('HGET', stateKey, 'W:' .. level)) or w
        local step = fqScale * debt * total / (levelWeight[level] * w)
        redis.call('ZADD', flowsKey, string.format('%.17g', last + step), member)
      end
      debt = 0
    end
    setState('d:' .. member, debt)
    typical = typical + typicalAlpha * (bounded - typical)
  else
    typical = math.max(bounded, 1)
  end
  typicalDirty = true
  local estimate = stateOf('c:' .. member)
  if estimate then estimate = estimate + flowAlpha * (bounded - estimate) else estimate = bounded end
  setState('c:' .. member, estimate)
end

local gapMs, fromFirst = 0, false
if not entries and info and info.first and idAfter(info.first, cursor) then
  -- Every entry left is after the cursor: were any trimmed before this read?
  local lost = 1
  if info.added and ord then
    lost = info.added - info.length - ord
    if lost < 0 then lost = 0 end -- the stream was deleted and made anew
  end
  if lost > 0 then
    local from, to = msOf(cursor), msOf(info.first)
    from = math.max(from, oldestS * 1000, since)
    local b = bucketOf(from)
    while to > from and b * 1000 < to do
      local lo, hi = math.max(from, b * 1000), math.min(to, (b + bucketS) * 1000)
      if hi > lo then
        add(b, 'g', hi - lo)
        gapMs = gapMs + hi - lo
      end
      b = b + bucketS
    end
  end
  -- Read from the first entry left (inclusive); ord counts up to just before it.
  cursor, fromFirst = info.first, true
  if info.added then ord = info.added - info.length end
end

if not entries then
  local start = '(' .. cursor
  if fromFirst then start = cursor end
  entries = {}
  if info then
    entries = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', pageSize)
  end
end
local read, recorded, unknown, bytes, last = 0, 0, 0, 0, nil
-- The events the step reads further than their name ('added', 'drained'... are skipped).
local wanted = {active = true, completed = true, failed = true, waiting = true, delayed = true}
for _, entry in ipairs(entries) do
  if bytes > byteBudget then break end
  read = read + 1
  last = entry[1]
  local f = entry[2]
  local event, jobId, prev = nil, nil, nil
  local from = 1
  if f[1] == 'event' then event, from = f[2], 3 end -- BullMQ writes it first
  if event == nil or wanted[event] then
    for i = from, #f, 2 do
      if f[i] == 'event' then event = f[i + 1]
      elseif f[i] == 'jobId' then jobId = f[i + 1]
      elseif f[i] == 'prev' then prev = f[i + 1] end
    end
  end
  if (event == 'completed' or event == 'failed') and jobId then
    finished(jobId, msOf(entry[1]), false)
  elseif (event == 'waiting' or event == 'delayed') and prev == 'active' and jobId then
    -- An attempt that failed with attempts left (at once, or after a backoff): a retry.
    finished(jobId, msOf(entry[1]), true)
  elseif event == 'active' and jobId then
    local startMs = msOf(entry[1])
    local startB = bucketOf(startMs)
    local jobKey = jobPrefix .. jobId
    local row = redis.call('HMGET', jobKey, 'timestamp', 'delay', 'ats', 'opts', 'data')
    local size = row[5] and #row[5] or 0
    bytes = bytes + size
    local level, tenant, readyAt = nil, 'default', nil
    if row[1] and size <= maxData then
      -- fairqueue's producer writes the level and tenant first in the data and the
      -- add script a whole fqReady in the opts: read as text when they are there so.
      local named, tid = string.match(row[5], fastMeta)
      local ready = string.match(row[4] or '', fastReady)
      if named and levelWeight[named] and ready then
        level, tenant, readyAt = named, tid, tonumber(ready)
      else
        local ok, data = pcall(cjson.decode, row[5] or '')
        local okOpts, opts = pcall(cjson.decode, row[4] or '{}')
        if not (okOpts and type(opts) == 'table') then opts = {} end
        readyAt = tonumber(opts['fqReady'])
        if ok and type(data) == 'table' then
          named, tid = data['priorityLevel'], data['tenantId']
          if named == nil or named == cjson.null then
            level = levelOfPriority(opts['priority'] or 0)
          elseif levelWeight[named] then
            level = named
          end
          if type(tid) == 'string' and tid ~= '' then
            tenant = tid
          elseif tid ~= nil and tid ~= cjson.null then
            level = nil -- unreadable fairqueue metadata, as the dashboard's '?'
          end
        end
      end
    end
    if not level then
      unknown = unknown + 1
      add(startB, 's:?', 1)
    else
      recorded = recorded + 1
      local names = fieldsOf[level]
      add(startB, names.s, 1)
      local rank = levelRank[level]
      startedBy[rank + 1] = startedBy[rank + 1] + 1
      local key = level .. '\n' .. tenant
      if startB >= oldestS then
        local tb = tenantIncr[startB]
        if not tb then tb = {}; tenantIncr[startB] = tb end
        tb[key] = (tb[key] or 0) + 1
      end
      -- Remembered until it finishes, with the turns its flow pays for it now.
      local turns = 1
      if byTime then
        if typical == nil then typical = tonumber(redis.call('HGET', stateKey, 'typ')) or false end
        if typical then
          turns = fqCostTurns(stateOf('c:' .. key), typical)
        end
      end
      pendingRuns[jobId] = {level, tenant, startMs, tonumber(string.format('%.6g', turns))}
      if (tonumber(row[3]) or 1) > 1 then
        add(startB, 'r', 1)
        add(startB, names.a, 1)
      else
        local readyMs = readyAt or ((tonumber(row[1]) or startMs) + (tonumber(row[2]) or 0))
        if readyMs > startMs then readyMs = startMs end
        local wait = startMs - readyMs
        waits[#waits + 1] = rank
        waits[#waits + 1] = wait
        add(bucketOf(readyMs) >= oldestS and bucketOf(readyMs) or oldestS, names.a, 1)
        add(startB, waitField(level, waitBin(wait)), 1)
        if wait > bound then add(startB, names.o, 1) end
      end
    end
  end
end

-- The runs this page ended, then those it started and did not see end (in that order: a
-- job that ended and started again is running).
local function inChunks(command, key, items)
  for i = 1, #items, 1000 do
    redis.call(command, key, unpack(items, i, math.min(i + 999, #items)))
  end
end
local ended, started = {}, {}
for jobId in pairs(endedRuns) do ended[#ended + 1] = jobId end
for jobId, run in pairs(pendingRuns) do
  started[#started + 1] = jobId
  started[#started + 1] = run[1] .. '\n' .. run[2] .. '\n' .. string.format('%d', run[3]) ..
    '\n' .. string.format('%.6g', run[4])
end
inChunks('HDEL', runKey, ended)
inChunks('HSET', runKey, started)
local stateWrites = {}
for field, text in pairs(stateDirty) do
  stateWrites[#stateWrites + 1] = field
  stateWrites[#stateWrites + 1] = text
end
if typicalDirty then
  stateWrites[#stateWrites + 1] = 'typ'
  stateWrites[#stateWrites + 1] = string.format('%.6g', typical)
end
if #stateWrites > 0 then redis.call('HSET', stateKey, unpack(stateWrites)) end

local expireS = retentionS + 2 * bucketS
for bucket, row in pairs(incr) do
  local key = bucketPrefix .. bucket
  for fieldName, n in pairs(row) do redis.call('HINCRBY', key, fieldName, n) end
  redis.call('EXPIRE', key, expireS)
end
for bucket, counts in pairs(tenantIncr) do
  local key = bucketPrefix .. 't:' .. bucket
  for member, n in pairs(counts) do redis.call('ZINCRBY', key, n, member) end
  local extra = redis.call('ZCARD', key) - keepTenants
  if extra > 0 then redis.call('ZREMRANGEBYRANK', key, 0, extra - 1) end
  redis.call('EXPIRE', key, expireS)
end
if last then
  redis.call('HSET', KEYS[2], 'cursor', last, 'ord', (ord or 0) + read)
elseif fromFirst then
  -- Nothing read: keep the cursor just before the first entry left.
  redis.call('HSET', KEYS[2], 'ord', ord or 0)
end
-- fq:run holds the attempts running now; an entry whose end the stream never showed (a
-- job removed while it ran) is dropped once the hash outgrows the active list.
if redis.call('HLEN', runKey) > 2 * redis.call('LLEN', jobPrefix .. 'active') + 1000 then
  local scan = redis.call('HSCAN', runKey, '0', 'COUNT', 1000)
  for i = 1, #scan[2], 2 do
    if not redis.call('LPOS', jobPrefix .. 'active', scan[2][i]) then
      redis.call('HDEL', runKey, scan[2][i])
    end
  end
end
local more = 0
if #entries == pageSize or bytes > byteBudget then more = 1 end
local flat = {}
for level, row in pairs(served) do
  flat[#flat + 1] = level
  flat[#flat + 1] = row[1]
  flat[#flat + 1] = row[2]
end
return {1, read, recorded, unknown, gapMs, more, startedBy, waits, flat}
