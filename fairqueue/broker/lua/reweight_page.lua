--[[
  A tenant's weight changed: its jobs already waiting are placed again at the new weight
  (docs/design.md, "A weight change"), a page of the prioritized set per call. For each
  of its flows with work that counted another weight, a job's tag t becomes
  anchor + (t - anchor) * old / new, the anchor being the virtual time when the change
  came: its distance from now shrinks (a raised weight) or grows by the ratio, each job
  keeping its cost, the flow its order, every other job its place. The flow's last tag
  moves the same way, so its next jobs follow at the new spacing.

  KEYS[1] BullMQ's prioritized  KEYS[2] state  KEYS[3] flows  KEYS[4] fweights
  KEYS[5] fq:rw (hash: flow -> the re-placement in progress:
          "anchor\nratio\nend tag\nlevel\ncursor score\nvisited at it\nbase", and for a
          cold flow's first measurement (history_commit.lua) "\nshift\npaid": its jobs
          move to anchor + shift + (t - anchor) * ratio, their fqPaid times the ratio;
          a settlement: ratio 1 and the shift; none moved behind the anchor)
  ARGV    mode, who, amount, prefix (named: the two modes share the positions)
  'begin' (before reweight.lua counts the new weight): who the tenant, amount its weight.
          Records a re-placement of each of its flows with work whose counted weight
          differs. Returns the flows begun, or {'busy', flow} when one is still in
          progress (finish it first: nothing was recorded).
  'page': who the flow, amount the page size, prefix the job key prefix. Visits up to a page
          of the waiting jobs in the flow's range (from the head to its last tag when
          the change came): with a raised weight from the head up (a moved job goes down,
          behind the cursor), with a lowered one from the end down (a moved job goes up,
          behind the cursor), so no job is moved twice. A job is the flow's by its
          score's level and its payload's tenantId. Returns {visited, moved, done}.
  A raised flow keeps its last tag until its range is done (its jobs added meanwhile
  go behind the range, not into it; then its last tag moves as the range's end did); a
  lowered one moves it at 'begin'.
  Only 'begin' reads the virtual time from the head (the anchor); a page never moves it.
]]
--- @argv mode who amount prefix?
--- @include fair_clock
local K = {prioritized = KEYS[1], state = KEYS[2], flows = KEYS[3], fweights = KEYS[4]}
local mode = ARGV.mode
local function tagString(x) return string.format('%.17g', x) end

