"""The fair order by level, then account, then tenant (hierarchical max-min) in the
reference model, ``FairClock`` (docs/design.md, "Accounts")."""

import heapq
import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairqueue.scheduling.fair_clock import FairClock
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.order import replaced_tag

C, H, N, L = PriorityLevel.CRITICAL, PriorityLevel.HIGH, PriorityLevel.NORMAL, PriorityLevel.LOW
RANK = {C: 0, H: 1, N: 2, L: 3}
_order = itertools.count()


def arrive(clock, placed, level, tenant, weight=1, account=None, account_weight=1, cost=1.0):
    tag = clock.place(
        level, tenant, weight, account=account, account_weight=account_weight, cost=cost
    )
    heapq.heappush(placed, (tag, RANK[level], next(_order), level, tenant))
    clock.observe_head(placed[0][0], placed[0][3])
    return tag


def take(clock, placed, count):
    """Serve ``count`` jobs in the queue's order (``placed`` is a heap), the clock
    following the head."""
    served = []
    for _ in range(min(count, len(placed))):
        served.append(heapq.heappop(placed)[4])
        if placed:
            clock.observe_head(placed[0][0], placed[0][3])
    return served


step = st.tuples(
    st.sampled_from([C, N, L]),
    st.sampled_from(["x", "a", "b"]),
    st.sampled_from([1, 2, 3]),
    st.integers(0, 3),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(step, min_size=1, max_size=60), st.sampled_from([1, 2, 5]))
def test_an_account_of_one_tenant_places_as_a_tenant_of_the_accounts_weight(steps, weight):
    """Hierarchical max-min nests: an account whose only tenant is ``x`` (whatever x's own
    weight) is served as a tenant without an account whose weight is the account's, in
    every order of arrivals, weights and takes."""
    nested, flat = FairClock(), FairClock()
    placed_nested, placed_flat = [], []
    for level, tenant, tenant_weight, taken in steps:
        if tenant == "x":
            a = arrive(nested, placed_nested, level, "x", tenant_weight, "X", weight)
            b = arrive(flat, placed_flat, level, "x", weight)
        else:
            a = arrive(nested, placed_nested, level, tenant, tenant_weight)
            b = arrive(flat, placed_flat, level, tenant, tenant_weight)
        assert a == pytest.approx(b, rel=1e-12)
        assert take(nested, placed_nested, taken) == take(flat, placed_flat, taken)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.lists(st.integers(1, 3), min_size=1, max_size=4)),
        min_size=1,
        max_size=4,
    ),
    st.lists(st.integers(1, 3), max_size=3),
)
def test_backlogged_accounts_share_by_account_weight_and_their_tenants_by_tenant_weight(
    accounts, loners
):
    """Every flow floods one level, arriving together (round robin): once past the
    joiners' catch-up, each flow's step is its hierarchical share's (the level split by
    account weight, a tenant without an account its own account, each account's part by
    tenant weight); while all have work each is served that share, within two rounds
    (the first rounds serve joiners above it, by what was placed before they joined:
    docs/design.md, "Joining a level")."""
    clock, placed = FairClock(), []
    flows = []  # (tenant, tenant weight, account, account weight)
    for i, (account_weight, tenants) in enumerate(accounts):
        flows += [(f"a{i}t{j}", w, f"a{i}", account_weight) for j, w in enumerate(tenants)]
    flows += [(f"solo{j}", w, None, w) for j, w in enumerate(loners)]
    per_flow = 120
    tags: dict[str, list[float]] = {}
    for _ in range(per_flow):
        for tenant, weight, account, account_weight in flows:
            tag = arrive(clock, placed, N, tenant, weight, account, account_weight)
            tags.setdefault(tenant, []).append(tag)
    level = sum(aw for aw, _ in accounts) + sum(loners)
    expected = {}
    for tenant, weight, account, account_weight in flows:
        mates = sum(w for t, w, a, _ in flows if a == account) if account else weight
        expected[tenant] = account_weight / level * weight / mates
        # a normal-level job of a flow with the whole level: 12 / 2 = 6
        assert tags[tenant][-1] - tags[tenant][-2] == pytest.approx(6 / expected[tenant])
    # served while every flow still has work: the first flow to run out ends the window
    window = int(per_flow / max(expected.values())) - len(flows)
    served = Counter(take(clock, placed, window))
    for tenant, share in expected.items():
        assert abs(served[tenant] - share * window) <= 2 + 2 * len(flows), (tenant, served)


