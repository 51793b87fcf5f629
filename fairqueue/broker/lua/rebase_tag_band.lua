-- Shift every tag-band job (and the per-level tags) down, order unchanged.
-- KEYS[1]: the prioritized set; KEYS[2]: fairqueue's per-level tag hash.
-- ARGV[1]: tag band floor; ARGV[2]: shift; ARGV[3]: highest priority to shift;
-- ARGV[4]: job key prefix.
-- Returns how many jobs were shifted.
local floor = tonumber(ARGV[1])
local shift = tonumber(ARGV[2])
local entries = redis.call('ZRANGEBYSCORE', KEYS[1], floor * 4294967296,
  tonumber(ARGV[3]) * 4294967296, 'WITHSCORES')
for i = 1, #entries, 2 do
  local id = entries[i]
  local score = tonumber(entries[i + 1])
  local prio = math.floor(score / 4294967296)
  local newPrio = prio - shift
  redis.call('ZADD', KEYS[1], score - shift * 4294967296, id)
  redis.call('HSET', ARGV[4] .. id, 'priority', newPrio)
end
local tags = redis.call('HGETALL', KEYS[2])
for i = 1, #tags, 2 do
  local v = tonumber(tags[i + 1]) - shift
  if v < floor then v = floor end
  redis.call('HSET', KEYS[2], tags[i], v)
end
return #entries / 2
