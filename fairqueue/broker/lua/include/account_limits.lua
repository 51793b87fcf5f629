--[[
  Account limits, included by tenant_limits.lua: max_active, rate and max_waiting over all
  the tenants of an account together, beside each tenant's own (both hold). A tenant of an
  account with limits has its jobs held like a limited tenant's (its add carries limits,
  maybe empty ones, so it is), and release_held gives it room only when both the tenant
  and its account have some (fairqueue.scheduling.limits.account_release).

  Keys, beside the tenant limits' (L is the queue's fq:lim key; <a> an account id):
    L:acc           hash: account -> its encoded limits (as a tenant's), written by an
                    add of one of its tenants and by the account's save
    L:tacct         hash: tenant -> its account, for a tenant whose account has limits
    L:aout:<a>      set: its tenants' released jobs not finished (every L:out:<t> of its
                    tenants together, kept beside them, and checked against BullMQ's own
                    sets when the account is visited)
    L:arate:<a>     zset: its tenants' releases, then starts, within its rate window
    L:abucket:<a>   hash: tokens, at: its rate's pacing bucket
    L:aheld:<a>     set: its tenants' held jobs (held and held until due): with the
                    released ones not taken yet, what its max_waiting counts
    L:await:<a>     zset: its tenants held by the account's max_active, by when: a slot of
                    the account freed makes the first of them due, and is theirs in this
                    order before any other tenant's (each leaves once served)

  Work per call: every step is O(log n) in these keys but the walks of L:aout:<a> (the
  visit of an account, fqAccountVisit, once per release call and account; and an add's
  max_waiting check, fqAccountWaiting): at most the account's running jobs and
  TAKEABLE_CAP untaken ones (max_active or fewer with one), whatever its tenants'
  backlogs. So with 1M jobs waiting over 10,000 tenants of one account, on 100 worker
  slots, a walk is at most 300 members (O(log n) each); the account's save is one HSET
  and one ZADD of its 10,000 tenants (limit_store.set_account_limits). An account
  without limits costs its tenants' adds nothing here (no key is read).
]]

-- A call's tenants' accounts (false: none with limits).
local fqAcctMemo = {}
local function fqAccountOf(L, t)
  local a = fqAcctMemo[t]
  if a == nil then
    a = redis.call('HGET', L .. ':tacct', t)
    fqAcctMemo[t] = a
  end
  return a
end

-- A job of tenant t was held (or held until due): counted as waiting for its account.
local function fqAccountHeld(L, t, id)
  local a = fqAccountOf(L, t)
  if a then redis.call('SADD', L .. ':aheld:' .. a, id) end
end

-- A released job of tenant t no longer occupies a slot (finished, runs again, pulled
-- back): out of its account's too, and the account's first tenant waiting for a slot
-- is made due.
local function fqAccountWake(L, a)
  local first = redis.call('ZRANGE', L .. ':await:' .. a, 0, 0)[1]
  if first then fqDue(L, first, 0) end
end

local function fqAccountLeaves(L, t, id)
  local a = fqAccountOf(L, t)
  if a and redis.call('SREM', L .. ':aout:' .. a, id) == 1 then fqAccountWake(L, a) end
end

-- How many of a released set's jobs no worker has taken yet: takeable, or waiting out a
-- backoff in BullMQ's delayed set (a tenant's :out: or an account's :aout:).
local function fqNotTaken(outKey, prioritizedKey, delayedKey)
  local n = 0
  for _, id in ipairs(redis.call('SMEMBERS', outKey)) do
    if redis.call('ZSCORE', prioritizedKey, id) or redis.call('ZSCORE', delayedKey, id) then
      n = n + 1
    end
  end
  return n
end

-- What an account's max_waiting counts: its tenants' held jobs, and their released ones
-- not taken yet.
local function fqAccountWaiting(L, prioritizedKey, delayedKey, a)
  return redis.call('SCARD', L .. ':aheld:' .. a)
    + fqNotTaken(L .. ':aout:' .. a, prioritizedKey, delayedKey)
end

