"""The pure policy: seed 1's edge cases, SPEC decisions 7-8, and properties."""

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairqueue.levels import DEFAULT_FAIR_WEIGHTS, PriorityLevel
from fairqueue.scheduler import (
    AGED,
    WEIGHTED_FAIR,
    PendingJob,
    job_id_sort_key,
    order_by_occupancy,
    order_pending_jobs,
)

C, H, N, L = PriorityLevel.CRITICAL, PriorityLevel.HIGH, PriorityLevel.NORMAL, PriorityLevel.LOW
NOW = 10_000_000
BOUND = 300_000


def backlog(level, count, *, start_id=0, tenant="t", ts=NOW - 1000):
    return [PendingJob(str(start_id + i), level, tenant, ts + i) for i in range(count)]


def ids(order):
    return [item.job_id for item in order]


def levels_of(order, jobs):
    by_id = {job.job_id: job.priority_level for job in jobs}
    return [by_id[item.job_id] for item in order]


def order(jobs, **kwargs):
    return order_pending_jobs(jobs, now_ms=NOW, max_wait_ms=BOUND, **kwargs)


def test_empty_queue__no_op():
    assert order([]) == []
    assert order_by_occupancy([], now_ms=NOW, max_wait_ms=BOUND) == []


def test_only_one_priority__fifo_by_enqueue_time_with_job_id_tie_break():
    jobs = [
        PendingJob("10", N, "t", 5),
        PendingJob("9", N, "t", 5),
        PendingJob("3", N, "t", 7),
        PendingJob("1", N, "t", 9),
    ]
    result = order_pending_jobs(jobs, now_ms=100, max_wait_ms=BOUND)
    assert ids(result) == ["9", "10", "3", "1"]
    assert [item.position for item in result] == [1, 2, 3, 4]
    assert {item.decision for item in result} == {WEIGHTED_FAIR}


def test_flood__8000_critical_2000_low__first_1000_is_800_to_200():
    jobs = backlog(C, 8000) + backlog(L, 2000, start_id=8000)
    head = Counter(levels_of(order(jobs)[:1000], jobs))
    assert head == {C: 800, L: 200}


def test_flood__8000_critical_200_low__all_low_in_first_1000():
    jobs = backlog(C, 8000) + backlog(L, 200, start_id=8000)
    head = Counter(levels_of(order(jobs)[:1000], jobs))
    assert head[L] == 200


def test_flood__occupancy_policy_runs_7200_critical_before_the_first_low():
    jobs = backlog(C, 8000) + backlog(L, 200, start_id=8000)
    result = levels_of(order_by_occupancy(jobs, now_ms=NOW, max_wait_ms=BOUND), jobs)
    # 800 critical left against 200 low is a tie of ratios; ties go to the higher weight.
    assert result.index(L) == 7201


def test_critical_against_low_interleaves_4_to_1_from_the_head():
    jobs = backlog(C, 40) + backlog(L, 10, start_id=100)
    result = levels_of(order(jobs), jobs)
    assert result[:10] == [C, C, C, C, L, C, C, C, C, L]


def test_four_backlogged_levels__4_3_2_1_per_round():
    jobs = []
    for n, level in enumerate((C, H, N, L)):
        jobs += backlog(level, 100, start_id=n * 1000)
    result = levels_of(order(jobs), jobs)
    for start in range(0, 100, 10):
        assert Counter(result[start : start + 10]) == {C: 4, H: 3, N: 2, L: 1}


def test_a_level_that_runs_out_stops_taking_turns():
    jobs = backlog(C, 3) + backlog(L, 20, start_id=100)
    # critical tags 1/4, 2/4, 3/4 all come before low's first tag 1; then only low is left.
    assert levels_of(order(jobs), jobs) == [C] * 3 + [L] * 20


def test_trickle__a_single_critical_job_does_not_starve_an_old_low_job():
    # Weighted fairness already interleaves; the wait bound is the hard backstop.
    jobs = [PendingJob("1", L, "t", NOW - BOUND - 1), PendingJob("2", C, "t", NOW)]
    result = order(jobs)
    assert ids(result) == ["1", "2"]
    assert [item.decision for item in result] == [AGED, WEIGHTED_FAIR]


def test_overdue_jobs_first__oldest_first_whatever_their_level():
    jobs = backlog(C, 50, ts=NOW - 10) + [
        PendingJob("900", L, "x", NOW - BOUND - 5),
        PendingJob("901", N, "y", NOW - BOUND - 50),
        PendingJob("902", C, "z", NOW - BOUND - 20),
    ]
    result = order(jobs)
    assert ids(result)[:3] == ["901", "902", "900"]
    assert [item.decision for item in result[:3]] == [AGED] * 3
    assert {item.decision for item in result[3:]} == {WEIGHTED_FAIR}


def test_exactly_at_the_bound_is_not_overdue():
    result = order([PendingJob("1", L, "t", NOW - BOUND)])
    assert result[0].decision == WEIGHTED_FAIR


def test_tenant_flood__sparse_tenants_of_the_level_go_first():
    jobs = backlog(N, 500, tenant="flooder", ts=NOW - 5000) + [
        PendingJob("a", N, "sparse-a", NOW - 10),
        PendingJob("b", N, "sparse-b", NOW - 20),
    ]
    assert ids(order(jobs))[:2] == ["b", "a"]


