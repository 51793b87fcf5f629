--[[
  Add a batch of jobs at their fair places: BullMQ's own addPrioritizedJob, run once per
  job at the cap priority, its one ZADD given the job's fair score, and the job indexed
  for the pass. The job hash keeps the cap as its priority: that is where
  BullMQ's own scripts re-add it when it runs again (a retry, a promoted backoff, a
  rate-limited re-add), so a re-run waits at the back until the pass places it by the
  fair clock, instead of jumping to the front. The job's opts carry fqReady, its first
  ready time on Redis's clock (the second it is indexed under), for its re-runs.

  KEYS[1..9]  addPrioritizedJob's: marker, meta, id, prioritized, delayed, completed,
              active, events, pc
  KEYS[10..14] fairqueue's: state, flows, fweights, ready, jobs
  KEYS[15]    the limits key L (tenant_limits.lua)
  ARGV        fairness: what fairness counts ('time' or 'jobs');
              limits: JSON {tenant: encoded limits} of the call's tenants with limits
              ('' none): their jobs are held, and the call is refused whole, before
              anything is written, if it would put more than a tenant's max_waiting jobs
              waiting (the reply is then {'fq:backlog', tenant, max_waiting, waiting});
              batch: JSON {token, left: {tenant: jobs}} ('' none; only with limits): this
              call is part of a batch of several calls (tenant_limits.lua's
              fqCheckWaiting);
              jobs: per job, fqJobFields values: addPrioritizedJob's packed args, JSON
              data, packed opts (ending in the fqReady slot when fairqueue's packer made
              them), then the level, the tenant, the tenant weight, the caller's cost
              in ms ('' for the flow's estimate), the account ('' none) and its weight.
  Returns per job: the job id and its BullMQ priority (0: the id existed, nothing was
  added; the cap: parked, no room).
  The ready time is Redis's clock (TIME), never the producer's.
]]
--- @argv fairness limits batch jobs...
--- @include fair_clock
--- @include tenant_limits
-- The packer's fqReady slot: the opts map's last key, 'fqReady' -> uint64 2^64-1.
local fqReadySlot = '\167fqReady\207\255\255\255\255\255\255\255\255'
-- The fair score (text) of the job being added, for BullMQ's own ZADD of it (scripts.py's
-- ADD_SCORE_EDIT); nil: BullMQ's score (a held or parked job: the cap).
local fqScoreText = nil
local function fqBullmqAdd()
