--[[
  Add one delayed job: BullMQ's own addDelayedJob at fairqueue's parking priority (CAP),
  indexed by the second it becomes ready, with what the pass places it with in its own
  opts (fqReady, fqMeta: level, weight, tenant). When BullMQ promotes it, the pass adopts
  it into the fair order (its wait starts when it is ready, not when it was added).

  KEYS[1..6]  addDelayedJob's: marker, meta, id, delayed, completed, events
  KEYS[7..8]  fairqueue's: ready, jobs (no longer written: fairqueue 0.1 kept the meta
              there, and the pass still reads what it left)
  ARGV[1..3]  BullMQ's packed args, JSON data, packed opts; ARGV[4..6] the level, the
              tenant and the tenant weight; ARGV[7] the delay in ms.
  Returns the job id (BullMQ's negative code on error).
]]
local function fqBullmqAddDelayed()
