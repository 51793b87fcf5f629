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

-- An account's fields among a level's flows: '<level>\n\n<account>' (no flow member is
-- one: no tenant id is empty).
local function fqAccountMember(level, account)
  return level .. '\n\n' .. account
end

-- A flow of an account keeps, where a flow of none keeps its spacing ('s\n<member>': a
-- number as text), its account, its account split (the part its last job was placed
-- with) and its catch-up inside the account (horizon, densest split), so one field read
-- tells all of it. Packed as msgpack after a msgpack true (its first byte, 0xc3, never
-- starts a number): numbers go in and out exactly without a printf or a strtod, which
-- cost an add of an account's job much of its placement's extra. Only the scripts read
-- it. (Read too: the text form before it, '\n<account>\n<split>\n<horizon>\n<split>'.)
local fqPackMark = 195 -- 0xc3, msgpack's true
local function fqFlowAccountPack(account, part, innerHorizon, innerSplit)
  return cmsgpack.pack(true, account, part or false, innerHorizon or false, innerSplit or false)
end

-- The account, split, catch-up horizon and split of fqFlowAccountPack's string (nil: the
-- field is a spacing, or missing).
local function fqFlowAccountSplit(value)
  if type(value) ~= 'string' then return nil end
  local first = string.byte(value, 1)
  if first == fqPackMark then
    local _, account, part, h, d = cmsgpack.unpack(value)
    return account, part or nil, h or nil, d or nil
  end
  if first ~= 10 then return nil end
  local account, part, h, d = string.match(value, '^\n([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)$')
  return account, tonumber(part), tonumber(h), tonumber(d)
end

local function fqFlowAccount(value)
  return (fqFlowAccountSplit(value))
end

-- An account's state in a level (fqAccountMember's field): its flows' tenant weights
-- (T), its weight (A), its catch-up horizon, the level's split its last job was placed
-- with (spacing) and its density (none: its spacing), packed as fqFlowAccountPack packs:
-- every add of an account's job writes it, and a printf per number cost that add more
-- than the rest of its account's placement. The console reads it through
-- account_states.lua (a decoding client cannot read msgpack). (Read too: the text form
-- before it, '<T>\n<A>\n<horizon>\n<spacing>\n<density>'.)
local function fqAccountStatePack(st)
  return cmsgpack.pack(true, st.T, st.A, st.horizon or false, st.spacing or false,
    st.density or false)
end

-- fqAccountStatePack's table (nil: none, the account has no flow with work).
local function fqAccountStateSplit(value)
  if type(value) ~= 'string' then return nil end
  if string.byte(value, 1) == fqPackMark then
    local _, T, A, h, sp, d = cmsgpack.unpack(value)
    return {T = T or 0, A = A or 1, horizon = h or nil, spacing = sp or nil, density = d or nil}
  end
  local T, A, h, sp, d = string.match(value, '^([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)$')
  if not T then return nil end
  return {T = tonumber(T) or 0, A = tonumber(A) or 1, horizon = tonumber(h),
    spacing = tonumber(sp), density = tonumber(d)}
end

-- A job's account and its weight (its opts' fqAcct, a held meta's end): '<weight>\n<account>'.
local function fqAccountMeta(account, weight)
  return weight .. '\n' .. account
end

-- The account and its weight (a number) of fqAccountMeta's string; nil: none.
local function fqAccountMetaSplit(meta)
  if type(meta) ~= 'string' then return nil end
  local weight, account = string.match(meta, '^(%d+)\n(.+)$')
  if not weight then return nil end
  return account, tonumber(weight)
end

-- A held job's meta (L:meta): '<level>\n<weight>\n<cost>' (an empty cost: none given),
-- then '\n' and its fqAccountMeta for a job of an account.
local function fqHeldMeta(level, weight, cost, account)
  local meta = level .. '\n' .. weight .. '\n' .. (cost or '')
  if account then return meta .. '\n' .. account end
  return meta
end

-- A held job's level, weight, cost, account and account weight as fqHeldMeta wrote them.
local function fqHeldMetaSplit(meta)
  local level, weight, cost, rest = string.match(meta, '^([^\n]*)\n([^\n]*)\n([^\n]*)(.*)$')
  if rest and rest ~= '' then
    return level, weight, cost, fqAccountMetaSplit(string.sub(rest, 2))
  end
  return level, weight, cost
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
-- An empty account: none.
local fqJobFields = 9
local function fqReadJobs(args, first)
  local jobs = {}
  for b = first, #args, fqJobFields do
    local account = args[b + 7]
    jobs[#jobs + 1] = {packed = args[b], data = args[b + 1], opts = args[b + 2],
      level = args[b + 3], tenant = args[b + 4], weight = tonumber(args[b + 5]),
      cost = tonumber(args[b + 6]), account = account ~= '' and account or nil,
      accountWeight = tonumber(args[b + 8]) or 1}
  end
  return jobs
end
