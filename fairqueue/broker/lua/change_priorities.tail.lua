-- Change priorities, tail piece (after BullMQ's changePriority-7.lua): closes
-- fqBullmqChange(), then per pair sets ARGV[1..4] to (priority, prefix, job id, '0')
-- and calls it. KEYS and ARGV as in change_priorities.head.lua.
end
local fqCodes = {}
for i, pair in ipairs(fqPairs) do
  ARGV[1], ARGV[2], ARGV[3], ARGV[4] = pair[2], fqPrefix, pair[1], '0'
  fqCodes[i] = fqBullmqChange()
end
return fqCodes
