--[[
  The worker time so far of some tenants' attempts running now, for the quota check
  (``fairqueue.quota_watch``): the history step's runs (fq:run) of those tenants whose
  job a worker still holds (its lock exists: an attempt whose end the history has not
  read yet counts nothing, never its time after the end), each from its start to now,
  on Redis's clock as the ledger counts them. Reads only: O(runs) for the hash, O(1) a
  watched tenant's run.

  KEYS[1] <prefix>:<queue>:fq:run (hash: job id -> '<level>\n<tenant>\n<start ms>\n<turns>')
  ARGV    job key prefix ('<prefix>:<queue>:'), then the tenants
  Returns {tenant, attempts running, their ms so far, ...}, tenants with none running
  left out.
]]
--- @argv job_prefix tenants...
local wanted = {}
for i = 1, #ARGV.tenants do wanted[ARGV.tenants[i]] = true end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local found, order = {}, {}
local runs = redis.call('HGETALL', KEYS[1])
for i = 1, #runs, 2 do
  local tenant, start = string.match(runs[i + 1], '^[^\n]*\n(.*)\n([^\n]*)\n[^\n]*$')
  start = tonumber(start)
  if tenant and start and wanted[tenant]
      and redis.call('EXISTS', ARGV.job_prefix .. runs[i] .. ':lock') == 1 then
    local row = found[tenant]
    if not row then
      row = {0, 0}
      found[tenant] = row
      order[#order + 1] = tenant
    end
    row[1] = row[1] + 1
    row[2] = row[2] + math.max(0, now - start)
  end
end
local out = {}
for _, tenant in ipairs(order) do
  out[#out + 1] = tenant
  out[#out + 1] = found[tenant][1]
  out[#out + 1] = found[tenant][2]
end
return out
