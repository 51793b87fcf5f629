--[[
  Adopt one page of untagged waiting jobs into the fair order: jobs in BullMQ's wait
  list (priority 0, served before every prioritized job), jobs below the tag band
  (other producers' small priorities) and jobs parked at CAP (promoted delayed jobs,
  jobs that found no room, and every job BullMQ re-added because it runs again: a retry,
  a promoted backoff, a stalled job's recovery, a retried failed job). Each gets its
  flow's next tag, like a new arrival of its flow, through BullMQ's own changePriority
  (at the cap priority, so a later re-add lands at the back again), charged to its flow
  like any turn; a job already past the wait bound is counted (aged), not moved ahead of
  another flow (docs/design.md, "The wait bound"). Jobs without meta are
  read once (tenantId / priorityLevel, else their numeric priority; a payload over the
  size cap is not decoded) and indexed at their first ready time unless indexed there
  already. fairqueue's own delayed jobs are placed from the meta in their opts (fqMeta);
  meta that fairqueue 0.1 kept in fq:jobs is still read, and then goes.

  KEYS[1..7]   changePriority's: wait, paused, meta, prioritized, active, pc, marker
  KEYS[8..12]  fairqueue's: state, flows, fweights, ready, jobs
  KEYS[13]     the leader lock
  KEYS[14..16] the limits key L (tenant_limits.lua), BullMQ's delayed set and events
  KEYS[17]     fq:dly (add_delayed): a delayed job placed or held leaves its flow's index
  ARGV         token, lock ttl ms, job key prefix, page size, wait bound ms,
               payload cap bytes, dry run (1/0), what fairness counts ('time'/'jobs');
               read before changePriority's own are written over them, per job
  A job of a tenant with limits, paused or catching up is not placed: it goes back to
  the tenant's held jobs (tenant_limits.lua's fqRehold), so a retry, a promoted delayed
  job or a stalled job's recovery starts only through the tenant's limits.
  Returns {status (1 ok, -1 lock lost), adopted, aged, parked (no room), examined, held}.
]]
--- @argv token ttl prefix page bound max_payload dry fairness
--- @include fair_clock
--- @include tenant_limits
--- @include lock_fence
--- @include rerun_meta
local function fqBullmqChange()
