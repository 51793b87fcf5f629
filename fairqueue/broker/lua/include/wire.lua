-- The encoded shapes fairqueue's Python and its scripts share, in one place (their Python
-- half is fairqueue/scheduling/wire.py; tests/unit/test_wire.py holds the two together).
-- A line feed separates the parts: tenant ids may not hold one (validate_tenant_id).

-- A flow, (level, tenant), as a hash field or a set member: '<level>\n<tenant>'.
local function fqFlowMember(level, tenant)
  return level .. '\n' .. tenant
end

-- What every flow member of `level` starts with (a scan's match prefix).
local function fqFlowPrefix(level)
  return level .. '\n'
end

-- A flow member's level and tenant (nil, nil: not a flow member).
local function fqFlowSplit(member)
  return string.match(member, '^([^\n]*)\n(.*)$')
end

-- A held job's meta (L:meta): '<level>\n<weight>\n<cost>' (an empty cost: none given).
local function fqHeldMeta(level, weight, cost)
  return level .. '\n' .. weight .. '\n' .. (cost or '')
end

-- A held job's level, weight and cost as fqHeldMeta wrote them.
local function fqHeldMetaSplit(meta)
  return string.match(meta, '^([^\n]*)\n([^\n]*)\n([^\n]*)$')
end

-- A delayed job's meta (its opts' fqMeta, read when the pass places it once BullMQ
-- promotes it): '<level>\n<weight>\n<tenant>'.
local function fqDelayedMeta(level, weight, tenant)
  return level .. '\n' .. weight .. '\n' .. tenant
end

-- A delayed job's level, weight and tenant as fqDelayedMeta wrote them.
local function fqDelayedMetaSplit(meta)
  return string.match(meta, '^([^\n]*)\n([^\n]*)\n(.*)$')
end

-- A tenant's limits (the limits hash's values; an add's per-tenant ones) as numbers:
-- 'max_active\nrate_max\nrate_ms\nmax_waiting', an empty field for no limit (nil here).
local function fqSplitLimits(encoded)
  local f, i = {}, 1
  for part in string.gmatch((encoded or '') .. '\n', '([^\n]*)\n') do
    f[i] = tonumber(part)
    i = i + 1
  end
  return {maxActive = f[1], rateMax = f[2], rateMs = f[3], maxWaiting = f[4]}
end

-- An add's per-job arguments, args[first] to the end, fqJobFields of them per job in
-- this order, read into one named table per job (the packer's order:
-- fairqueue.scheduling.wire.ADD_JOB_FIELDS).
local fqJobFields = 7
local function fqReadJobs(args, first)
  local jobs = {}
  for b = first, #args, fqJobFields do
    jobs[#jobs + 1] = {packed = args[b], data = args[b + 1], opts = args[b + 2],
      level = args[b + 3], tenant = args[b + 4], weight = tonumber(args[b + 5]),
      cost = tonumber(args[b + 6])}
  end
  return jobs
end
