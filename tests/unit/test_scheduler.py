"""The pure policy: the edge cases of the levels and the wait bound (docs/design.md),
the reference model of the add script, and properties."""

import itertools
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairqueue.scheduling.fair_clock import FairClock
from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, PriorityLevel
from fairqueue.scheduling.order import (
    AGED,
    WEIGHTED_FAIR,
    PendingJob,
    job_id_sort_key,
    order_by_occupancy,
    order_pending_jobs,
    replaced_tag,
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


def test_overdue_jobs_are_labelled_aged_and_keep_their_flow_turns():
    # docs/design.md, "The wait bound": an overloaded flow bears its own overload. An overdue
    # low job is at the front of its own line already; it does not jump a critical flow.
    jobs = [PendingJob("1", L, "t", NOW - BOUND - 1), PendingJob("2", C, "t", NOW)]
    result = order(jobs)
    assert ids(result) == ["2", "1"]
    assert [item.decision for item in result] == [WEIGHTED_FAIR, AGED]


def test_critical_flood_all_overdue__low_within_its_share_still_gets_its_turns():
    # The flood is all older than the bound; a plain "overdue first, oldest first" would
    # run every critical job before the young low ones.
    jobs = backlog(C, 400, ts=NOW - BOUND - 10_000) + backlog(L, 20, start_id=1000, ts=NOW)
    result = levels_of(order(jobs), jobs)
    assert Counter(result[:100]) == {C: 80, L: 20}


def test_exactly_at_the_bound_is_not_overdue():
    result = order([PendingJob("1", L, "t", NOW - BOUND)])
    assert result[0].decision == WEIGHTED_FAIR


def test_tenant_flood__a_sparse_tenant_runs_within_the_first_round():
    jobs = backlog(N, 500, tenant="flooder", ts=NOW - 5000) + [
        PendingJob("a", N, "sparse-a", NOW - 10),
        PendingJob("b", N, "sparse-b", NOW - 20),
    ]
    assert set(ids(order(jobs))[:3]) == {"0", "a", "b"}


def test_two_equal_floods_alternate_round_robin():
    jobs = backlog(N, 50, tenant="A", ts=NOW - 900) + backlog(
        N, 50, start_id=100, tenant="B", ts=NOW - 800
    )
    tenants = [int(job_id) >= 100 for job_id in ids(order(jobs))]
    assert tenants == [False, True] * 50


def test_weighted_tenant_gets_three_turns_per_round():
    jobs = [PendingJob(str(i), N, "heavy", NOW - 900 + i, tenant_weight=3) for i in range(300)]
    jobs += [PendingJob(str(1000 + i), N, "light", NOW - 900 + i) for i in range(100)]
    head = Counter(job_id.isdigit() and int(job_id) < 1000 for job_id in ids(order(jobs))[:200])
    assert head == {True: 150, False: 50}


def test_a_levels_share_does_not_grow_with_its_tenant_count():
    jobs = []
    for tenant in range(10):
        jobs += backlog(C, 40, start_id=tenant * 100, tenant=f"c{tenant}")
    jobs += backlog(L, 100, start_id=5000, tenant="lonely")
    head = Counter(levels_of(order(jobs)[:100], jobs))
    assert head == {C: 80, L: 20}


def test_numeric_job_ids_compare_as_numbers():
    assert sorted(["10", "9", "x", "100"], key=job_id_sort_key) == ["9", "10", "100", "x"]


def test_retry_keeps_its_ready_time_and_its_place_in_its_flow():
    retried = PendingJob("7", L, "t", NOW - BOUND - 1)
    result = order(backlog(L, 10, start_id=100) + [retried])
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
def test_property__aged_labels_exactly_the_overdue_jobs(jobs):
    by_id = {job.job_id: job for job in jobs}
    for item in order(jobs):
        overdue = NOW - by_id[item.job_id].enqueued_at_ms > BOUND
        assert item.decision == (AGED if overdue else WEIGHTED_FAIR)


@settings(max_examples=200, deadline=None)
@given(jobs_strategy)
def test_property__fifo_within_level_and_tenant(jobs):
    by_id = {job.job_id: job for job in jobs}
    groups: dict = {}
    for job in (by_id[item.job_id] for item in order(jobs)):
        groups.setdefault((job.priority_level, job.tenant_id), []).append(job)
    for group in groups.values():
        keys = [(job.enqueued_at_ms, job_id_sort_key(job.job_id)) for job in group]
        assert keys == sorted(keys)


@settings(max_examples=30, deadline=None)
@given(
    st.fixed_dictionaries({level: st.integers(2000, 6000) for level in PriorityLevel}),
    st.integers(0, 2**32),
)
def test_property__backlogged_shares_within_2_percent_of_weights(sizes, seed):
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
        assert abs(head[level] - expected) <= 0.02 * expected


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(list(PriorityLevel)), st.integers(0, 5)), max_size=80),
)
def test_property__occupancy_policy_is_seed_1s_overdue_first(arrivals):
    jobs = [
        PendingJob(str(i), level, f"t{tenant}", NOW - (BOUND * 2 if tenant == 0 else 10))
        for i, (level, tenant) in enumerate(arrivals)
    ]
    result = order_by_occupancy(jobs, now_ms=NOW, max_wait_ms=BOUND)
    decisions = [item.decision for item in result]
    n_aged = decisions.count(AGED)
    assert decisions == [AGED] * n_aged + [WEIGHTED_FAIR] * (len(jobs) - n_aged)