@pytest.mark.parametrize("bursts", [False, True])
@pytest.mark.parametrize(("weight", "low", "high"), [(1, 0.45, 0.55), (2, 0.62, 0.72)])
def test_ten_tenants_of_one_account_beside_another_accounts_one_take_its_share(
    bursts, weight, low, high
):
    """The case accounts are for: one customer's 10 tenant ids flooding a level beside
    another customer's single tenant. Flat, the ten took 10/11; by account, half (two
    thirds with account weights 2:1), the ten sharing it equally (each within 5% of a
    tenth), whether the floods arrive together or in bursts one after another (each of
    the ten a backlog placed at a lone tenant's spacing, the other customer last)."""
    clock, placed = FairClock(), []
    big = [f"big-{i}" for i in range(10)]
    if bursts:
        for tenant in big:
            for _ in range(400):
                arrive(clock, placed, N, tenant, account="big", account_weight=weight)
        for _ in range(4000):
            arrive(clock, placed, N, "small", account="small")
    else:
        for _ in range(400):
            for tenant in big:
                arrive(clock, placed, N, tenant, account="big", account_weight=weight)
            for _ in range(10):
                arrive(clock, placed, N, "small", account="small")
    served = Counter(take(clock, placed, 2000))
    mine = sum(served[tenant] for tenant in big)
    assert low <= mine / 2000 <= high
    for tenant in big:
        assert 0.95 <= served[tenant] / (mine / 10) <= 1.05


def test_without_accounts_the_same_floods_take_ten_turns_in_eleven():
    """The flat rule the accounts change: each tenant id its own share."""
    clock, placed = FairClock(), []
    for _ in range(400):
        for i in range(10):
            arrive(clock, placed, N, f"big-{i}")
        for _ in range(10):
            arrive(clock, placed, N, "small")
    served = Counter(take(clock, placed, 2200))
    assert served["small"] == 200


def test_a_returning_account_gets_its_share_from_its_first_turn():
    """An account back after being idle joins the level's backlogs at their spacing, as a
    returning tenant does (docs/design.md, "Joining a level"), one level up: half of the
    level from its first turns beside another account's flood."""
    clock, placed = FairClock(), []
    for _ in range(600):
        for tenant in ("s1", "s2"):
            arrive(clock, placed, N, tenant, account="steady")
    take(clock, placed, 10)
    served = []
    for _ in range(400):
        for tenant in ("s1", "s2"):
            arrive(clock, placed, N, tenant, account="steady")
        for tenant in ("r1", "r2"):
            arrive(clock, placed, N, tenant, account="back")
        served += take(clock, placed, 2)
    first = Counter(served[:100])
    assert 45 <= first["r1"] + first["r2"] <= 55


def test_retries_inside_one_account_take_nothing_from_the_other_account():
    """A retry storm inside one account (every attempt a new turn of its flow) stays
    inside the account's share: the other account keeps half of the level."""
    clock, placed = FairClock(), []
    for _ in range(300):
        arrive(clock, placed, N, "calm", account="other")
        for _ in range(5):  # each job of the stormy tenant runs 5 attempts
            arrive(clock, placed, N, "stormy", account="storm")
        arrive(clock, placed, N, "quiet", account="storm")
    served = Counter(take(clock, placed, 400))
    assert 0.45 <= served["calm"] / 400 <= 0.55
    assert served["stormy"] == pytest.approx(served["quiet"], abs=4)


def test_a_charge_moves_an_account_flow_by_its_hierarchical_step():
    """Worker time overrun by a flow of an account is charged at the flow's own spacing
    (its account's split of the level), as its next job would be."""
    clock, placed = FairClock(), []
    for tenant in ("a", "b"):
        arrive(clock, placed, N, tenant, account="A")
    arrive(clock, placed, N, "c")
    for tenant in ("a", "b"):
        arrive(clock, placed, N, tenant, account="A")
    before = clock.last[(N, "a")]
    clock.charge(N, "a", 1.0)
    after = clock.last[(N, "a")]
    nxt = arrive(clock, placed, N, "a", account="A")
    assert after - before == pytest.approx(nxt - after)


@pytest.mark.parametrize("account_weight", [1, 2])
@pytest.mark.parametrize("turns", [1.0, 3.0])
def test_a_charge_of_a_tenant_in_an_account_costs_that_many_turns_of_its_own_line(
    turns, account_weight
):
    """Ten tenants of one account send bursts one after another (each joining its mates'
    backlogs, placed at their spacing), then another account floods the level: its tenants
    take turns round-robin in the account's part. A tenant charged for overrunning by a
    few turns (fairness by time) loses that many of its own turns, not that many of its
    account's share of the level now (ten of its mates' turns each)."""
    clock, placed = FairClock(), []
    for tenant in range(10):
        for _ in range(100):
            arrive(clock, placed, N, f"t{tenant}", account="big", account_weight=account_weight)
    for _ in range(1000):
        arrive(clock, placed, N, "solo", account="other")
    take(clock, placed, 300)
    move = clock.charge(N, "t3", turns)
    assert move is not None
    anchor, ratio, shift, upto = move
    for i, (tag, *rest) in enumerate(placed):
        if rest[-1] == "t3" and anchor < tag <= upto:
            placed[i] = (replaced_tag(tag, anchor, ratio, shift), *rest)
    heapq.heapify(placed)
    # the account's part of the next jobs: 200 of them, 20 rounds of its ten tenants
    served = Counter(take(clock, placed, 200 * (account_weight + 1) // account_weight))
    assert served["t3"] == 20 - turns
    assert all(served[f"t{t}"] == 20 for t in range(10) if t != 3)
