--[[
  Walk one page of fairqueue's ready-time index, oldest second first, from a cursor:
  count the jobs still waiting, per level (read from the score's low bits), and drop the
  ids of jobs that left (taken by a worker, finished, removed; a job found in BullMQ's
  wait list too: the pass adopts it from its payload). Stock workers never tell
  fairqueue that a job left, so this is how the index is trimmed. No payload is read;
  every id costs O(1) (ids that left ahead of any that stays are cut off the front of
  their second's list at once; the rest are blanked, and the list compacted once when
  the walk leaves it, if it holds at most COMPACT_MAX entries).

  KEYS[1] ready (zset of seconds; KEYS[1]:<second> lists the ids ready in it)
  KEYS[2] BullMQ's prioritized  KEYS[3] BullMQ's delayed  KEYS[4] the leader lock
  ARGV    token, lock ttl ms, cursor second ('' = from the oldest), index in it, page
          size, wait bound ms (the walk stops at the last second wholly past the bound;
          '' = walk to the end), dry run (1/0)
  Returns {status (1 ok, -1 lock lost), next cursor second, index, done (1/0), removed,
  flat [level, waiting]... (one 'waiting' row when walking to the end: a sweep does not
  read levels), ids left before the walk's end, unchecked (0 when done;
  counted over at most 1,000 seconds)}.
]]
--- @argv token ttl second index page bound dry
--- @include lock_fence
local token, ttl = ARGV.token, ARGV.ttl
local dry = ARGV.dry == '1'
if not dry and not fqHoldLock(KEYS[4], token, ttl) then return {-1, '', 0, 1, 0, {}, 0} end
local second, index, budget = ARGV.second, tonumber(ARGV.index), tonumber(ARGV.page)
local counting = ARGV.bound ~= ''
local upper = '+inf'
if counting then
  local t = redis.call('TIME')
  local cutoff = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV.bound)
  upper = string.format('%d', math.floor(cutoff / 1000) - 1)
end
local floorScore, capScore = 1024 * 4294967296, 2097151 * 4294967296
local levels = {[0] = 'critical', [1] = 'high', [2] = 'normal', [3] = 'low'}
local stats, removed, done = {}, 0, false

local function nextSecond(after)
  local min = '-inf'
  if after ~= '' then min = '(' .. after end
  local found = redis.call('ZRANGEBYSCORE', KEYS[1], min, upper, 'LIMIT', 0, 1)
  return found[1]
end

if second == '' or index < 0 then
  second, index = nextSecond(second), 0
  if not second then done = true end
end
-- Trimming a second's list: ids that left before any that stays (jobs mostly leave in
-- the order they came) are cut off its front with one LTRIM; the others are blanked
-- (LSET) and compacted when the walk leaves the second; a second read whole with no id
-- left is deleted. No write per id in the usual case.
local fromStart, kept, front, gone = index == 0, 0, 0, {}
local function trim(key)
  for _, at in ipairs(gone) do redis.call('LSET', key, at, '') end
  if front > 0 then
    redis.call('LTRIM', key, front, -1)
    index = index - front
  end
  gone, front = {}, 0
end
while not done and budget > 0 do
  local key = KEYS[1] .. ':' .. second
  local ids = redis.call('LRANGE', key, index, index + budget - 1)
  for i, id in ipairs(ids) do
    local score = id ~= '' and tonumber(redis.call('ZSCORE', KEYS[2], id))
    local left = false
    if id == '' then
      left = true -- dropped earlier in this second's list
    elseif score then
      kept = kept + 1
      local level = 'waiting'
      if counting then
        level = '?'
        if score >= floorScore and score < capScore then level = levels[score % 4] end
      end
      stats[level] = (stats[level] or 0) + 1
    elseif dry or redis.call('ZSCORE', KEYS[3], id) then
      kept = kept + 1
    else
      left = true
      removed = removed + 1
    end
    if left and fromStart and kept == 0 then
      front = front + 1
    elseif left and id ~= '' then
      gone[#gone + 1] = index + i - 1
    end
  end
  budget = budget - #ids
  index = index + #ids
  if budget > 0 then -- the end of this second's list: compact it, go on to the next
    if not dry then
      if fromStart and kept == 0 then
        redis.call('DEL', key)
        redis.call('ZREM', KEYS[1], second)
      else
        trim(key)
        -- compacted only while short: LREM of many blanks in a long list moves memory
        -- for each (tens of ms at 20,000 entries); a long list's blanks cost the walk a
        -- skip each and go with its front (LTRIM) or with the list
        if redis.call('LLEN', key) <= {{COMPACT_MAX}} then redis.call('LREM', key, 0, '') end
        if redis.call('LLEN', key) == 0 then
          redis.call('DEL', key)
          redis.call('ZREM', KEYS[1], second)
        end
      end
    end
    gone, front, fromStart, kept = {}, 0, true, 0
    second, index = nextSecond(second), 0
    if not second then done = true end
  elseif not dry then
    trim(key) -- the page ends inside this second: the next call goes on from index
  end
end

local flat = {}
for level, n in pairs(stats) do
  flat[#flat + 1] = level
  flat[#flat + 1] = n
end
local left = 0
if not done then
  left = redis.call('LLEN', KEYS[1] .. ':' .. second) - index
  local later = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. second, upper, 'LIMIT', 0, 1000)
  for _, s in ipairs(later) do left = left + redis.call('LLEN', KEYS[1] .. ':' .. s) end
end
return {1, second or '', index, done and 1 or 0, removed, flat, left}
