--[[
  The pass's fence, included by every script a pass runs: the pass may write only while
  its token holds the queue's leader lock. A free lock is taken; a held one is renewed,
  so a long pass never loses its own lock between two calls.
]]
local function fqHoldLock(lockKey, token, ttlMs)
  local holder = redis.call('GET', lockKey)
  if holder and holder ~= token then return false end
  redis.call('SET', lockKey, token, 'PX', ttlMs)
  return true
end
