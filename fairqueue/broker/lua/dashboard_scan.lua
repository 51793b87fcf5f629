-- One page of a backlog scan over the wait list or the prioritized set, classifying
-- each job by level and tenant as rebalance.pending_from_job does.
-- KEYS[1]: the wait list (mode 'list') or the prioritized set (mode 'zset').
-- ARGV: mode ('list'/'zset'); cursor (list index; for the set '-inf' to start, else the
-- last job read as '<score> <id>'); page size; overdue cutoff (ms); job key prefix.
--- @argv mode cursor count cutoff prefix
-- A job is overdue when its ready time is before the cutoff: its first release when its
-- tenant's limit held it (fqRel), else its first ready time (fqReady in its opts), else
-- BullMQ's timestamp plus its delay, the rule the pass's index follows, so held and
-- delayed time is not waiting and the two counts agree.
-- The set is paged by rank from the last job read (ZRANK), not by score: jobs of a
-- level's tenants often share a score, and a '(score' cursor skipped the ties behind a
-- page boundary. If that job left meanwhile, the page starts at the first job of its
-- score (ties may then be counted twice: the scan is a snapshot, not a transaction).
-- Returns {count, next cursor, [level, waiting, overdue, oldest ts]...,
-- [level, tenant, waiting, overdue]...}.
local mode, cursor, count = ARGV.mode, ARGV.cursor, tonumber(ARGV.count)
local cutoff, prefix = tonumber(ARGV.cutoff), ARGV.prefix
local ids, nextCursor = {}, cursor
if mode == 'list' then
  local first = tonumber(cursor)
  ids = redis.call('LRANGE', KEYS[1], first, first + count - 1)
  nextCursor = tostring(first + #ids)
else
  local start = 0
  if cursor ~= '-inf' then
    local gap = string.find(cursor, ' ', 1, true)
    local score, member = string.sub(cursor, 1, gap - 1), string.sub(cursor, gap + 1)
    local rank = redis.call('ZRANK', KEYS[1], member)
    if rank and redis.call('ZSCORE', KEYS[1], member) == score then
      start = rank + 1
    else
      start = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. score)
    end
  end
  local entries = redis.call('ZRANGE', KEYS[1], start, start + count - 1, 'WITHSCORES')
  for i = 1, #entries, 2 do ids[#ids + 1] = entries[i] end
  if #entries > 0 then nextCursor = entries[#entries] .. ' ' .. entries[#entries - 1] end
end
local names = {critical = true, high = true, normal = true, low = true}
local function normalize(p)
  if p < 0 then return nil end
  if p == 0 then return 'normal' end
  if p == 1 then return 'critical' end
  if p <= 3 then return 'high' end
  if p <= 5 then return 'normal' end
  return 'low'
end
local stats, tenants = {}, {}
for _, id in ipairs(ids) do
  local row = redis.call('HMGET', prefix .. id, 'data', 'timestamp', 'priority', 'opts',
    'fqRel')
  local ts = tonumber(row[2])
  local level, tenant = nil, nil
  local opts = false -- decoded on first use
  local function optsOf()
    if opts == false then
      opts = nil
      if row[4] then
        local okOpts, decoded = pcall(cjson.decode, row[4])
        if okOpts and type(decoded) == 'table' then opts = decoded end
      end
    end
    return opts
  end
  if ts and row[1] and string.find(row[1], '^%s*{') then
    local ok, data = pcall(cjson.decode, row[1])
    if ok and type(data) == 'table' then
      local t = data['tenantId']
      if t == nil or t == cjson.null then tenant = '' -- no tenant (no tenant id is empty)
      elseif type(t) == 'string' and t ~= '' then tenant = t end
      local l = data['priorityLevel']
      if l ~= nil and l ~= cjson.null then
        if type(l) == 'string' and names[l] then level = l end
      else
        local p = nil
        local o = optsOf()
        if o and type(o['priority']) == 'number' and o['priority'] == math.floor(o['priority']) then
          p = o['priority']
        end
        if p == nil then
          if mode == 'list' then p = 0 else p = tonumber(row[3]) or 0 end
        end
        level = normalize(p)
      end
    end
  end
  if tenant == nil then level = nil end
  local key = level or '?'
  local s = stats[key]
  if s == nil then
    s = {0, 0, -1}
    stats[key] = s
  end
  s[1] = s[1] + 1
  local late = 0
  if ts then
    local ready = tonumber(row[5])
    if not ready then
      local o = optsOf()
      ready = o and tonumber(o['fqReady'])
      if not ready then
        ready = ts
        if o and type(o['delay']) == 'number' and o['delay'] > 0 then ready = ts + o['delay'] end
      end
    end
    if ready < cutoff then
      s[2] = s[2] + 1
      late = 1
    end
    if s[3] < 0 or ts < s[3] then s[3] = ts end
  end
  if level then
    local byTenant = tenants[level]
    if byTenant == nil then
      byTenant = {}
      tenants[level] = byTenant
    end
    local t = byTenant[tenant]
    if t == nil then
      t = {0, 0}
      byTenant[tenant] = t
    end
    t[1] = t[1] + 1
    t[2] = t[2] + late
  end
end
local flatStats, flatTenants = {}, {}
for key, s in pairs(stats) do
  flatStats[#flatStats + 1] = key
  flatStats[#flatStats + 1] = s[1]
  flatStats[#flatStats + 1] = s[2]
  flatStats[#flatStats + 1] = s[3]
end
for level, byTenant in pairs(tenants) do
  for tenant, t in pairs(byTenant) do
    flatTenants[#flatTenants + 1] = level
    flatTenants[#flatTenants + 1] = tenant
    flatTenants[#flatTenants + 1] = t[1]
    flatTenants[#flatTenants + 1] = t[2]
  end
end
return {#ids, nextCursor, flatStats, flatTenants}
