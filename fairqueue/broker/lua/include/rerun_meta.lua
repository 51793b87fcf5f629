--[[
  What the pass needs to place a job that fairqueue has no meta for (included by
  adopt_page and stalled_page): another producer's job, or one of fairqueue's that runs
  again.
]]
--- @include wire
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
-- a retried failed job). Its ready time is its first one: when its tenant's limit held
-- it, its first release (fqRel in its hash: held time is not waiting), else fqReady in
-- its opts for fairqueue's jobs (Redis's clock, the second its index entry is under), else BullMQ's
-- timestamp plus the delay it was added with (the hash's delay is a backoff's once it
-- was retried). Its tenant weight is the one its flow counts now (1 if the flow has no
-- work). Then its account and the account's weight (nil: none), kept in its opts
-- (fqAcct) when it was added (docs/design.md, "Accounts").
local function fqForeign(K, prefix, jobId, now, maxPayload)
  local f = redis.call('HMGET', prefix .. jobId, 'data', 'opts', 'timestamp', 'priority',
    'fqRel')
  if not (f[1] or f[2] or f[3]) then return nil end -- no such job (removed meanwhile)
  local ok, opts = pcall(cjson.decode, f[2] or 'null')
  if not (ok and type(opts) == 'table') then opts = {} end
  if type(opts['fqMeta']) == 'string' and tonumber(opts['fqReady']) then
    -- One of fairqueue's delayed jobs: placed from its own meta, no payload decoded.
    local mLevel, mWeight, mTenant = fqDelayedMetaSplit(opts['fqMeta'])
    if mLevel and fqNames[mLevel] then
      local account, accountWeight = fqAccountMetaSplit(opts['fqAcct'])
      return mLevel, mTenant, tonumber(mWeight) or 1, fqReadyFrom(f[5], opts, f[3], now),
        account, accountWeight
    end
  end
  local tenant, level = 'default', nil
  if f[1] and #f[1] <= maxPayload and string.find(f[1], '^%s*{') then
    local ok, data = pcall(cjson.decode, f[1])
    if ok and type(data) == 'table' then
      if type(data['tenantId']) == 'string' and data['tenantId'] ~= '' then
        tenant = data['tenantId']
      elseif data['tenantId'] == cjson.null then
        tenant = '(internal)' -- an internal job: levels.INTERNAL_TENANT, no tenant's bucket
      end
      if type(data['priorityLevel']) == 'string' and fqNames[data['priorityLevel']] then
        level = data['priorityLevel']
      end
    end
  end
  if not level then
    local requested = nil
    if type(opts['priority']) == 'number' then requested = opts['priority'] end
    level = fqNormalize(requested or tonumber(f[4]))
  end
  local ready = fqReadyFrom(f[5], opts, f[3], now)
  local weight = tonumber(redis.call('HGET', K.fweights, fqFlowMember(level, tenant))) or 1
  local account, accountWeight = fqAccountMetaSplit(opts['fqAcct'])
  return level, tenant, weight, ready, account, accountWeight
end

-- A job's account as its opts keep it (fqAcct): fqAccountMeta's string, or nil.
local function fqJobAccount(jobKey)
  local ok, opts = pcall(cjson.decode, redis.call('HGET', jobKey, 'opts') or 'null')
  if ok and type(opts) == 'table' and fqAccountMetaSplit(opts['fqAcct']) then
    return opts['fqAcct']
  end
  return nil
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
