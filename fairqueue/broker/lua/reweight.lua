--[[
  A tenant's weight changed (its TenantPlan saved): each of its flows with work counts
  the new weight at once, and its level's total with it, so the flow's next placements
  and every other flow's of the level share the level by the new weights (a flow's step
  is the level's total over its own weight: fair_clock.lua). The tenant's jobs already
  waiting keep their places: they run at the spacing they were placed with, and the
  flow's jobs placed from now on follow them at the new one. A flow with no work has no
  counted weight: its next job is placed with the weight it is enqueued with.
  Work: one HMGET and at most four writes of each hash (one flow per level).

  KEYS[1] state  KEYS[2] fweights
  ARGV    tenant, weight (a whole number, 1 or more)
  Returns the number of flows whose counted weight changed.
]]
--- @argv tenant weight
--- @include wire
local tenant, weight = ARGV.tenant, tonumber(ARGV.weight)
local levels = {'critical', 'high', 'normal', 'low'}
local members = {}
for i, level in ipairs(levels) do members[i] = fqFlowMember(level, tenant) end
local asked = {}
for i, member in ipairs(members) do asked[2 * i - 1], asked[2 * i] = member, 's\n' .. member end
local counted = redis.call('HMGET', KEYS[2], unpack(asked))
local changed, weights, totals = 0, {}, {}
for i, level in ipairs(levels) do
  local was, account = tonumber(counted[2 * i - 1]), fqFlowAccount(counted[2 * i])
  if was and was ~= weight then
    weights[#weights + 1] = members[i]
    weights[#weights + 1] = weight
    if account then
      -- a flow of an account: its account's split changes, its level counts the account
      local g = fqAccountMember(level, account)
      local st = fqAccountStateSplit(redis.call('HGET', KEYS[2], g))
      if st then
        st.T = st.T + weight - was
        redis.call('HSET', KEYS[2], g, fqAccountStatePack(st))
      end
    else
      local total = (tonumber(redis.call('HGET', KEYS[1], 'W:' .. level)) or was) - was + weight
      totals[#totals + 1] = 'W:' .. level
      totals[#totals + 1] = total
    end
    changed = changed + 1
  end
end
if changed > 0 then
  redis.call('HSET', KEYS[2], unpack(weights))
  if #totals > 0 then redis.call('HSET', KEYS[1], unpack(totals)) end
end
return changed
