-- What the rebalance pass needs of each job, the payload parsed inside Redis.
-- KEYS: none. ARGV[1]: job key prefix; ARGV[2..]: job ids.
-- Returns, per job still there, 10 fields: id, name, timestamp, priority, attempts
-- made, data flag (1: JSON object), tenant, tenant flag (1 string, 0 missing/null,
-- 2 not a string), level ('' missing, '?' not a string), requested priority (-1).
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local f = redis.call('HMGET', ARGV[1] .. id, 'name', 'data', 'timestamp', 'priority', 'atm',
    'opts')
  if f[1] or f[2] or f[3] then
    local ok, data = pcall(cjson.decode, f[2] or 'null')
    -- cjson turns arrays into tables too; a non-empty array has an element at 1
    local isObject = ok and type(data) == 'table' and data[1] == nil
    local tenant, tenantFlag, level, requested = '', 0, '', -1
    if isObject then
      local t = data['tenantId']
      if type(t) == 'string' then tenant, tenantFlag = t, 1
      elseif t ~= nil and t ~= cjson.null then tenantFlag = 2 end
      local l = data['priorityLevel']
      if type(l) == 'string' then level = l
      elseif l ~= nil and l ~= cjson.null then level = '?' end
      if level == '' then
        local okOpts, opts = pcall(cjson.decode, f[6] or 'null')
        if okOpts and type(opts) == 'table' and type(opts['priority']) == 'number' then
          requested = opts['priority']
        end
      end
    end
    out[#out + 1] = id
    out[#out + 1] = f[1] or ''
    out[#out + 1] = f[3] or ''
    out[#out + 1] = f[4] or '0'
    out[#out + 1] = f[5] or '0'
    out[#out + 1] = isObject and 1 or 0
    out[#out + 1] = tenant
    out[#out + 1] = tenantFlag
    out[#out + 1] = level
    out[#out + 1] = requested
  end
end
return out
