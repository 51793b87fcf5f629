"""The pace a flow really gets (``scheduling/pace.py``): weighted max-min across levels
then across a level's flows, flows asking for less keeping only what they use."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairqueue.scheduling.pace import (
    ASKING_LINE_TAIL,
    BACKLOG_JOBS,
    FlowAsk,
    asked_rate,
    clock_ratio,
    current_shares,
    share_of,
    waiting_jobs,
)

LEVELS = ("critical", "high", "normal", "low")
WEIGHTS = {"critical": 4.0, "high": 3.0, "normal": 2.0, "low": 1.0}

asks = st.one_of(st.just(math.inf), st.floats(0, 50, allow_nan=False))
flow_lists = st.lists(
    st.tuples(st.sampled_from(LEVELS), st.sampled_from("abcdef"), st.sampled_from([1, 2, 3]), asks),
    max_size=14,
    unique_by=lambda row: (row[0], row[1]),
)


def _flows(rows):
    return [FlowAsk(level, tenant, float(weight), ask) for level, tenant, weight, ask in rows]


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 100, allow_nan=False), flow_lists)
def test_shares_are_weighted_max_min_level_by_level(capacity, rows):
    flows = _flows(rows)
    got = current_shares(capacity, flows)
    asked_all = sum(f.asks for f in flows)
    # nobody gets more than it asks; the workers are used as far as anyone asks
    for f in flows:
        assert got[(f.level, f.tenant)] <= f.asks + 1e-9
    assert sum(got.values()) == pytest.approx(min(capacity, asked_all), abs=1e-6)
    level_got = {lv: sum(r for (level, _), r in got.items() if level == lv) for lv in LEVELS}
    level_asked = {lv: sum(f.asks for f in flows if f.level == lv) for lv in LEVELS}
    for lv in LEVELS:
        # a level short of what it asks gets at least its weight's part beside any level
        # that gets more per weight
        if level_got[lv] < level_asked[lv] - 1e-6:
            for other in LEVELS:
                assert level_got[lv] / WEIGHTS[lv] >= level_got[other] / WEIGHTS[other] - 1e-6
        # inside a level, the same between its flows by tenant weight
        mine = [f for f in flows if f.level == lv]
        for f in mine:
            if got[(lv, f.tenant)] < f.asks - 1e-6:
                for g in mine:
                    assert got[(lv, f.tenant)] / f.weight >= got[(lv, g.tenant)] / g.weight - 1e-6


def test_quiet_and_held_tenants_count_for_what_they_use_not_their_weight():
    """A flooding weight-1 tenant beside a quiet weight-2 tenant and a max_active tenant
    of weight 1 that its limit holds to 0.5 jobs a second: normal alone, 10 jobs a second.
    By the weights the flood would get a quarter; it gets all the others leave."""
    flows = [
        FlowAsk("normal", "flood", 1, math.inf),
        FlowAsk("normal", "quiet", 2, asked_rate(backlog_jobs=1, served_per_s=0.2, held=False)),
        FlowAsk("normal", "held", 1, asked_rate(backlog_jobs=40, served_per_s=0.5, held=True)),
    ]
    got = current_shares(10.0, flows)
    assert got[("normal", "flood")] == pytest.approx(9.3)
    assert got[("normal", "quiet")] == pytest.approx(0.2)
    assert share_of(10.0, flows, "normal", "flood") == pytest.approx(0.93)


def test_a_level_beside_quiet_levels_gets_what_they_leave():
    flows = [
        FlowAsk("critical", "c", 1, 1.0),  # quiet critical: 1 job a second
        FlowAsk("normal", "a", 1, math.inf),
        FlowAsk("normal", "b", 1, math.inf),
        FlowAsk("low", "l", 1, math.inf),
    ]
    got = current_shares(10.0, flows)
    # 9 left: normal 2 parts, low 1 part
    assert got[("normal", "a")] == pytest.approx(3.0)
    assert got[("low", "l")] == pytest.approx(3.0)
    # a joining critical flood takes 4 parts of 7 at once
    flood = [*flows, FlowAsk("critical", "f", 1, math.inf)]
    got = current_shares(10.0, flood)
    assert got[("critical", "f")] + got[("critical", "c")] == pytest.approx(40 / 7)
    # a third normal tenant: normal keeps its 6 of the 9 left, split three ways
    assert share_of(10.0, flows, "normal", "new") == pytest.approx(0.2)


def test_a_new_flow_asks_for_all_it_can_take():
    assert share_of(10.0, [], "low", "x") == 1.0
    assert share_of(0.0, [], "low", "x") is None


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="capacity=-1"):
        current_shares(-1, [])
    with pytest.raises(ValueError, match="weight=0"):
        current_shares(1, [FlowAsk("low", "a", 0, 1)])
    with pytest.raises(ValueError, match="level='urgent'"):
        current_shares(1, [FlowAsk("urgent", "a", 1, 1)])
    with pytest.raises(ValueError, match="twice"):
        current_shares(1, [FlowAsk("low", "a", 1, 1), FlowAsk("low", "a", 1, 2)])


@given(st.floats(0, 100), st.floats(0, 100), st.booleans())
def test_only_an_unheld_backlog_asks_without_bound(backlog, served, held):
    rate = asked_rate(backlog_jobs=backlog, served_per_s=served, held=held)
    assert rate == (math.inf if backlog > 2 and not held else served)


@given(
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.one_of(st.none(), st.integers(min_value=0, max_value=ASKING_LINE_TAIL)),
)
def test_a_flows_backlog_is_what_waits_not_how_far_its_tag_ran(by_tag, line):
    """A flow with at most one of its line's last ids waiting never asks for more than it
    was served, however far its last tag ran; it never counts more than its tag distance;
    without a line (or with its tail all waiting) the tag distance decides."""
    got = waiting_jobs(by_tag, line)
    asks = asked_rate(backlog_jobs=got, served_per_s=1.0, held=False)
    assert got <= by_tag
    if line is not None and line <= 1:
        assert asks == 1.0
    if line is None or line >= ASKING_LINE_TAIL:
        assert asks == (math.inf if by_tag > BACKLOG_JOBS else 1.0)


def test_the_clock_slows_when_a_level_floods_and_not_for_a_change_within_a_level():
    """normal A and B backlogged beside low at 0.3 of the workers; then critical floods:
    the virtual time moves at critical's 4/7 over its weight 4 where it moved at
    normal's 0.7 over 2."""
    flows = [
        FlowAsk("normal", "A", 1.0, math.inf),
        FlowAsk("normal", "B", 1.0, math.inf),
        FlowAsk("low", "L", 1.0, 0.3),
        FlowAsk("critical", "C", 1.0, math.inf),
    ]
    before = {"normal": 0.7, "low": 0.3}
    ratio = clock_ratio(1.0, flows, "normal", "A", 1.0, before)
    assert ratio == pytest.approx((4 / 7 / 4) / (0.7 / 2))
    # a tenant of normal stepping up: normal still takes what low leaves
    within = clock_ratio(1.0, flows[:3], "normal", "A", 1.0, before)
    assert within == pytest.approx(1.0)
    assert clock_ratio(1.0, flows, "normal", "A", 1.0, {}) is None
