--[[
  Add one delayed job: BullMQ's own addDelayedJob at fairqueue's parking priority (CAP),
  indexed by the second it becomes ready, with what the pass places it with in its own
  opts (fqReady, fqMeta: level, weight, tenant). When BullMQ promotes it, the pass adopts
  it into the fair order (its wait starts when it is ready, not when it was added).

  KEYS[1..6]  addDelayedJob's: marker, meta, id, delayed, completed, events
  KEYS[7..8]  fairqueue's: ready, jobs (no longer written: fairqueue 0.1 kept the meta
              there, and the pass still reads what it left)
  KEYS[9]     the limits key L (tenant_limits.lua)  KEYS[10] BullMQ's prioritized set
  KEYS[11]    fq:dly: its flow's delayed jobs not placed yet are KEYS[11]:<level>:<tenant>,
              a zset by ready time (ms), so an estimate counts those due before a job's
              own start (estimate_start.lua); the pass drops each as it places it
  ARGV        addDelayedJob's (at its positions): packed args, JSON data, packed opts;
              then the level, the tenant and the tenant weight; the delay in ms; the
              tenant's encoded limits ('' for none); (optional) JSON {token, left}: this
              job is part of a batch added over several calls (fqCheckWaiting) ('': not);
              (optional) its account's encoded limits (its opts' fqAcct names the
              account), whose max_waiting counts it as an undelayed job's add does.
  A job of a tenant with limits (or paused, or catching up) is held from the start: in
  BullMQ's delayed set at the held score, so no worker's promotion can make it takeable
  outside its tenant's limits, and in L:later:<tenant> at its ready time, from which the
  release step moves it to the tenant's held jobs once it is due (then released in
  its fair order like any held job). Its account's limits, when given, are written as
  an undelayed add writes them (L:acc, L:tacct) and the job counts in L:aheld:<account>.
  Returns the job id (BullMQ's negative code on error), or the refusal {'fq:backlog',
  tenant (or '\n<account>'), max_waiting, waiting} before anything is written.
]]
--- @argv packed_args data opts level tenant weight delay limits batch? account_limits?
--- @include tenant_limits
local function fqBullmqAddDelayed()
