-- The waiting jobs at pop positions first..last (0-based, inclusive), read
-- atomically: the wait list first (popped from its right end), then the prioritized set.
-- KEYS[1]: the wait list; KEYS[2]: the prioritized set.
-- Returns {wait list length, flat (id, score) pairs, score '0' for wait-list jobs}.
--- @argv first last
local waitLen = redis.call('LLEN', KEYS[1])
local first, last = tonumber(ARGV.first), tonumber(ARGV.last)
local out = {}
if first < waitLen then
  local stop = math.min(last, waitLen - 1)
  local ids = redis.call('LRANGE', KEYS[1], waitLen - 1 - stop, waitLen - 1 - first)
  for i = #ids, 1, -1 do
    out[#out + 1] = ids[i]
    out[#out + 1] = '0'
  end
end
if last >= waitLen then
  local entries = redis.call('ZRANGE', KEYS[2], math.max(first - waitLen, 0), last - waitLen,
    'WITHSCORES')
  for i = 1, #entries do out[#out + 1] = entries[i] end
end
return {waitLen, out}
