--[[
  Add a batch of jobs at their fair places: BullMQ's own addPrioritizedJob, run once per
  job with the priority fair_clock gives it, then the job's score set to its fair
  score, and the job indexed for the pass.

  KEYS[1..9]  addPrioritizedJob's: marker, meta, id, prioritized, delayed, completed,
              active, events, pc
  KEYS[10..14] fairqueue's: state, flows, fweights, ready, jobs
  ARGV[1]     the number of jobs n; then per job: BullMQ's packed args, JSON data,
              packed opts, then the level, the tenant and the tenant weight.
  Returns per job: the job id and its BullMQ priority (0: the id existed, nothing was
  added; the cap: parked, no room).
  The ready time is Redis's clock (TIME), never the producer's.
]]
--- @include fair_clock
local function fqBullmqAdd()