# --- the add script's rule, one arrival at a time ----------------------------------------


RANK = {C: 0, H: 1, N: 2, L: 3}


def drain(clock, placed, count):
    """Serve ``count`` jobs in the queue's order (finish tag, then the higher weight,
    then arrival), advancing the clock from the next job, as the add script reads it
    from the queue's head."""
    served = []
    for _ in range(count):
        placed.sort()
        *_, job = placed.pop(0)
        served.append(job)
        if placed:
            clock.observe_head(placed[0][0], placed[0][3])
    return served


def arrive(clock, placed, level, tenant, label, weight=1):
    """A job arrives: placed by the clock."""
    tag = clock.place(level, tenant, weight)
    placed.append((tag, RANK[level], next(_arrivals), level, label))
    head = min(placed)
    clock.observe_head(head[0], head[3])


_arrivals = itertools.count()


def test_fair_clock__a_newcomer_runs_within_one_round_of_a_flood():
    clock, placed = FairClock(), []
    for _ in range(1000):
        arrive(clock, placed, N, "flooder", "flooder")
    drain(clock, placed, 100)
    arrive(clock, placed, N, "sparse", "sparse")
    # It joins the flooder's backlog, placed while the flooder was alone: at the flooder's
    # spacing, from the head's start tag; the flooder's job with an equal tag came first
    # (ties go by arrival), so it runs second.
    assert drain(clock, placed, 3) == ["flooder", "sparse", "flooder"]
    assert clock.vt == placed[0][0] - 6  # a lone normal tenant's turn back from the head


def test_fair_clock__a_returning_tenant_gets_half_its_level_from_its_first_turn():
    # "steady" floods alone: 600 jobs placed at a lone tenant's spacing. "back" returns
    # and floods too: from its first turn the two alternate, as round-robin asks, instead
    # of "back" getting one turn in three until the backlog placed without it is gone.
    clock, placed = FairClock(), []
    for _ in range(600):
        arrive(clock, placed, N, "steady", "steady")
    drain(clock, placed, 10)
    served = []
    for _ in range(2000):  # both ask for the whole level
        arrive(clock, placed, N, "steady", "steady")
        arrive(clock, placed, N, "back", "back")
        served += drain(clock, placed, 1)
    assert Counter(served[:100])["back"] == 50
    # past where the old backlog ended, both are placed at the two-tenant spacing
    assert clock.horizon == {}
    assert Counter(served[-100:])["back"] == 50


def test_fair_clock__bursts_sent_one_after_another_share_from_the_first_turn():
    # Ten tenants each send 100 jobs, one burst after another (a cron at the top of the
    # hour in every tenant): whatever order they came in, the next 400 jobs split evenly.
    # Placed at the level's weight split among the tenants already there, the first two
    # took 100 each, the last 12 (docs/design.md, "Joining a level").
    clock, placed = FairClock(), []
    for tenant in range(10):
        for _ in range(100):
            arrive(clock, placed, N, f"t{tenant}", f"t{tenant}")
    assert Counter(drain(clock, placed, 400)) == {f"t{t}": 40 for t in range(10)}


@pytest.mark.parametrize("turns", [1.0, 3.0])
def test_fair_clock__a_charge_moves_a_burst_by_its_own_turns_not_the_levels_split(turns):
    # The ten bursts again, placed at the catch-up spacing, one round a turn: a flow
    # charged for overrunning by a few turns (fairness by time) loses that many of its
    # turns in the next rounds. At the level's split now (ten tenants) a turn was ten
    # rounds: one turn of jitter took a tenant out for a second.
    clock, placed = FairClock(), []
    for tenant in range(10):
        for _ in range(100):
            arrive(clock, placed, N, f"t{tenant}", f"t{tenant}")
    drain(clock, placed, 300)
    move = clock.charge(N, "t3", turns)
    assert move is not None
    anchor, ratio, shift, upto = move
    for i, (tag, *rest) in enumerate(placed):
        if rest[-1] == "t3" and anchor < tag <= upto:
            placed[i] = (replaced_tag(tag, anchor, ratio, shift), *rest)
    placed.sort()
    served = Counter(drain(clock, placed, 200))
    assert served["t3"] == 20 - turns
    assert all(served[f"t{t}"] in (20, 21) for t in range(10) if t != 3)


