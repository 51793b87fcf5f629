--[[
  The console's read of accounts' states in levels (wire.lua's fqAccountStatePack, kept
  as msgpack in fq:fweights, which a client that decodes replies cannot read): per
  member, its flows' tenant weights with work and its weight as text ({T, A}), or false
  when none is kept (no flow of it has work). Read-only; one HMGET.

  KEYS[1] fq:fweights
  ARGV    members: the accounts' members (fqAccountMember: '<level>\n\n<account>')
]]
--- @argv members...
--- @include wire
local members = {}
for i = 1, #ARGV.members do members[i] = ARGV.members[i] end
local found = redis.call('HMGET', KEYS[1], unpack(members))
local states = {}
for i = 1, #members do
  local st = fqAccountStateSplit(found[i])
  states[i] = st and {tostring(st.T), tostring(st.A)} or false
end
return states
