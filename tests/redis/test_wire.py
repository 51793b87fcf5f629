"""The wire shapes: the Python half (``fairqueue.scheduling.wire``) and the Lua half
(``lua/include/wire.lua``) build the same strings and read each other's, run on the same
values in a real Redis; and each include comes into a script once."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairqueue.broker import scripts
from fairqueue.scheduling import wire
from fairqueue.scheduling.limits import TenantLimits

levels = st.sampled_from(["critical", "high", "normal", "low"])
tenants = st.text(st.characters(blacklist_characters="\n", blacklist_categories=["Cs"]))
weights = st.integers(1, 1000)
limit = st.one_of(st.none(), st.integers(1, 1_000_000))

LUA = (
    scripts.load_lua("include/wire")
    + """
local kind = ARGV[1]
if kind == 'flow' then
  local level, tenant = fqFlowSplit(ARGV[4])
  return {fqFlowMember(ARGV[2], ARGV[3]), level, tenant, fqFlowPrefix(ARGV[2])}
elseif kind == 'held' then
  local level, weight, cost, account, accountWeight = fqHeldMetaSplit(ARGV[4])
  local given = ARGV[5] ~= '' and fqAccountMeta(ARGV[5], tonumber(ARGV[6])) or nil
  return {fqHeldMeta(ARGV[2], tonumber(ARGV[3]), nil, given), level, weight, cost,
    account or '', tostring(accountWeight)}
elseif kind == 'account' then
  local account, weight = fqAccountMetaSplit(ARGV[4])
  return {fqAccountMeta(ARGV[2], tonumber(ARGV[3])), account, tostring(weight),
    fqAccountMember(ARGV[5], ARGV[2])}
elseif kind == 'state' then
  local st = {T = tonumber(ARGV[2]), A = tonumber(ARGV[3]), horizon = tonumber(ARGV[4]),
    spacing = tonumber(ARGV[5])}
  local packed = fqAccountStatePack(st)
  redis.call('HSET', KEYS[1], ARGV[6], packed)
  local back = fqAccountStateSplit(packed)
  return {tostring(back.T == st.T), tostring(back.A == st.A),
    tostring(back.horizon == st.horizon), tostring(back.spacing == st.spacing),
    tostring(back.density)}
elseif kind == 'delayed' then
  local level, weight, tenant = fqDelayedMetaSplit(ARGV[5])
  return {fqDelayedMeta(ARGV[2], tonumber(ARGV[3]), ARGV[4]), level, weight, tenant}
elseif kind == 'limits' then
  local l = fqSplitLimits(ARGV[2])
  return {tostring(l.maxActive), tostring(l.rateMax), tostring(l.rateMs), tostring(l.maxWaiting)}
elseif kind == 'jobs' then
  local job = fqReadJobs({'x', 'p', 'd', 'o', 'high', 't', '3', '12', 'acme', '2'}, 2)[1]
  local bare = fqReadJobs({'p', 'd', 'o', 'high', 't', '3', '', '', ''}, 1)[1]
  return {job.packed, job.data, job.opts, job.level, job.tenant, job.weight, job.cost,
    job.account, job.accountWeight, tostring(bare.account), tostring(bare.cost)}
