--[[
  Remove a page of one tenant's jobs that no worker has taken, each only if it still
  waits: in BullMQ's prioritized set, its delayed set (where fairqueue's held jobs sit
  too, beside their tenant's held list), its wait list or its paused list. A job a
  worker took meanwhile (active, completed, failed) is left as it is and counted as
  started: listing the ids and removing them one call each deleted jobs that had run,
  with their results. Jobs of a flow (a parent or children) and of a job scheduler are
  left too (BullMQ's own removal handles those), counted as kept.

  What a removal does is what BullMQ's removeJob does for a job without parent or
  children: the job leaves its set or list, its keys go (the hash, logs, dependencies,
  processed, failed, unsuccessful), its deduplication key goes if it names this job, and
  a 'removed' event is written (prev: its state). A held job also leaves its tenant's
  held list, its rank index and its entry in the limits' meta hash. fairqueue's other indexes forget it
  as the pass and the release step find it gone (as after BullMQ's removal).

  KEYS[1] prioritized  KEYS[2] delayed  KEYS[3] wait  KEYS[4] paused  KEYS[5] meta
  KEYS[6] events       KEYS[7] the tenant's held list (L:held:<tenant>)
  KEYS[8] L:meta       KEYS[9] the held list's rank index (L:hrank:<tenant>)
  ARGV    prefix (the queue's key prefix, '<prefix>:<queue>:'), ids...
  Returns {removed, started, gone, kept}: gone are ids no job has any more.

  Bounded work: per id O(1) commands (ZSCORE, HMGET, DEL...), but for an id found in
  neither sorted set, an LPOS on the wait and paused lists (fairqueue places its jobs in
  the prioritized set: those lists hold other producers' jobs until the pass adopts
  them), and for a held job an LREM on its held list, which the console reads from the
  front, so the LREM stops within the page. At 1M waiting and 10,000 tenants a call of
  100 ids costs about 100 times a few commands, whatever the queue's size.
]]
--- @argv prefix ids...
local prefix = ARGV.prefix
local removed, started, gone, kept = 0, 0, 0, 0
local maxEvents = nil
for i = 1, #ARGV.ids do
  local id = ARGV.ids[i]
  local jobKey = prefix .. id
  local f = redis.call('HMGET', jobKey, 'timestamp', 'parentKey', 'rjk', 'deid', 'data')
  if not (f[1] or f[5]) then
    gone = gone + 1
  elseif f[2] or f[3] or redis.call('EXISTS', jobKey .. ':dependencies') == 1 then
    kept = kept + 1
  else
    local prev = nil
    if redis.call('EXISTS', jobKey .. ':lock') == 1 then
      prev = nil -- a worker holds it: started
    elseif redis.call('ZREM', KEYS[1], id) == 1 then
      prev = 'prioritized'
    elseif redis.call('ZREM', KEYS[2], id) == 1 then
      prev = 'delayed'
      if redis.call('LREM', KEYS[7], 1, id) == 1 then
        redis.call('HDEL', KEYS[8], id)
        redis.call('ZREM', KEYS[9], id) -- and its place in the index (tenant_limits.lua)
      end
    elseif redis.call('LPOS', KEYS[3], id) then
      redis.call('LREM', KEYS[3], 1, id)
      prev = 'wait'
    elseif redis.call('LPOS', KEYS[4], id) then
      redis.call('LREM', KEYS[4], 1, id)
      prev = 'paused'
    end
    if prev == nil then
      started = started + 1
    else
      if f[4] then
        local dedup = prefix .. 'de:' .. f[4]
        if redis.call('GET', dedup) == id then
          redis.call('DEL', dedup, prefix .. 'dn:' .. f[4])
        end
      end
      redis.call('DEL', jobKey, jobKey .. ':logs', jobKey .. ':dependencies',
        jobKey .. ':processed', jobKey .. ':failed', jobKey .. ':unsuccessful')
      if not maxEvents then
        maxEvents = redis.call('HGET', KEYS[5], 'opts.maxLenEvents') or 10000
      end
      redis.call('XADD', KEYS[6], 'MAXLEN', '~', maxEvents, '*', 'event', 'removed',
        'jobId', id, 'prev', prev)
      removed = removed + 1
    end
  end
end
return {removed, started, gone, kept}
