-- The dashboard's reads of a queue's limited tenants (limits_rows.lua reads the few
-- listed in full), each call bounded, so the page answers alike at ten or ten thousand
-- tenants holding jobs: the totals walk the set of tenants with held jobs a page at a
-- time inside Redis (one LLEN each, no reply per tenant).
-- KEYS[1]: L, the queue's limits hash (tenant_limits.lua names the keys beside it).
-- ARGV: an SSCAN cursor of L:tenants ('0' to start), tenants a call reads (SSCAN's
-- COUNT), how many of them to return, those holding the most jobs first (then by id).
-- Returns {next cursor ('0': done), tenants read, tenants holding jobs, jobs held,
-- [tenant, held]...}. Tenants joining or leaving the set while a walk runs may be missed
-- or read twice (SSCAN's guarantee); at rest it is exact.
--- @argv cursor count top
local L = KEYS[1]
local scanned = redis.call('SSCAN', L .. ':tenants', ARGV.cursor, 'COUNT', tonumber(ARGV.count))
local top = tonumber(ARGV.top)
local holding, held, found = 0, 0, {}
for _, tenant in ipairs(scanned[2]) do
  local n = redis.call('LLEN', L .. ':held:' .. tenant)
  if n > 0 then
    holding = holding + 1
    held = held + n
    found[#found + 1] = {tenant, n}
  end
end
if #found > top then
  table.sort(found, function(a, b) return a[2] > b[2] or (a[2] == b[2] and a[1] < b[1]) end)
end
local reply = {scanned[1], #scanned[2], holding, held}
for i = 1, math.min(top, #found) do
  reply[#reply + 1] = found[i][1]
  reply[#reply + 1] = found[i][2]
end
return reply