-- How many of count jobs a limit set lim lets go (release_room's max_active and rate
-- parts, fairqueue.scheduling.limits), with the reason that keeps the rest: occupied,
-- takeable and old (untaken, released before the window) as fqOccupied counts them;
-- rateKey and bucketKey the rate log and pacing bucket. Returns count, reason, the
-- bucket's tokens (nil: no rate limit; its log and bucket are then dropped).
local function fqLimitRoom(lim, count, occupied, rateKey, bucketKey, takeable, old, now)
  local reason, tokens = nil, nil
  if lim.maxActive then
    local room = lim.maxActive - occupied
    if room < 0 then room = 0 end
    if room < count then count, reason = room, 'max_active' end
  end
  if lim.rateMax and lim.rateMs then
    -- the log holds each release until its job starts, then its start (fqStamp): a
    -- window counts the starts in it, the releases not started yet, and (old) the
    -- untaken jobs released before it, so no window holds more than rate_max starts
    redis.call('ZREMRANGEBYSCORE', rateKey, '-inf', now - lim.rateMs)
    local room = lim.rateMax - redis.call('ZCARD', rateKey) - old
    -- paced by a small bucket refilled at the rate (rate_burst), so starts spread over
    -- the window instead of coming in bursts of rate_max
    local burst = math.max(2, math.ceil(lim.rateMax / 10))
    local bucket = redis.call('HMGET', bucketKey, 'tokens', 'at')
    tokens = tonumber(bucket[1])
    if tokens then
      tokens = math.min(burst, tokens + (now - tonumber(bucket[2])) * lim.rateMax / lim.rateMs)
    else
      tokens = burst
    end
    if math.floor(tokens) < room then room = math.floor(tokens) end
    -- at most a burst of released jobs waits takeable (they would start in a bunch)
    if burst - takeable < room then room = burst - takeable end
    if room < 0 then room = 0 end
    if room < count then count, reason = room, 'rate' end
  else
    redis.call('DEL', rateKey, bucketKey)
  end
  return count, reason, tokens
end

-- When a rate-held set of limits may release again (ms from now): the next token, or
-- the oldest entry leaving the window, whichever is later.
local function fqRateWake(lim, tokens, rateKey, now)
  local at = math.ceil((1 - tokens) * lim.rateMs / lim.rateMax)
  local oldest = redis.call('ZRANGE', rateKey, 0, 0, 'WITHSCORES')
  if oldest[2] and redis.call('ZCARD', rateKey) >= lim.rateMax then
    local leaves = tonumber(oldest[2]) + lim.rateMs - now
    if leaves > at then at = leaves end
  end
  if at < 1 then at = 1 end
  return at
end

-- An account's state in a release call, made once per call (memo) and kept up to date
-- as its tenants' jobs are released: its limits, the slots its tenants occupy (released
-- jobs not finished, checked against BullMQ's sets: finished ones leave), how many no
-- worker took yet, and of those how many were released before its rate window. nil: the
-- account has no limits.
local function fqAccountVisit(L, memo, a, prefix, completedKey, failedKey, prioritizedKey, now)
  local st = memo[a]
  if st ~= nil then return st end
  local encoded = redis.call('HGET', L .. ':acc', a)
  if not encoded then
    memo[a] = false
    return false
  end
  local lim = fqSplitLimits(encoded)
  st = {lim = lim, occupied = 0, takeable = 0, old = 0, rateKey = L .. ':arate:' .. a,
    bucketKey = L .. ':abucket:' .. a}
  local since = lim.rateMax and lim.rateMs and now - lim.rateMs
  local outKey = L .. ':aout:' .. a
  for _, id in ipairs(redis.call('SMEMBERS', outKey)) do
    if redis.call('EXISTS', prefix .. id) == 0 or redis.call('ZSCORE', completedKey, id)
        or redis.call('ZSCORE', failedKey, id) then
      if since then fqStamp(st.rateKey, prefix .. id, id) end
      redis.call('SREM', outKey, id)
      fqAccountWake(L, a)
    else
      st.occupied = st.occupied + 1
      if redis.call('ZSCORE', prioritizedKey, id) then
        st.takeable = st.takeable + 1
        if since and (tonumber(redis.call('ZSCORE', st.rateKey, id)) or 0) <= since then
          st.old = st.old + 1
        end
      elseif since then
        fqStamp(st.rateKey, prefix .. id, id)
      end
    end
  end
  memo[a] = st
  return st
end
