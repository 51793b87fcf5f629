--[[
  Where the next page of the history starts, when the loop could not read it from its
  cursor (``fairqueue.broker.history``): the first call, or the cursor's own entry is no
  longer in BullMQ's events stream (trimmed: BullMQ caps it at about 10,000 entries).
  Fenced by the leader lock. The first call only sets the cursor at the stream's end:
  history starts now (the job hashes behind it may be long gone).

  KEYS[1] BullMQ's events stream  KEYS[2] fq:hist (hash: cursor, ord, since)  KEYS[3] the leader lock
  ARGV    token, lock ttl ms, the cursor the loop read (to check nothing moved it)
  Returns {-1} lock lost; {0} the cursor was set (first call) or moved by another call;
  {1, from, inclusive (1/0), ord, lost, first entry ms}: read from ``from`` (inclusive or
  not), ord counts the entries the stream had up to it; lost > 0: entries after the
  cursor were trimmed unread (Redis >= 7 counts them; 1 where it cannot tell).
]]
--- @argv token ttl cursor
--- @include lock_fence
if not fqHoldLock(KEYS[3], ARGV.token, ARGV.ttl) then return {-1} end
local state = redis.call('HMGET', KEYS[2], 'cursor', 'ord')
local cursor, ord = state[1], tonumber(state[2])
if (cursor or '') ~= ARGV.cursor then return {0} end
local info = {}
if redis.call('EXISTS', KEYS[1]) == 1 then
  local raw = redis.call('XINFO', 'STREAM', KEYS[1])
  for i = 1, #raw, 2 do
    local name, value = raw[i], raw[i + 1]
    if name == 'entries-added' then info.added = tonumber(value)
    elseif name == 'length' then info.length = tonumber(value)
    elseif name == 'first-entry' and type(value) == 'table' then info.first = value[1]
    elseif name == 'last-entry' and type(value) == 'table' then info.last = value[1] end
  end
end
if not cursor then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[2], 'cursor', info.last or '0-0', 'ord', info.added or 0,
    'since', tonumber(t[1]) * 1000)
  return {0}
end
-- Stream ids compare as (ms, seq).
local function idAfter(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
if info.first and idAfter(info.first, cursor) then
  -- Every entry left is after the cursor: were any trimmed before this read?
  local lost = 1
  if info.added and ord then
    lost = info.added - info.length - ord
    if lost < 0 then lost = 0 end -- the stream was deleted and made anew
  end
  if info.added then ord = info.added - info.length end
  return {1, info.first, 1, ord or 0, lost, tonumber(string.match(info.first, '^(%d+)'))}
end
return {1, cursor, 0, ord or 0, 0, 0}
