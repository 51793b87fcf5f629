--[[
  Recover stalled jobs and place them in the fair order, in one step. BullMQ's own
  moveStalledJobsToWait (the check every worker runs every stalledInterval) puts a job
  whose worker died back on the wait list, at the end workers take from next: ahead of
  every flow's turn. Run here, by the leader, more often than workers run it (its gate
  key is taken over for each call), each job it recovers is taken off the wait list in
  the same script, before any worker can take it, and placed like a new arrival of its
  flow (counted aged if its first wait is past the bound), its index entry
  kept. A job BullMQ failed for stalling too often stays on the wait list, marked: a
  worker fails it when it takes it, as BullMQ does.

  KEYS[1..9]   moveStalledJobsToWait's: stalled, wait, active, stalled-check, meta,
               paused, marker, events, repeat
  KEYS[10..14] fairqueue's: prioritized, state, flows, fweights, ready
  KEYS[15]     fq:jobs  KEYS[16] the leader lock
  KEYS[17..18] the limits key L (tenant_limits.lua), BullMQ's delayed set
  A recovered job of a tenant with limits, paused or catching up is held again
  (tenant_limits.lua's fqRehold), not placed: it starts only through its limits.
  ARGV         moveStalledJobsToWait's (at its positions): max stalled count, job key
               prefix, timestamp, the gate's time (ms); then token, lock ttl ms, wait
               bound ms, payload cap bytes, what fairness counts ('time'/'jobs')
  Returns {status (1 ok, -1 lock lost), recovered, aged}.
]]
--- @argv max_stalled prefix timestamp gate_ms token ttl bound max_payload fairness
--- @include fair_clock
--- @include tenant_limits
--- @include lock_fence
--- @include rerun_meta
local function fqBullmqStalled()