if mode == 'begin' then
  local tenant, weight = ARGV.who, tonumber(ARGV.amount)
  local c = fqClock(K)
  local begun = {}
  for _, level in ipairs({'critical', 'high', 'normal', 'low'}) do
    local member = fqFlowMember(level, tenant)
    local counted = tonumber(redis.call('HGET', K.fweights, member))
    local last = tonumber(redis.call('ZSCORE', K.flows, member))
    if counted and counted ~= weight and last and last > c.vt then
      if redis.call('HEXISTS', KEYS[5], member) == 1 then return {'busy', member} end
      begun[#begun + 1] = {member, level, counted / weight, last}
    end
  end
  local out = {}
  for _, b in ipairs(begun) do
    local member, level, ratio, last = b[1], b[2], b[3], b[4]
    redis.call('HSET', KEYS[5], member, table.concat({tagString(c.vt), tagString(ratio),
      tagString(last), level, '', '', tagString(c.base)}, '\n'))
    if ratio > 1 then
      redis.call('ZADD', K.flows, tagString(c.vt + (last - c.vt) * ratio), member)
    end
    out[#out + 1] = member
  end
  return out
end

-- mode 'page'
local member, prefix, page = ARGV.who, ARGV.prefix, tonumber(ARGV.amount)
local spec = redis.call('HGET', KEYS[5], member)
if not spec then return {0, 0, 1} end
local f = {}
for part in string.gmatch(spec .. '\n', '([^\n]*)\n') do f[#f + 1] = part end
local anchor, ratio, last, level = tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), f[4]
local cursorScore, tie, base = tonumber(f[5]), tonumber(f[6]) or 0, tonumber(f[7])
-- A cold flow's first measurement (history_commit.lua): a shift (tags) too, and each moved
-- job's fqPaid (what it paid cold) scaled by the ratio, so its run is charged against what
-- it pays now.
local shift, repay = tonumber(f[8]) or 0, f[9] == 'paid'
-- The score mapping only: a page never moves the virtual time. Part-way through, the
-- set's head can be a job already moved ahead of one of the tenant's not moved yet, so
-- what it stands for is no virtual time (docs/design.md, "A weight change").
local st = redis.call('HMGET', K.state, 'base', 'rbDelta', 'rbCursor')
local c = {base = tonumber(st[1]) or 0, delta = tonumber(st[2]), cursor = tonumber(st[3])}
if c.cursor then return {0, 0, 0} end -- a rebase in progress: the next call
if cursorScore and base ~= c.base then
  cursorScore = cursorScore - (c.base - base) * fqSub * 4 -- a rebase ran since
end
local tenant = string.sub(member, #level + 2)
local rank = fqLevelRank[level]
local needle = cjson.encode(tenant)
local bandLow = fqFloor * fqScore
local bandEnd = fqScoreOf(c, last, level) or (fqCap * fqScore - 1)
-- A history move (f[8]: a recost or a settlement) goes from the head up whichever way its
-- jobs move, so the jobs about to run move first: a job moved up (later) is marked
-- (fqMv), so that the pages do not move it again when they meet it.
local marker = f[8] and (f[1] .. ':' .. f[3])
local up = ratio < 1 or marker ~= nil
local from = cursorScore and string.format('%d', cursorScore)
local rows
-- From the cursor's score on, past the members of it already visited (ties sort by
-- member; a moved job leaves its score's group, so it no longer counts there).
if up then
  rows = redis.call('ZRANGEBYSCORE', K.prioritized, from or string.format('%d', bandLow),
    string.format('%d', bandEnd), 'WITHSCORES', 'LIMIT', tie, page)
else
  rows = redis.call('ZREVRANGEBYSCORE', K.prioritized, from or string.format('%d', bandEnd),
    string.format('%d', bandLow), 'WITHSCORES', 'LIMIT', tie, page)
end
local moved = 0
for i = 1, #rows, 2 do
  local id, score = rows[i], tonumber(rows[i + 1])
  if score == cursorScore then tie = tie + 1 else cursorScore, tie = score, 1 end
  if score % 4 == rank then
    local row = redis.call('HMGET', prefix .. id, 'data', 'fqPaid', 'fqMv')
    local data, mine = row[1], false
    if data and (tenant == 'default' or string.find(data, needle, 1, true)) then
      local ok, decoded = pcall(cjson.decode, data)
      if ok and type(decoded) == 'table' then
        local t = decoded['tenantId']
        mine = (type(t) == 'string' and t ~= '' and t or 'default') == tenant
      end
    end
    local tag = c.base + math.floor((score - bandLow) / 4) / fqSub
    if mine and tag > anchor and not (marker and row[3] == marker) then
      -- a refund (a settlement) moves a job at most to the anchor, never behind it
      local placed = fqScoreOf(c, fqReplaced(tag, anchor, ratio, shift), level)
      if placed and placed ~= score then
        redis.call('ZADD', K.prioritized, 'XX', string.format('%d', placed), id)
        moved = moved + 1
        tie = tie - 1
        if marker and placed > score then redis.call('HSET', prefix .. id, 'fqMv', marker) end
      end
      if placed and repay and tonumber(row[2]) then -- its cost placed again, moved or not
        redis.call('HSET', prefix .. id, 'fqPaid', string.format('%.6g', tonumber(row[2]) * ratio))
      end
    end
  end
end
local visited = #rows / 2
if visited < page then
  local ended = fqReplaced(last, anchor, ratio, shift)
  local now = tonumber(redis.call('ZSCORE', K.flows, member))
  if up and now == last then
    redis.call('ZADD', K.flows, tagString(ended), member)
  elseif up and now and now > last and ended < last then
    -- jobs placed meanwhile went behind the range, at the old last tag: the flow's next
    -- ones come the range's move earlier, so the jobs it moved up are not paid back by a
    -- gap as long as the move (only by a hole as long as the jobs placed meanwhile)
    redis.call('ZADD', K.flows, tagString(math.max(anchor, now - (last - ended))), member)
  end
  redis.call('HDEL', KEYS[5], member)
  return {visited, moved, 1}
end
f[5], f[6], f[7] = string.format('%d', cursorScore), tostring(tie), tagString(c.base)
redis.call('HSET', KEYS[5], member, table.concat(f, '\n'))
return {visited, moved, 0}
