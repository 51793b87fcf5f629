-- Add jobs, tail piece (after BullMQ's addPrioritizedJob-9.lua): closes
-- fqBullmqAdd(), then per job tags it, sets ARGV[1..4] to its BullMQ arguments and
-- calls fqBullmqAdd(). KEYS and ARGV as in add_jobs.head.lua.
end
local fqJobs = {}
for i = 1, tonumber(ARGV[1]) do
  local b = 2 + (i - 1) * 5
  fqJobs[i] = {ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]}
end
local fqReplies = {}
for i, job in ipairs(fqJobs) do
  local args = cmsgpack.unpack(job[1])
  local priority = 0
  if args[2] == '' or fqCall('EXISTS', args[1] .. args[2]) == 0 then
    priority = fqTag(job[5])
    local opts = cmsgpack.unpack(job[3])
    opts['priority'] = priority
    job[3] = cmsgpack.pack(opts)
  end
  ARGV[1], ARGV[2], ARGV[3], ARGV[4] = job[1], job[2], job[3], job[4]
  fqReplies[#fqReplies + 1] = fqBullmqAdd()
  fqReplies[#fqReplies + 1] = priority
end
return fqReplies
