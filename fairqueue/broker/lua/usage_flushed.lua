--[[
  The usage ledger's rows the loop wrote to the database: each leaves the dirty set only
  if no history commit changed it since the loop read it (its score, the commit's
  version, is still the one read), so a row counted meanwhile is written again.

  KEYS[1] <prefix>:<queue>:fq:use:dirty (zset: '<day>\n<tenant>\n<job type>' -> version)
  ARGV    rows: member, version read, ...
  Returns how many left the set.
]]
--- @argv rows...
local removed = 0
for i = 1, #ARGV.rows, 2 do
  local member, version = ARGV.rows[i], ARGV.rows[i + 1]
  local score = redis.call('ZSCORE', KEYS[1], member)
  if score and tonumber(score) == tonumber(version) then
    removed = removed + redis.call('ZREM', KEYS[1], member)
  end
end
return removed
