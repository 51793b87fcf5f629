-- One tenant's jobs among a bounded part of a queue, matched inside Redis so only its
-- own come back (the console's tenant page: no reply per job of other tenants).
-- KEYS[1]: the wait list; KEYS[2]: the prioritized set; KEYS[3]: the active list;
-- KEYS[4]: the failed set.
-- ARGV: part ('front': pop positions first..last, 0-based; 'active': the active list's
-- first..last; 'failed': the failed set's newest first..last), first, last, the
-- tenant, the job key prefix, and whether the tenant id reads the same inside JSON (then
-- a job whose data does not hold it verbatim is skipped without decoding).
-- Returns {entries read, [id, position (front: 1-based) or failed time (failed) or 0]...}.
--- @argv part first last tenant prefix verbatim
local first, last = tonumber(ARGV.first), tonumber(ARGV.last)
local tenant, prefix, verbatim = ARGV.tenant, ARGV.prefix, ARGV.verbatim == '1'
local ids, marks = {}, {}
if ARGV.part == 'front' then
  local waitLen = redis.call('LLEN', KEYS[1])
  if first < waitLen then
    local stop = math.min(last, waitLen - 1)
    local found = redis.call('LRANGE', KEYS[1], waitLen - 1 - stop, waitLen - 1 - first)
    for i = #found, 1, -1 do ids[#ids + 1] = found[i] end
  end
  if last >= waitLen then
    local found = redis.call('ZRANGE', KEYS[2], math.max(first - waitLen, 0), last - waitLen)
    for i = 1, #found do ids[#ids + 1] = found[i] end
  end
  for i = 1, #ids do marks[i] = first + i end
elseif ARGV.part == 'active' then
  ids = redis.call('LRANGE', KEYS[3], first, last)
  for i = 1, #ids do marks[i] = 0 end
else
  local found = redis.call('ZREVRANGE', KEYS[4], first, last, 'WITHSCORES')
  for i = 1, #found, 2 do
    ids[#ids + 1] = found[i]
    marks[#marks + 1] = found[i + 1]
  end
end
local out = {#ids}
for i, id in ipairs(ids) do
  local data = redis.call('HGET', prefix .. id, 'data')
  if data and (not verbatim or string.find(data, tenant, 1, true)) then
    local ok, decoded = pcall(cjson.decode, data)
    if ok and type(decoded) == 'table' and decoded['tenantId'] == tenant then
      out[#out + 1] = id
      out[#out + 1] = marks[i]
    end
  end
end
return out