@pytest.mark.parametrize(("every", "critical_share"), [(5, 0.2), (2, 0.4)])
def test_fair_clock__a_flow_that_keeps_emptying_gets_its_max_min_share_not_more(
    every, critical_share
):
    # A 3x overload of high, normal and low beside a critical tenant whose every job comes
    # alone and whose queue empties between them: it restarts at the virtual time only
    # once that has passed its last tag, so rejoining earns nothing. Within its share (1
    # job in 5) it gets all it asks; over it (1 in 2), its weight's 40%, not more; the
    # other levels share the rest 3:2:1 (docs/design.md, "Joining a level").
    clock, placed, served = FairClock(), [], []
    for tick in range(1200):
        for level in (H, N, L):
            arrive(clock, placed, level, level.value, level.value)
        if tick % every == 0:
            arrive(clock, placed, C, "small", C.value)
        served += drain(clock, placed, 1)
    shares = {level: n / len(served) for level, n in Counter(served).items()}
    rest = 1 - critical_share
    assert shares[C.value] == pytest.approx(critical_share, abs=0.005)
    for level, weight in ((H, 3), (N, 2), (L, 1)):
        assert shares[level.value] == pytest.approx(rest * weight / 6, abs=0.005)


def test_fair_clock__a_weighted_burst_joins_at_its_weight():
    # A weight-3 tenant's burst after a lone tenant's: 3 turns for its 1 from the start.
    clock, placed = FairClock(), []
    for _ in range(200):
        arrive(clock, placed, N, "first", "first")
    for _ in range(300):
        arrive(clock, placed, N, "big", "big", weight=3)
    for _ in range(100):
        arrive(clock, placed, N, "third", "third")
    assert Counter(drain(clock, placed, 100)) == {"first": 20, "big": 60, "third": 20}


def test_fair_clock__two_floods_arriving_together_alternate():
    clock, placed = FairClock(), []
    for _ in range(200):
        arrive(clock, placed, N, "A", "A")
        arrive(clock, placed, N, "B", "B")
    served = drain(clock, placed, 400)
    for start in range(0, 400, 20):
        assert Counter(served[start : start + 20]) == {"A": 10, "B": 10}


def test_fair_clock__levels_interleave_4_3_2_1_under_sustained_arrivals():
    clock, placed, served = FairClock(), [], []
    for _ in range(2000):
        for level in PriorityLevel:
            arrive(clock, placed, level, "t", level)
        served += drain(clock, placed, 2)  # arrivals at twice the service rate
    counts = Counter(served[1000:])
    total = sum(counts.values())
    for level, weight in DEFAULT_FAIR_WEIGHTS.items():
        assert abs(counts[level] / total - weight / 10) < 0.01


def test_fair_clock__a_late_job_takes_its_flows_next_turn_and_no_other_flows():
    # "busy" is over its share: five jobs waiting. Its late job (a retry past the bound)
    # goes behind them, charged like any turn; "calm" keeps its place in the round.
    clock = FairClock()
    tags = [clock.place(L, "busy") for _ in range(5)]
    calm = clock.place(L, "calm")
    late = clock.place(L, "busy")
    assert late > tags[-1]
    assert calm <= tags[1]  # within one round, not behind the busy backlog
    assert clock.place(L, "busy") > late


def test_fair_clock__a_reweighted_flow_and_its_level_count_the_new_weight_at_once():
    """A weight change: the flow's next job and the other flows' are placed by the new
    weight and total; a job placed with the weight stored when it was enqueued (a held or
    delayed job) does not undo it while the flow has work."""
    from fairqueue.scheduling.levels import PriorityLevel
    from fairqueue.scheduling.order import flow_step

    normal = PriorityLevel.NORMAL
    clock = FairClock()
    for _ in range(3):
        clock.place(normal, "a", 1)
        clock.place(normal, "b", 1)
    last_a, last_b = clock.last[(normal, "a")], clock.last[(normal, "b")]
    assert clock.reweight("a", 3) == {(normal, "a"): (clock.vt, 1 / 3)}
    assert clock.counted[(normal, "a")] == 3
    # its waiting jobs were placed again at a third of their distance: its last tag too
    last_a = clock.vt + (last_a - clock.vt) / 3
    assert clock.last[(normal, "a")] == last_a
    assert clock.place(normal, "b", 1) == last_b + flow_step(2, 1, 4)
    assert clock.place(normal, "a", 1, stored=True) == last_a + flow_step(2, 3, 4)
    assert clock.counted[(normal, "a")] == 3
    clock.place(normal, "a", 1)  # looked up now: a weight given at enqueue still wins
    assert clock.counted[(normal, "a")] == 1
