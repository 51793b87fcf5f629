--[[
  Move one page of the tagged jobs' scores down so tags never reach BullMQ's cap on a
  queue that is never empty (with 1/SUB of a tag per score unit that takes about 10^11
  jobs; this is the safety net). A rebase shifts every tagged job by the same delta, a page at a time from
  the head (shifted jobs stay ahead of unshifted ones, so the order never changes), and
  fair_clock places new jobs in shifted terms below the cursor. The job hashes are not
  touched: their priority is the cap (where BullMQ re-adds a job that runs again).

  KEYS[1] BullMQ's prioritized  KEYS[2] state  KEYS[3] flows  KEYS[4] fweights
  KEYS[5] jobs  KEYS[6] the leader lock
  ARGV    token, lock ttl ms, job key prefix, page size, threshold (start a rebase when
          the virtual time is this far above the base), margin (kept below it)
  Returns {status (1 ok, -1 lock lost), moved, done (1/0: no rebase in progress)}.
]]
--- @argv token ttl prefix page threshold margin
--- @include fair_clock
--- @include lock_fence
if not fqHoldLock(KEYS[6], ARGV.token, ARGV.ttl) then return {-1, 0, 1} end
local prefix, page = ARGV.prefix, tonumber(ARGV.page)
local threshold, margin = tonumber(ARGV.threshold), tonumber(ARGV.margin)
local K = {prioritized = KEYS[1], state = KEYS[2], flows = KEYS[3], fweights = KEYS[4],
  jobs = KEYS[5]}
local rebase = redis.call('HMGET', KEYS[2], 'rbDelta', 'rbCursor')
local delta, cursor = tonumber(rebase[1]), tonumber(rebase[2])
if not delta then
  local clock = fqClock(K)
  delta = math.floor(clock.vt - clock.base) - margin
  if clock.vt - clock.base < threshold or delta < 1 then return {1, 0, 1} end
  cursor = fqFloor * fqScore - 1
  redis.call('HSET', KEYS[2], 'rbDelta', delta, 'rbCursor', string.format('%.17g', cursor))
end
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%.17g', cursor),
  '(' .. string.format('%.17g', fqCap * fqScore), 'WITHSCORES', 'LIMIT', 0, page)
for i = 1, #rows, 2 do
  local score = tonumber(rows[i + 1])
  local moved = score - delta * fqSub * 4
  if moved < fqFloor * fqScore then moved = fqFloor * fqScore + score % 4 end
  redis.call('ZADD', KEYS[1], string.format('%.17g', moved), rows[i])
  cursor = score
end
if #rows / 2 < page then
  local base = tonumber(redis.call('HGET', KEYS[2], 'base')) or 0
  redis.call('HSET', KEYS[2], 'base', string.format('%.17g', base + delta))
  redis.call('HDEL', KEYS[2], 'rbDelta', 'rbCursor')
  return {1, #rows / 2, 1}
end
redis.call('HSET', KEYS[2], 'rbCursor', string.format('%.17g', cursor))
return {1, #rows / 2, 0}
