end
local fqK = {prioritized = KEYS[4], state = KEYS[10], flows = KEYS[11], fweights = KEYS[12],
  ready = KEYS[13], jobs = KEYS[14]}
local fqNow = fqNowMs()
local fqJobs = {}
local fqByTime = ARGV[2] == 'time'
for i = 1, tonumber(ARGV[1]) do
  local b = 3 + (i - 1) * 7
  fqJobs[i] = {ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4],
    tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])}
end
local fqReplies = {}
local fqC = fqClock(fqK)
fqC.byTime = fqByTime
fqC.memo = fqNewMemo()
-- The packer leaves a slot for fqReady at the end of each job's packed opts (the last
-- key, a 9-byte uint64 of all ones; the priority is the cap already): the slot is
-- filled in as bytes, the same for every job of the call, instead of a repack per job.
local fqReadyPacked = cmsgpack.pack(fqNow)
if #fqReadyPacked ~= 9 then fqReadyPacked = nil end
local fqIndexed = {}
for _, job in ipairs(fqJobs) do
  local args = cmsgpack.unpack(job[1])
  local priority, score = 0, nil
  local slotted = fqReadyPacked and string.sub(job[3], -17) == fqReadySlot
  if slotted then job[3] = string.sub(job[3], 1, -10) .. fqReadyPacked end
  local fresh = args[2] == '' or redis.call('EXISTS', args[1] .. args[2]) == 0
  if fresh then
    score = fqPlace(fqK, fqC, job[4], job[5], job[6], false, job[7])
    priority = fqPriorityOf(score)
    if not slotted then
      local opts = cmsgpack.unpack(job[3])
      opts['priority'] = fqCap -- where BullMQ re-adds it (retries): the back, for the pass
      opts['fqReady'] = fqNow -- its first ready time (Redis's clock), kept for its re-runs
      job[3] = cmsgpack.pack(opts)
    end
  end
  ARGV[1], ARGV[2], ARGV[3] = job[1], job[2], job[3]
  local jobId = fqBullmqAdd()
  if fresh and type(jobId) == 'string' then
    if score then fqSetScore(fqK, jobId, score) end
    fqPlaced(fqK, fqC, score)
    fqIndexed[#fqIndexed + 1] = jobId
  end
  fqReplies[#fqReplies + 1] = jobId
  fqReplies[#fqReplies + 1] = priority
end
fqFlush(fqK, fqC)
fqIndexMany(fqK, fqIndexed, fqNow)
return fqReplies
