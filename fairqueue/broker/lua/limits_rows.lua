-- The dashboard's reads of the few limited tenants its page lists, in full
-- (limits_walk.lua counts them all).
-- KEYS[1]: L, the queue's limits hash (tenant_limits.lua names the keys beside it);
-- KEYS[2]: the queue's active list.
-- ARGV: held job ids returned per tenant, then the tenants. Returns per tenant {limits
-- ('' for none), paused, catching up, held, occupied (released, not finished), running
-- (of those, in BullMQ's active list), {first held ids}}.
--- @argv shown tenants...
local L = KEYS[1]
local shown = tonumber(ARGV.shown)
local active = nil -- the active list as a set, read once if any tenant occupies a slot
local rows = {}
for i = 1, #ARGV.tenants do
  local tenant = ARGV.tenants[i]
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
