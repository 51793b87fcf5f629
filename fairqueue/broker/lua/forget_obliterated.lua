--[[
  Forget fairqueue's keys of a queue that BullMQ obliterated (Queue.obliterate deletes
  every key of BullMQ's, its 'id' counter last, and knows nothing of fairqueue's). Every
  add increments 'id', so fairqueue state beside a queue without one belongs to jobs
  that are gone. Atomic: an add that comes after this call starts from fresh state.

  KEYS[1] BullMQ's id counter  KEYS[2] fq:ready (its seconds' lists are KEYS[2]:<second>)
  KEYS[3] the leader lock  KEYS[4] fq:flows (its flows' lines are KEYS[4]:<flow>)
  KEYS[5] fq:dly, the set of flows with delayed jobs (their indexes are KEYS[5]:<flow>)
  KEYS[6..] the other fairqueue keys to delete
  ARGV    token, lock ttl ms, seconds of the ready index per call
  Returns {status (0 the queue exists: nothing done, 1 ok, -1 lock lost), keys deleted,
  done (1/0: call again while 0)}.
]]
--- @argv token ttl page
--- @include lock_fence
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, 0, 1} end
if not fqHoldLock(KEYS[3], ARGV.token, ARGV.ttl) then return {-1, 0, 1} end
local page = tonumber(ARGV.page)
local seconds = redis.call('ZRANGE', KEYS[2], 0, page - 1)
local deleted = 0
for _, second in ipairs(seconds) do
  deleted = deleted + redis.call('DEL', KEYS[2] .. ':' .. second)
end
if #seconds > 0 then redis.call('ZREM', KEYS[2], unpack(seconds)) end
if #seconds == page then return {1, deleted, 0} end
local flows = redis.call('ZRANGE', KEYS[4], 0, page - 1)
for _, flow in ipairs(flows) do
  deleted = deleted + redis.call('DEL', KEYS[4] .. ':' .. flow)
end
if #flows > 0 then redis.call('ZREM', KEYS[4], unpack(flows)) end
if #flows == page then return {1, deleted, 0} end
local delayedFlows = redis.call('SPOP', KEYS[5], page)
for _, flow in ipairs(delayedFlows) do
  deleted = deleted + redis.call('DEL', KEYS[5] .. ':' .. flow)
end
if #delayedFlows == page then return {1, deleted, 0} end
deleted = deleted + redis.call('DEL', KEYS[2], unpack(KEYS, 4))
return {1, deleted, 1}
