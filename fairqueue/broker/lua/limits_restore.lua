--[[
  The database's limits written back to a queue's copy, each only where the copy still
  holds what it held before the database was read. An entry changed meanwhile (an add
  carrying the tenant's plan, a saved plan) is newer than the rows read and is kept: a
  rebuild never puts back a limit that was just changed.

  KEYS[1] the queue's limits hash (tenant -> encoded limits, tenant_limits.lua), or its
          accounts' (L:acc: account -> encoded limits) or their tenants' (L:tacct:
          tenant -> account, account_limits.lua)
  ARGV    rows: tenant (or account), the entry before the read ('' when there was none),
          the database's entry, ...
  Returns how many entries now hold the database's (the rest were kept).
]]
--- @argv rows...
local written = 0
for i = 1, #ARGV.rows, 3 do
  local tenant, before, wanted = ARGV.rows[i], ARGV.rows[i + 1], ARGV.rows[i + 2]
  local now = redis.call('HGET', KEYS[1], tenant) or ''
  if now == before then
    if now ~= wanted then
      redis.call('HSET', KEYS[1], tenant, wanted)
    end
    written = written + 1
  end
end
return written
