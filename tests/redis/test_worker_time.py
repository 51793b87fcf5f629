"""Service is worker time (docs/design.md, "Service is worker time"): a flow's tags
advance by what its jobs cost, estimated from measured run times and charged after the
fact; FAIRNESS_BY="jobs" keeps the count of jobs."""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairqueue import InvalidJobOptionError, conf, enqueue_job
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.scheduling.fair_clock import FairClock
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.order import (
    MAX_COST_TURNS,
    MIN_COST_TURNS,
    cost_turns,
    overrun_turns,
    settle_debt,
    turn_scale,
)
from tests.helpers import metric
from tests.helpers.usage import take_jobs_failing_first

# Timing-sensitive (live workers, loops): `make test` runs them after the parallel part.
pytestmark = [pytest.mark.django_db, pytest.mark.serial]

positive = st.floats(min_value=1e-6, max_value=1e9, allow_nan=False, allow_infinity=False)


# -- the pure rule --------------------------------------------------------------------


@given(positive)
def test_cost_of_a_flow_as_typical_as_the_queue_is_one_turn(seconds):
    assert cost_turns(seconds, seconds) == 1.0
    assert cost_turns(seconds * 1.05, seconds) == 1.0  # noise: the order of counting jobs


@given(positive, positive)
def test_cost_is_bounded_on_a_grid_and_one_when_nothing_is_measured(estimate, typical):
    turns = cost_turns(estimate, typical)
    assert MIN_COST_TURNS <= turns <= MAX_COST_TURNS
    assert math.isclose(math.log2(turns) * 4, round(math.log2(turns) * 4))  # a grid of 2^(k/4)
    assert cost_turns(None, typical) == cost_turns(estimate, None) == 1.0


@given(positive, positive, positive)
def test_cost_grows_with_the_estimate(a, b, typical):
    low, high = sorted((a, b))
    assert cost_turns(low, typical) <= cost_turns(high, typical)


@given(positive, positive)
def test_a_turn_is_the_typical_time_over_the_unit_within_the_cost_bounds(typical, unit):
    scale = turn_scale(typical, unit)
    assert MIN_COST_TURNS <= scale <= MAX_COST_TURNS
    if MIN_COST_TURNS <= typical / unit <= MAX_COST_TURNS:
        assert scale == typical / unit
    assert turn_scale(typical, typical) == 1.0
    assert turn_scale(None, unit) == turn_scale(typical, None) == 1.0


def test_tags_placed_while_the_typical_time_moves_stay_in_one_currency():
    """Two flows, 10 ms and 60 ms jobs: placed while the typical run time was 35 ms
    and after it fell to 18 ms, each job's step is about its worker time in units, so a
    backlog placed early is not cheaper than one placed later."""
    unit = 35.0
    for typical in (35.0, 18.0):
        quick = cost_turns(10, typical) * turn_scale(typical, unit)
        slow = cost_turns(60, typical) * turn_scale(typical, unit)
        assert math.isclose(quick, 10 / unit, rel_tol=0.1)
        assert math.isclose(slow, 60 / unit, rel_tol=0.1)


@given(positive, st.floats(min_value=MIN_COST_TURNS, max_value=MAX_COST_TURNS), positive)
def test_an_overrun_is_bounded_both_ways(used, placed, typical):
    turns = overrun_turns(used, placed, typical)
    assert MIN_COST_TURNS - placed <= turns <= MAX_COST_TURNS - placed
    assert overrun_turns(used, placed, None) == 0


@given(st.lists(st.floats(min_value=-16, max_value=16), max_size=50))
def test_a_balance_is_settled_whole_turns_at_a_time_and_nothing_is_lost(overruns):
    debt, charged = 0.0, 0.0
    for overrun in overruns:
        debt, now = settle_debt(debt, overrun)
        assert now == 0 or abs(now) >= 1
        assert abs(debt) < 1
        charged += now
    assert math.isclose(charged + debt, sum(overruns), abs_tol=1e-6)


def test_the_model_places_a_costly_flow_later_and_charges_an_overrun():
    clock = FairClock()
    fast = clock.place(PriorityLevel.NORMAL, "fast")
    slow = clock.place(PriorityLevel.NORMAL, "slow", cost=4.0)
    assert slow > fast
    before = clock.place(PriorityLevel.NORMAL, "fast")
    clock.charge(PriorityLevel.NORMAL, "fast", 2.0)
    assert clock.place(PriorityLevel.NORMAL, "fast") - before > (before - fast)


# -- in Redis -------------------------------------------------------------------------