end
"""
)

FAST = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FAST
@given(level=levels, tenant=tenants)
def test_a_flow_member_is_built_and_split_alike(redis_client, level, tenant):
    member = wire.flow_member(level, tenant)
    built, lua_level, lua_tenant, prefix = redis_client.eval(LUA, 0, "flow", level, tenant, member)
    assert built == member
    assert (lua_level, lua_tenant) == wire.split_flow_member(member) == (level, tenant)
    assert prefix == wire.flow_prefix(level) and member.startswith(prefix)


def test_a_string_without_a_separator_is_no_flow_member():
    assert wire.split_flow_member("normal") is None


@FAST
@given(level=levels, weight=weights, account=st.none() | tenants.filter(bool), aw=weights)
def test_a_held_meta_is_built_and_split_alike(redis_client, level, weight, account, aw):
    given_account = None if account is None else wire.account_meta(account, aw)
    meta = wire.held_meta(level, weight, account=given_account)
    built, lua_level, lua_weight, cost, lua_account, lua_aw = redis_client.eval(
        LUA, 0, "held", level, weight, meta, account or "", aw
    )
    assert built == meta
    pair = None if account is None else (account, aw)
    assert wire.split_held_meta(meta) == (lua_level, int(lua_weight), None, pair)
    assert wire.split_held_meta(meta) == (level, weight, None, pair)
    assert cost == ""
    assert (lua_account or None, lua_aw) == (account, "nil" if account is None else str(aw))
    assert wire.split_held_meta(wire.held_meta(level, weight, 12.5)) == (level, weight, 12.5, None)
    assert wire.split_held_meta(f"{level}\n{weight}\n\nnot-an-account") is None


@FAST
@given(level=levels, account=tenants.filter(bool), weight=weights)
def test_an_account_meta_and_member_are_built_and_split_alike(redis_client, level, account, weight):
    meta = wire.account_meta(account, weight)
    built, lua_account, lua_weight, member = redis_client.eval(
        LUA, 0, "account", account, weight, meta, level
    )
    assert built == meta
    assert wire.split_account_meta(meta) == (lua_account, int(lua_weight)) == (account, weight)
    assert member == wire.account_member(level, account)
    assert wire.split_flow_member(member) == (level, "\n" + account)  # no tenant id is one


@FAST
@given(mates=weights, weight=weights, horizon=st.none() | st.floats(0, 1e9), spacing=weights)
def test_an_account_state_is_read_as_the_scripts_pack_it(
    redis_client, fq_prefix, mates, weight, horizon, spacing
):
    """Packed as msgpack and read back exactly by the scripts, and by the console through
    account_states.lua (its tenant weights and weight as text; none for a missing one)."""
    from fairqueue.broker.scripts import plain_script

    key, member = f"{fq_prefix}:fweights", "normal\n\na"
    given = "" if horizon is None else repr(horizon)
    back = redis_client.eval(LUA, 1, key, "state", mates, weight, given, spacing, member)
    assert back == ["true", "true", "true", "true", "nil"]
    script = plain_script("account_states")
    read = redis_client.eval(
        script.source, 1, key, *script.args(members=[member, "normal\n\nnone"])
    )
    assert [float(x) for x in read[0]] == [mates, weight] and read[1] is None
    redis_client.delete(key)


@FAST
@given(level=levels, weight=weights, tenant=tenants)
def test_a_delayed_meta_is_built_and_split_alike(redis_client, level, weight, tenant):
    meta = wire.delayed_meta(level, weight, tenant)
    built, lua_level, lua_weight, lua_tenant = redis_client.eval(
        LUA, 0, "delayed", level, weight, tenant, meta
    )
    assert built == meta
    assert wire.split_delayed_meta(meta) == (lua_level, int(lua_weight), lua_tenant)
    assert wire.split_delayed_meta(meta) == (level, weight, tenant)


@FAST
@given(max_active=limit, rate_max=limit, rate_ms=limit, max_waiting=limit, paused=st.booleans())
def test_limits_are_encoded_and_read_alike(
    redis_client, max_active, rate_max, rate_ms, max_waiting, paused
):
    limits = TenantLimits(max_active, rate_max, rate_ms, max_waiting, paused=paused)
    encoded = wire.encoded_limits(limits)
    assert wire.decoded_limits(encoded, paused=paused) == limits
    read = redis_client.eval(LUA, 0, "limits", encoded)
    as_lua = [
        "nil" if value is None else str(value)
        for value in (max_active, rate_max, rate_ms, max_waiting)
    ]
    assert read == as_lua
    assert wire.add_encoded_limits(limits) == encoded + ("\np" if paused else "")
    assert wire.decoded_limits(None) == wire.decoded_limits("") == TenantLimits()


def test_an_add_job_is_read_by_its_field_names(redis_client):
    read = redis_client.eval(LUA, 0, "jobs")
    assert dict(zip(wire.ADD_JOB_FIELDS, read[:-2], strict=True)) == {
        "packed": "p", "data": "d", "opts": "o", "level": "high", "tenant": "t", "weight": 3,
        "cost": 12, "account": "acme", "account_weight": 2,
    }  # fmt: skip
    assert read[-2:] == ["nil", "nil"]  # an empty account and cost: none


def test_an_include_pulled_in_twice_comes_in_once():
    add_script = scripts.load_lua("wrap/add_jobs.head")  # fair_clock and tenant_limits
    assert add_script.count("local function fqFlowMember(") == 1
    assert add_script.count("local function fqSplitLimits(") == 1
