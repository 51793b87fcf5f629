-- How many of the first jobs in pop order wait outside fairqueue's tag order, from the
-- scores alone (no job is read): the dashboard's "unplaced" count, O(log n) at any
-- backlog. The wait list is popped first and is all unplaced; in the prioritized set a
-- placed job's score lies in [floor, cap) (fair_clock.lua), so the unplaced ones of its
-- first k entries are those below floor (they come first) and those at or past cap
-- (they come last).
-- KEYS[1]: the wait list; KEYS[2]: the prioritized set.
-- ARGV: the jobs compared (the head's length), floor and cap (scores, as integers).
-- Returns {jobs compared, of them unplaced}.
--- @argv window floor cap
local window = tonumber(ARGV.window)
local inList = math.min(redis.call('LLEN', KEYS[1]), window)
local k = math.min(window - inList, redis.call('ZCARD', KEYS[2]))
local unplaced = inList
if k > 0 then
  local below = redis.call('ZCOUNT', KEYS[2], '-inf', '(' .. ARGV.floor)
  local beforeCap = redis.call('ZCOUNT', KEYS[2], '-inf', '(' .. ARGV.cap)
  unplaced = unplaced + math.min(k, below) + math.max(0, k - beforeCap)
end
return {inList + k, unplaced}
