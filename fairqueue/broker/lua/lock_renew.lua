-- Renew a lock only if we still hold it.
-- KEYS[1]: the lock. ARGV[1]: our token; ARGV[2]: new TTL (ms).
-- Returns 1 if renewed, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
