-- Release a lock only if we still hold it.
-- KEYS[1]: the lock. ARGV: our token. Returns 1 if released, else 0.
--- @argv token
if redis.call('GET', KEYS[1]) == ARGV.token then return redis.call('DEL', KEYS[1]) end
return 0
