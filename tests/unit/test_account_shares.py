"""Entitlements with accounts (``scheduling/pace.py``): a level's accounts share it by
account weight, an account's tenants share its part by tenant weight, max-min at each
step; tenants without an account are accounts of their own (the flat rule)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairqueue.scheduling.noisy import FlowWeight, noisy_accounts, noisy_tenants
from fairqueue.scheduling.pace import (
    AskingRead,
    FlowAsk,
    account_max_min,
    account_share_of,
    current_shares,
    flows_asking,
    share_of,
)
from fairqueue.scheduling.shares import max_min

LEVELS = ("critical", "high", "normal", "low")
WEIGHTS = {"critical": 4.0, "high": 3.0, "normal": 2.0, "low": 1.0}
ACCOUNT_WEIGHTS = {"X": 1.0, "Y": 2.0, "Z": 3.0}

asks = st.one_of(st.just(math.inf), st.floats(0, 50, allow_nan=False))
rows = st.lists(
    st.tuples(
        st.sampled_from(LEVELS),
        st.sampled_from("abcdefgh"),
        st.sampled_from([1, 2, 3]),
        asks,
        st.sampled_from([None, "X", "Y", "Z"]),
    ),
    max_size=16,
    unique_by=lambda row: (row[0], row[1]),
)


def _flows(found):
    return [
        FlowAsk(level, tenant, float(w), ask, account, ACCOUNT_WEIGHTS.get(account or "", 1.0))
        for level, tenant, w, ask, account in found
    ]


def _group(f: FlowAsk) -> tuple[str, str]:
    return ("account", f.account) if f.account is not None else ("tenant", f.tenant)


def _group_weight(f: FlowAsk) -> float:
    return f.weight if f.account is None else f.account_weight


@settings(max_examples=400, deadline=None)
@given(st.floats(0, 100, allow_nan=False), rows)
def test_shares_are_max_min_by_level_then_account_then_tenant(capacity, found):
    flows = _flows(found)
    got = current_shares(capacity, flows)
    for f in flows:
        assert -1e-9 <= got[(f.level, f.tenant)] <= f.asks + 1e-9
    assert sum(got.values()) == pytest.approx(min(capacity, sum(f.asks for f in flows)), abs=1e-6)
    for lv in LEVELS:
        mine = [f for f in flows if f.level == lv]
        groups: dict[tuple[str, str], list[FlowAsk]] = {}
        for f in mine:
            groups.setdefault(_group(f), []).append(f)
        got_g = {g: sum(got[(lv, f.tenant)] for f in fs) for g, fs in groups.items()}
        asked_g = {g: sum(f.asks for f in fs) for g, fs in groups.items()}
        weight_g = {g: _group_weight(fs[0]) for g, fs in groups.items()}
        for g in groups:
            # an account short of what it asks gets at least its weight's part beside
            # any account of its level that gets more per weight
            if got_g[g] < asked_g[g] - 1e-6:
                for h in groups:
                    assert got_g[g] / weight_g[g] >= got_g[h] / weight_g[h] - 1e-6
            # and inside the account, the same between its tenants by tenant weight
            for f in groups[g]:
                if got[(lv, f.tenant)] < f.asks - 1e-6:
                    for o in groups[g]:
                        assert (
                            got[(lv, f.tenant)] / f.weight >= got[(lv, o.tenant)] / o.weight - 1e-6
                        )


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 100, allow_nan=False), rows)
def test_without_accounts_the_flat_rule_and_a_lone_tenant_account_is_its_tenant(capacity, found):
    flat = [FlowAsk(f.level, f.tenant, f.weight, f.asks) for f in _flows(found)]
    got = current_shares(capacity, flat)
    asked = {lv: sum(f.asks for f in flat if f.level == lv) for lv in LEVELS}
    level_part = max_min(capacity, {lv: asked[lv] for lv in asked}, WEIGHTS)
    for lv in LEVELS:
        mine = [f for f in flat if f.level == lv]
        by_weight = max_min(
            level_part[lv], {f.tenant: f.asks for f in mine}, {f.tenant: f.weight for f in mine}
        )
        for tenant, rate in by_weight.items():
            assert got[(lv, tenant)] == pytest.approx(rate, abs=1e-9)
    # each tenant in an account of its own at its tenant weight: the same shares
    alone = [
        FlowAsk(f.level, f.tenant, f.weight, f.asks, "own-" + f.tenant, f.weight) for f in flat
    ]
    for key, rate in current_shares(capacity, alone).items():
        assert rate == pytest.approx(got[key], abs=1e-6)


def test_ten_tenants_of_one_account_beside_another_accounts_one():
    """The case the console showed at 33% and 66% of normal: the rule gives A half."""
    a = [FlowAsk("normal", f"a{i}", 1, math.inf, "A", 1) for i in range(10)]
    b = FlowAsk("normal", "b", 1, math.inf, "B", 1)
    got = current_shares(10.0, [*a, b])
    assert got[("normal", "b")] == pytest.approx(5.0)
    assert all(got[("normal", f.tenant)] == pytest.approx(0.5) for f in a)
    # two tenants of a weight-2 account beside a lone tenant: the account gets 2/3
    two = [FlowAsk("normal", t, 1, math.inf, "A", 2) for t in ("a1", "a2")]
    lone = FlowAsk("normal", "lone", 1, math.inf)
    got = current_shares(9.0, [*two, lone])
    assert got[("normal", "a1")] + got[("normal", "a2")] == pytest.approx(6.0)
    assert got[("normal", "lone")] == pytest.approx(3.0)
    # a quiet tenant of the account leaves its part to its account's other tenant first
    quiet = [FlowAsk("normal", "a1", 1, math.inf, "A", 2), FlowAsk("normal", "a2", 1, 1.0, "A", 2)]
    got = current_shares(9.0, [*quiet, lone])
    assert got[("normal", "a2")] == pytest.approx(1.0)
    assert got[("normal", "a1")] == pytest.approx(5.0)


def test_share_of_places_the_asking_tenant_in_its_account():
    a = [FlowAsk("normal", f"a{i}", 1, math.inf, "A", 1) for i in range(3)]
    b = FlowAsk("normal", "b", 1, math.inf)
    assert share_of(10.0, [*a, b], "normal", "b", of_level=True) == pytest.approx(0.5)
    # a new tenant of A splits A's half; the weight its flows count wins over the one given
    new = share_of(10.0, [*a, b], "normal", "new", of_level=True, account=("A", 5))
    assert new == pytest.approx(0.5 / 4)
    # as flows give it (its account counted by the clock), whatever is passed
    assert share_of(10.0, [*a, b], "normal", "a0", of_level=True, account=None) == pytest.approx(
        0.5 / 3
    )


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="account_weight=0"):
        current_shares(1, [FlowAsk("low", "a", 1, 1, "A", 0)])
    with pytest.raises(ValueError, match="account 'A' is given weight 1"):
        account_max_min(1, [FlowAsk("low", "a", 1, 1, "A", 1), FlowAsk("low", "b", 1, 1, "A", 2)])


def test_flows_asking_steps_an_account_flow_by_its_account_part():
    """Two flows of weight-1 account A (tenant weights 1) beside a lone tenant: the
    level counts 2; A's flows step twice as far as the lone flow per job (24 tags, not
    12), so the same tag distance is half the backlog."""
    read = AskingRead(
        totals={"normal": 2.0},
        ahead=(
            ("normal", "a1", 60.0, 1.0, False, None),
            ("normal", "a2", 30.0, 1.0, False, None),
            ("normal", "lone", 30.0, 1.0, False, None),
        ),
        accounts={("normal", "a1"): ("A", 1.0, 2.0), ("normal", "a2"): ("A", 1.0, 2.0)},
        served={("normal", "a2"): 60, ("normal", "quiet"): 6},
    )
    flows = {
        f.tenant: f
        for f in flows_asking(
            read,
            vt=0.0,
            window_s=60,
            level_served={"normal": 66},
            accounts={"quiet": ("Q", 3)},
        )
    }
    assert flows["a1"].account == "A" and flows["a1"].asks == math.inf
    # 1.25 jobs by its account's step (2.5 by the flat one): it asks what it was served
    assert flows["a2"].account == "A" and flows["a2"].asks == pytest.approx(1.0)
    assert flows["lone"].account is None and flows["lone"].asks == math.inf  # 2.5 jobs
    assert (flows["quiet"].account, flows["quiet"].account_weight) == ("Q", 3)


def test_noisy_account__tenants_within_their_own_shares_can_make_a_noisy_account():
    running = {("normal", f"a{i}"): 2 for i in range(4)} | {("normal", "solo"): 1}
    owners = {f"a{i}": "A" for i in range(4)}
    flows = {key: FlowWeight(1, True) for key in running}
    # the level counts account A once (weight 1) beside the lone tenant: 2
    level_weights = {"normal": 2}
    accounts = {("normal", "A"): FlowWeight(1, True)}
    # by weight alone each tenant is within half the level; the account runs 8 of 9
    assert noisy_tenants(running, level_weights, flows) == []
    (loud,) = noisy_accounts(running, level_weights, owners, accounts)
    assert (loud.account, loud.running, loud.tenants, loud.level_running) == ("A", 8, 4, 9)
    assert (loud.entitled, loud.measured) == (0.5, False)
    # entitled now, measured: within 1.5 times 0.6 of the level it is not noisy
    assert noisy_accounts(running, level_weights, owners, accounts, {("normal", "A"): 0.6}) == []
    # nobody else waits: not noisy, whatever it runs
    alone = {"normal": 1}
    assert noisy_accounts(running, alone, owners, accounts) == []
    # a tenant of no account is never an account row
    assert noisy_accounts({("normal", "solo"): 9, ("normal", "x"): 1}, {"normal": 2}, {}, {}) == []


def test_account_share_of__its_flows_all_asking_by_account_weight():
    a = [FlowAsk("normal", f"a{i}", 1, 0.1, "A", 2) for i in range(10)]  # quiet now
    b = FlowAsk("normal", "b", 1, math.inf, "B", 1)
    # A's tenants ask little now, but all asking it gets its weight's 2/3
    assert account_share_of(9.0, [*a, b], "normal", "A", 5) == pytest.approx(2 / 3)
    # and B, beside A asking for 1 of the 9: the 8 A leaves
    assert account_share_of(9.0, [*a, b], "normal", "B", 1) == pytest.approx(8 / 9)
    # an account with no flow here yet joins as one more account of its weight
    assert account_share_of(9.0, [b], "normal", "C", 2) == pytest.approx(2 / 3)
    assert account_share_of(0.0, [b], "normal", "C", 2) is None