def test_tenant_counts_shrink_as_the_order_is_built():
    jobs = backlog(N, 3, tenant="A", ts=NOW - 900) + backlog(
        N, 2, start_id=10, tenant="B", ts=NOW - 800
    )
    # B (2) first, then A (3); after one B job B has 1 left, still fewer.
    assert ids(order(jobs)) == ["10", "11", "0", "1", "2"]


def test_tenant_tie__older_oldest_job_then_tenant_id():
    jobs = [
        PendingJob("1", N, "b", NOW - 50),
        PendingJob("2", N, "a", NOW - 60),
        PendingJob("3", N, "c", NOW - 60),
    ]
    assert ids(order(jobs)) == ["2", "3", "1"]


def test_numeric_job_ids_compare_as_numbers():
    assert sorted(["10", "9", "x", "100"], key=job_id_sort_key) == ["9", "10", "100", "x"]


def test_retry_keeps_original_timestamp_and_is_promoted_when_overdue():
    retried = PendingJob("7", L, "t", NOW - BOUND - 1)  # original enqueue time
    result = order(backlog(C, 100, start_id=100) + [retried])
    assert result[0].job_id == "7"
    assert result[0].decision == AGED


def test_bad_weights_are_rejected_naming_the_level():
    with pytest.raises(ValueError, match=r"weights\['low'\]=0"):
        order([], weights={C: 4, H: 3, N: 2, L: 0})


def test_custom_weights_are_honoured():
    jobs = backlog(C, 20) + backlog(L, 20, start_id=100)
    result = levels_of(order(jobs, weights={C: 1, H: 1, N: 1, L: 1}), jobs)
    assert result[:4] == [C, L, C, L]


# --- properties -------------------------------------------------------------------------

job_strategy = st.builds(
    PendingJob,
    job_id=st.one_of(st.integers(0, 10**6).map(str), st.text("abcxyz-", min_size=1, max_size=6)),
    priority_level=st.sampled_from(list(PriorityLevel)),
    tenant_id=st.sampled_from(["default", "t1", "t2", "t3"]),
    enqueued_at_ms=st.integers(NOW - 2 * BOUND, NOW),
)
jobs_strategy = st.lists(job_strategy, max_size=60, unique_by=lambda job: job.job_id)


@settings(max_examples=200, deadline=None)
@given(jobs_strategy, st.randoms(use_true_random=False))
def test_property__deterministic_and_permutation_invariant(jobs, rnd):
    shuffled = list(jobs)
    rnd.shuffle(shuffled)
    assert order(jobs) == order(shuffled)


@settings(max_examples=200, deadline=None)
@given(jobs_strategy)
def test_property__every_job_exactly_once_positions_1_to_n(jobs):
    result = order(jobs)
    assert sorted(ids(result)) == sorted(job.job_id for job in jobs)
    assert [item.position for item in result] == list(range(1, len(jobs) + 1))


@settings(max_examples=200, deadline=None)
@given(jobs_strategy)
def test_property__aged_first_oldest_first(jobs):
    result = order(jobs)
    by_id = {job.job_id: job for job in jobs}
    decisions = [item.decision for item in result]
    n_aged = decisions.count(AGED)
    assert decisions == [AGED] * n_aged + [WEIGHTED_FAIR] * (len(jobs) - n_aged)
    assert n_aged == sum(NOW - job.enqueued_at_ms > BOUND for job in jobs)
    ages = [by_id[item.job_id].enqueued_at_ms for item in result[:n_aged]]
    assert ages == sorted(ages)


@settings(max_examples=200, deadline=None)
@given(jobs_strategy)
def test_property__fifo_within_level_and_tenant(jobs):
    by_id = {job.job_id: job for job in jobs}
    fresh = [by_id[item.job_id] for item in order(jobs) if item.decision == WEIGHTED_FAIR]
    groups: dict = {}
    for job in fresh:
        groups.setdefault((job.priority_level, job.tenant_id), []).append(job)
    for group in groups.values():
        keys = [(job.enqueued_at_ms, job_id_sort_key(job.job_id)) for job in group]
        assert keys == sorted(keys)


@settings(max_examples=30, deadline=None)
@given(
    st.fixed_dictionaries({level: st.integers(2000, 6000) for level in PriorityLevel}),
    st.integers(0, 2**32),
)
def test_property__backlogged_shares_within_10_percent_of_weights(sizes, seed):
    rnd = random.Random(seed)
    jobs = []
    next_id = 0
    for level, size in sizes.items():
        for _ in range(size):
            tenant = f"t{rnd.randrange(20)}"
            jobs.append(PendingJob(str(next_id), level, tenant, NOW - rnd.randrange(BOUND)))
            next_id += 1
    head = Counter(levels_of(order(jobs)[:4000], jobs))
    total_weight = sum(DEFAULT_FAIR_WEIGHTS.values())
    for level, weight in DEFAULT_FAIR_WEIGHTS.items():
        expected = 4000 * weight / total_weight
        assert abs(head[level] - expected) <= 0.10 * expected
