--[[
  Where the virtual time stands now, kept in the current history bucket, so the start
  estimate reads the pace the virtual time really moved at (docs/design.md, "When a job
  will start"). The model's pace counts one lone tenant's step per turn; a flow's jobs
  placed while a quiet tenant was briefly counted move the virtual time by wider steps,
  and only the clock itself shows by how much.

  Read as eta_place's fqEtaClock reads it (the virtual time moved to the first tagged job
  waiting; written nowhere else), with Redis's clock, which the estimate reads too.
  KEYS[1] fq:state  KEYS[2] BullMQ's prioritized set  KEYS[3] BullMQ's wait list (the
  clock's K; unused here)  KEYS[4] fq:hist (the bucket keys are '<fq:hist>:<start>', the
  same hash tag)
  ARGV    bucket seconds, seconds a bucket is kept
  Writes  fields vt0 / vt0ms (the bucket's first sample, HSETNX) and vt1 / vt1ms (its
          last) of the current bucket, and the bucket's expiry.
  Work:   one HMGET, one ZRANGEBYSCORE LIMIT 1 (O(log n): 1M waiting, any number of
          tenants), at most five writes to one small hash.
]]
--- @argv bucket_s ttl
--- @include eta_place
local K = {state = KEYS[1], prioritized = KEYS[2], wait = KEYS[3], hist = KEYS[4]}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local bucketS = tonumber(ARGV.bucket_s)
local key = K.hist .. ':' .. string.format('%d', math.floor(now / 1000 / bucketS) * bucketS)
local vt = fqEtaNum(fqEtaClock(K).vt)
local ms = string.format('%d', now)
if redis.call('HSETNX', key, 'vt0', vt) == 1 then
  redis.call('HSET', key, 'vt0ms', ms)
end
redis.call('HSET', key, 'vt1', vt, 'vt1ms', ms)
redis.call('EXPIRE', key, tonumber(ARGV.ttl))
return 1