def _measure_two_tenants(prefix: str, fast_s: float = 0.01, slow_s: float = 0.1) -> None:
    """Both tenants' jobs run (one slow, one fast); the pass reads their run times."""
    rebalance_queue("email", rebalancer="time-test")  # the history starts now
    for _ in range(4):
        for tenant in ("fast", "slow"):
            enqueue_job("email", {}, tenant_id=tenant)
    asyncio.run(take_jobs_failing_first(prefix, 8, set(), {"fast": fast_s, "slow": slow_s}))
    rebalance_queue("email", rebalancer="time-test")


def _score(redis_client, prefix: str, job_id: str) -> float:
    return redis_client.zscore(f"{prefix}:email:prioritized", job_id)


def test_a_slow_flows_next_job_is_placed_later_than_a_fast_flows(fq_prefix, redis_client):
    _measure_two_tenants(fq_prefix)
    state = redis_client.hgetall(f"{fq_prefix}:email:fq:state")
    fast, slow = float(state["c:normal\nfast"]), float(state["c:normal\nslow"])
    assert slow > 5 * fast and float(state["typ"]) > 0
    # Two flows with work again, one job each: the slow one's costs it more turns.
    a = enqueue_job("email", {}, tenant_id="fast").job_id
    b = enqueue_job("email", {}, tenant_id="slow").job_id
    a2 = enqueue_job("email", {}, tenant_id="fast").job_id
    assert (
        _score(redis_client, fq_prefix, b)
        > _score(redis_client, fq_prefix, a2)
        > (_score(redis_client, fq_prefix, a))
    )
    # The worker time the pass saw, per level, as a metric.
    assert metric("queue_fair_worker_seconds_total", job_type="email", priority_level="normal") > 0


def test_a_job_keeps_what_it_paid_cold_or_by_its_flows_estimate(fq_prefix, redis_client):
    """The pass charges a job's run against what it paid when placed: ``fqPaid`` for a
    job placed cold, ``fqCost`` for one placed by its flow's estimate (a young estimate's
    error is owed, not forgotten once the estimate has grown)."""
    _measure_two_tenants(fq_prefix)
    state = redis_client.hgetall(f"{fq_prefix}:email:fq:state")
    typical, unit = float(state["typ"]), float(state["unit"])
    slow = enqueue_job("email", {}, tenant_id="slow").job_id
    cold = enqueue_job("email", {}, tenant_id="new").job_id
    slow_hash = redis_client.hgetall(f"{fq_prefix}:email:{slow}")
    paid = cost_turns(float(state["c:normal\nslow"]), typical) * turn_scale(typical, unit)
    assert "fqPaid" not in slow_hash and float(slow_hash["fqCost"]) == pytest.approx(paid, 1e-5)
    cold_hash = redis_client.hgetall(f"{fq_prefix}:email:{cold}")
    assert "fqCost" not in cold_hash
    assert float(cold_hash["fqPaid"]) == pytest.approx(turn_scale(typical, unit), 1e-5)


def test_fairness_by_jobs_counts_jobs(fq_prefix, redis_client, settings):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "FAIRNESS_BY": "jobs"}
    conf.reload_settings()
    _measure_two_tenants(fq_prefix)
    assert "typ" not in redis_client.hgetall(f"{fq_prefix}:email:fq:state")
    a = enqueue_job("email", {}, tenant_id="fast").job_id
    b = enqueue_job("email", {}, tenant_id="slow").job_id
    a2 = enqueue_job("email", {}, tenant_id="fast").job_id
    assert _score(redis_client, fq_prefix, a) < _score(redis_client, fq_prefix, a2)
    assert _score(redis_client, fq_prefix, b) < _score(redis_client, fq_prefix, a2)


def test_an_overrun_moves_its_flows_later_jobs_back(fq_prefix, redis_client):
    """Charged after the fact: a flow whose attempt ran far longer than its estimate
    (here: no estimate yet, so one turn) has its clock moved on by the difference."""
    _measure_two_tenants(fq_prefix, fast_s=0.01, slow_s=0.01)  # a typical run: ~10 ms
    for _ in range(2):  # fair order: steady, bursty, steady, bursty
        for tenant in ("steady", "bursty"):
            enqueue_job("email", {}, tenant_id=tenant)
    flows = f"{fq_prefix}:email:fq:flows"
    before = redis_client.zscore(flows, "normal\nbursty")
    asyncio.run(take_jobs_failing_first(fq_prefix, 2, set(), {"steady": 0.01, "bursty": 0.15}))
    rebalance_queue("email", rebalancer="time-test")
    assert redis_client.zscore(flows, "normal\nbursty") > before


