-- The dashboard's reads of a queue's limited tenants, each call bounded, so the page
-- answers alike at ten or ten thousand tenants holding jobs: the totals walk the set of
-- tenants with held jobs a page at a time inside Redis (one LLEN each, no reply per
-- tenant), and only the few tenants the page lists are read in full.
-- KEYS[1]: L, the queue's limits hash (tenant_limits.lua names the keys beside it);
-- KEYS[2]: the queue's active list (mode 'rows').
-- ARGV[1]: mode.
--   'walk': ARGV[2] an SSCAN cursor of L:tenants ('0' to start), ARGV[3] tenants a call
--     reads (SSCAN's COUNT), ARGV[4] how many of them to return, those holding the most
--     jobs first (then by id). Returns {next cursor ('0': done), tenants read, tenants
--     holding jobs, jobs held, [tenant, held]...}. Tenants joining or leaving the set
--     while a walk runs may be missed or read twice (SSCAN's guarantee); at rest it is
--     exact.
--   'rows': ARGV[2] held job ids returned per tenant, ARGV[3..] tenants. Returns per
--     tenant {limits ('' for none), paused, catching up, held, occupied (released, not
--     finished), running (of those, in BullMQ's active list), {first held ids}}.
local L, mode = KEYS[1], ARGV[1]

if mode == 'walk' then
  local scanned = redis.call('SSCAN', L .. ':tenants', ARGV[2], 'COUNT', tonumber(ARGV[3]))
  local top = tonumber(ARGV[4])
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
end

-- 'rows'
local shown = tonumber(ARGV[2])
local active = nil -- the active list as a set, read once if any tenant occupies a slot
local rows = {}
for i = 3, #ARGV do
  local tenant = ARGV[i]
  local out = redis.call('SMEMBERS', L .. ':out:' .. tenant)
  local running = 0
  if #out > 0 then
    if not active then
      active = {}
      for _, id in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do active[id] = true end
    end
    for _, id in ipairs(out) do
      if active[id] then running = running + 1 end
    end
  end
  local heldKey = L .. ':held:' .. tenant
  rows[#rows + 1] = {
    redis.call('HGET', L, tenant) or '',
    redis.call('HEXISTS', L .. ':paused', tenant),
    redis.call('HEXISTS', L .. ':catchup', tenant),
    redis.call('LLEN', heldKey),
    #out,
    running,
    shown > 0 and redis.call('LRANGE', heldKey, 0, shown - 1) or {},
  }
end
return rows
