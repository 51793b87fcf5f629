-- One page of the overdue scan: the prioritized-set jobs at ranks ARGV[1]..ARGV[2]
-- whose BullMQ timestamp is older than the cutoff.
-- KEYS[1]: the prioritized set.
-- ARGV[1], ARGV[2]: first and last rank; ARGV[3]: cutoff (ms); ARGV[4]: job key prefix.
-- Returns {jobs scanned, flat (id, timestamp) pairs of the overdue ones}.
local ids = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2])
local cutoff = tonumber(ARGV[3])
local out = {}
for i = 1, #ids do
  local ts = tonumber(redis.call('HGET', ARGV[4] .. ids[i], 'timestamp') or 'nil')
  if ts and ts < cutoff then
    out[#out + 1] = ids[i]
    out[#out + 1] = ts
  end
end
return {#ids, out}
