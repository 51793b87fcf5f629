--[[
  Take the leader lock if it is free, or renew it if this token holds it, in one step
  (a separate SET NX and renew let a lone rebalancer's lock expire in between).
  KEYS[1] the lock  ARGV token, ttl ms.  Returns 1 if the token holds the lock.
]]
--- @argv token ttl
--- @include lock_fence
if fqHoldLock(KEYS[1], ARGV.token, ARGV.ttl) then return 1 end
return 0