def test_cost_option_reaches_the_placement_and_is_validated(fq_prefix, redis_client):
    _measure_two_tenants(fq_prefix)
    cheap = enqueue_job("email", {}, tenant_id="x", cost=0.001).job_id
    dear = enqueue_job("email", {}, tenant_id="y", cost=10.0).job_id
    assert _score(redis_client, fq_prefix, dear) > _score(redis_client, fq_prefix, cheap)
    for bad in (0, -1, float("nan"), float("inf"), True, "1", 10**9):
        with pytest.raises(InvalidJobOptionError, match=r"^cost=.* is not allowed: expected"):
            enqueue_job("email", {}, tenant_id="x", cost=bad)
    opts = json.loads(redis_client.hget(f"{fq_prefix}:email:{cheap}", "opts"))
    assert "fqReady" in opts


def test_the_dashboard_history_shows_worker_time_and_retries_per_level(fq_prefix, redis_client):
    from fairqueue.dashboard.stats import queue_stats

    _measure_two_tenants(fq_prefix, fast_s=0.01, slow_s=0.05)
    levels = queue_stats("email")["history"]["levels"]
    assert levels["normal"]["worker_s"] >= 0.2 and levels["normal"]["time_share"] == 1.0
    assert levels["normal"]["time_share_display"] == "100%"
    assert levels["critical"]["worker_s"] == 0 and levels["normal"]["retries"] == 0


def test_retries_are_counted_per_level(fq_prefix, redis_client):
    rebalance_queue("email", rebalancer="time-test")  # the history starts now
    job = enqueue_job("email", {}, tenant_id="t", priority_level="high", attempts=2)
    before = metric("queue_fair_retries_total", job_type="email", priority_level="high")
    asyncio.run(take_jobs_failing_first(fq_prefix, 2, fail={job.job_id}))  # fails, then runs
    result = rebalance_queue("email", rebalancer="time-test")
    assert result.served["high"][1] == 1
    assert metric("queue_fair_retries_total", job_type="email", priority_level="high") == (
        before + 1
    )


def test_a_flows_estimate_and_balance_are_forgotten_once_it_is_idle(
    fq_prefix, redis_client, monkeypatch
):
    """Bounded state: every flow that ran leaves its estimate and balance in fq:state,
    until it has been idle for FLOW_STATE_IDLE_S; then a pass forgets them (a few per
    call), and a flow that comes back starts afresh."""
    from fairqueue.scheduling import attempts

    _measure_two_tenants(fq_prefix)
    state = f"{fq_prefix}:email:fq:state"
    flows = {"normal\nfast", "normal\nslow"}
    assert {f"c:{flow}" for flow in flows} <= set(redis_client.hkeys(state))
    assert set(redis_client.zrange(f"{fq_prefix}:email:fq:seen", 0, -1)) == flows
    rebalance_queue("email", rebalancer="time-test")  # not idle long enough yet
    assert {f"c:{flow}" for flow in flows} <= set(redis_client.hkeys(state))
    monkeypatch.setattr(attempts, "FLOW_STATE_IDLE_S", 0)
    time.sleep(0.01)
    rebalance_queue("email", rebalancer="time-test")
    left = {name for name in redis_client.hkeys(state) if name[:2] in ("c:", "d:")}
    assert left == set()
    assert not redis_client.exists(f"{fq_prefix}:email:fq:seen")
    assert "typ" in redis_client.hkeys(state)  # the queue's yardstick stays


def test_the_unit_is_the_first_measurement_then_the_typical_time_at_each_idle_start(
    fq_prefix, redis_client
):
    """A turn's length in tags: the first page that measures a run writes the unit; while
    jobs wait, a job is placed at its turns times typ / unit; once nothing is waiting,
    the next add makes the typical time the unit again (nothing placed is repriced)."""
    _measure_two_tenants(fq_prefix)
    state = f"{fq_prefix}:email:fq:state"
    assert float(redis_client.hget(state, "unit")) > 0
    redis_client.hset(state, mapping={"typ": 100, "unit": 50, "c:normal\nfast": 100})
    redis_client.hdel(state, "p:normal\nfast")  # its cold runs' refund: paid job by job
    first = enqueue_job("email", {}, tenant_id="fast").job_id  # the queue was idle
    assert redis_client.hget(state, "unit") == "100"
    second = enqueue_job("email", {}, tenant_id="fast").job_id  # one waits: unit stays
    redis_client.hset(state, mapping={"typ": 200, "c:normal\nfast": 200})
    third = enqueue_job("email", {}, tenant_id="fast").job_id
    assert redis_client.hget(state, "unit") == "100"
    one = _score(redis_client, fq_prefix, second) - _score(redis_client, fq_prefix, first)
    two = _score(redis_client, fq_prefix, third) - _score(redis_client, fq_prefix, second)
    assert math.isclose(two, one * 2, rel_tol=0.01)  # one turn, twice as long in tags
