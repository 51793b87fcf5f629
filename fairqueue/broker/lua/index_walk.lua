--[[
  Walk one page of fairqueue's ready-time index, oldest first, from a cursor: count the
  jobs still waiting, per level, and drop the entries of jobs that left (taken by a
  worker, finished, removed; a job in the wait list is dropped too and re-indexed from
  its payload when the pass adopts it). Stock workers never tell fairqueue that a job
  left, so this is how the index is trimmed. No payload is read; every entry costs O(1).

  KEYS[1] ready (zset id -> ready ms)  KEYS[2] jobs (hash id -> meta)
  KEYS[3] BullMQ's prioritized         KEYS[4] BullMQ's delayed
  KEYS[5] the leader lock
  ARGV    token, lock ttl ms, cursor score ('' = from the start), entries already
          seen at that score, page size, wait bound ms (the walk stops at now - bound;
          '' = walk to the end), dry run (1/0)
  Returns {status (1 ok, -1 lock lost), next cursor score, seen at it, done (1/0),
  removed, flat [level, waiting, oldest ready ms]... (one 'waiting' row when walking to
  the end: a sweep does not read levels), entries left before the walk's
  end (not yet checked: an estimate of what is left, 0 when done)}.
]]
--- @include lock_fence
local token, ttl = ARGV[1], ARGV[2]
local dry = ARGV[7] == '1'
if not dry and not fqHoldLock(KEYS[5], token, ttl) then return {-1, '', 0, 1, 0, {}, 0} end
local cursor, seen, page = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local upper = '+inf'
if ARGV[6] ~= '' then
  local t = redis.call('TIME')
  upper = string.format('%.17g', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    - tonumber(ARGV[6]) - 1)
end
local rows
if cursor == '' then
  rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', upper, 'WITHSCORES', 'LIMIT', 0, page)
else
  rows = redis.call('ZRANGEBYSCORE', KEYS[1], cursor, upper, 'WITHSCORES', 'LIMIT', seen, page)
end
local stats, removed = {}, 0
for i = 1, #rows, 2 do
  local id, score = rows[i], rows[i + 1]
  if score ~= cursor then cursor, seen = score, 0 end
  if redis.call('ZSCORE', KEYS[3], id) then
    local level = 'waiting' -- a sweep (no bound) does not count by level
    if ARGV[6] ~= '' then
      local meta = redis.call('HGET', KEYS[2], id)
      level = meta and string.match(meta, '^[^\n]*') or '?'
    end
    local s = stats[level]
    if not s then
      s = {0, score}
      stats[level] = s
    end
    s[1] = s[1] + 1
    seen = seen + 1
  elseif redis.call('ZSCORE', KEYS[4], id) then
    seen = seen + 1 -- delayed: BullMQ promotes it later
  elseif dry then
    seen = seen + 1
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    removed = removed + 1
  end
end
local flat = {}
for level, s in pairs(stats) do
  flat[#flat + 1] = level
  flat[#flat + 1] = s[1]
  flat[#flat + 1] = s[2]
end
local done = #rows / 2 < page
local left = 0
if not done then left = redis.call('ZCOUNT', KEYS[1], cursor, upper) - seen end
return {1, cursor, seen, done and 1 or 0, removed, flat, left}
