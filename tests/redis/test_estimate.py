"""When a job will start: ``estimate_start`` places a new job where the add script will
(the read-only Lua and the Python model agree with the add, job for job), ``job_status``
reports each state and the jobs popped before a job, and the wait arithmetic."""

from __future__ import annotations

import math
import time

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairqueue.broker import TAG_FLOOR, TAG_RESOLUTION, Broker, NewJob, SyncBroker
from fairqueue.broker.status_reads import StatusReads
from fairqueue.scheduling import estimate as eta
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.limits import TenantLimits
from tests.helpers.keys import REDIS_URL, delete_prefix, run_prefix

C, H, N, L = PriorityLevel.CRITICAL, PriorityLevel.HIGH, PriorityLevel.NORMAL, PriorityLevel.LOW
RANK = {C: 0, H: 1, N: 2, L: 3}

arrival = st.tuples(
    st.sampled_from(list(PriorityLevel)),
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from([1, 1, 2, 3]),
)


def _score_of(tag: float, level: PriorityLevel) -> int:
    return TAG_FLOOR * 2**32 + math.floor(tag * TAG_RESOLUTION) * 4 + RANK[level]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(arrival, st.integers(1, 4), st.integers(0, 3)),
        min_size=1,
        max_size=14,
    )
)
def test_the_estimate_places_as_the_add_script_and_the_model(steps):
    """Before each add (n jobs of one flow, some jobs taken in between as a worker takes
    them): the read-only script's tag for the n-th job, the Python model's tag from the
    state the script read, and the score the add script then gives the n-th job are the
    same; the jobs counted before it are those with lower scores."""
    prefix = run_prefix()
    broker = SyncBroker(Broker(REDIS_URL, prefix, fairness_by="jobs"))
    reads = StatusReads(broker.broker.conn, fairness_by="jobs")
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    key = f"{prefix}:q:prioritized"
    try:
        for (level, tenant, weight), n, taken in steps:
            raw = broker.run(
                reads.estimate, "q", level=level, tenant=tenant, tenant_weight=weight, count=n
            )
            p = raw.placement
            assert eta.place(p.flow, n) == pytest.approx(p.tag, rel=0, abs=1e-9)
            # A batch whose first job goes ahead of every job waiting moves the virtual
            # time as it is placed, which the estimate leaves out (docs/design.md).
            first = broker.run(
                reads.estimate, "q", level=level, tenant=tenant, tenant_weight=weight, count=1
            )
            exact = n == 1 or first.placement.ahead > 0
            assert p.score == _score_of(p.tag - p.base, level)
            lower = client.zcount(key, "-inf", f"({p.score}")
            added = broker.add_jobs(
                "q", [NewJob("x", {}, level, tenant=tenant, tenant_weight=weight)] * n
            )
            if exact:
                assert client.zscore(key, added[-1].job_id) == p.score
            assert p.ahead == lower + n - 1  # and the batch's own jobs before it
            waiting = client.zcard(key)
            if taken and waiting > 1:
                client.zpopmin(key, min(taken, waiting - 1))
    finally:
        broker.close()
        client.close()
        delete_prefix(prefix)


#: Tenants' accounts: a and b share account X (weight 2), c is alone in Y, d has none.
ACCOUNTS = {"a": ("X", 2), "b": ("X", 2), "c": ("Y", 1)}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(arrival, st.integers(1, 3), st.integers(0, 3)),
        min_size=1,
        max_size=14,
    )
)
def test_a_tenant_of_an_account_is_placed_by_level_then_account_then_tenant(steps):
    """Tenants of accounts beside one of none: the read-only script places the n-th new
    job by the hierarchical rule where the add script then puts it, and the Python model
    gives the same tag from what the script read."""
    prefix = run_prefix()
    broker = SyncBroker(Broker(REDIS_URL, prefix, fairness_by="jobs"))
    reads = StatusReads(broker.broker.conn, fairness_by="jobs")
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    key = f"{prefix}:q:prioritized"
    try:
        for (level, tenant, weight), n, taken in steps:
            account = ACCOUNTS.get(tenant)
            raw = broker.run(
                reads.estimate,
                "q",
                level=level,
                tenant=tenant,
                tenant_weight=weight,
                count=n,
                account=account,
            )
            p = raw.placement
            assert eta.place(p.flow, n) == pytest.approx(p.tag, rel=0, abs=1e-9)
            first = broker.run(
                reads.estimate,
                "q",
                level=level,
                tenant=tenant,
                tenant_weight=weight,
                count=1,
                account=account,
            )
            exact = n == 1 or first.placement.ahead > 0
            job = NewJob(
                "x",
                {},
                level,
                tenant=tenant,
                tenant_weight=weight,
                account=None if account is None else account[0],
                account_weight=1 if account is None else account[1],
            )
            added = broker.add_jobs("q", [job] * n)
            if exact:
                assert client.zscore(key, added[-1].job_id) == p.score
            waiting = client.zcard(key)
            if taken and waiting > 1:
                client.zpopmin(key, min(taken, waiting - 1))
    finally:
        broker.close()
        client.close()
        delete_prefix(prefix)


def test_an_account_s_second_tenant_is_placed_inside_its_account():
    """Two tenants of one account beside a tenant of none, in one level: the account's
    second tenant shares the account's half, so its job goes a whole account's turn
    further back than the flat rule (a third of the level each) would put it."""
    prefix = run_prefix()
    broker = SyncBroker(Broker(REDIS_URL, prefix, fairness_by="jobs"))
    reads = StatusReads(broker.broker.conn, fairness_by="jobs")
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        broker.add_jobs("q", [NewJob("x", {}, N, tenant="solo")] * 4)
        broker.add_jobs("q", [NewJob("x", {}, N, tenant="a", account="X")] * 4)
        raw = broker.run(
            reads.estimate, "q", level=N, tenant="b", tenant_weight=1, count=4, account=("X", 1)
        )
        flat = broker.run(reads.estimate, "q", level=N, tenant="b", tenant_weight=1, count=4)
        assert raw.placement.flow.account == "X"
        assert raw.placement.tag > flat.placement.tag
        added = broker.add_jobs("q", [NewJob("x", {}, N, tenant="b", account="X")] * 4)
        assert client.zscore(f"{prefix}:q:prioritized", added[-1].job_id) == raw.placement.score
    finally:
        broker.close()
        client.close()
        delete_prefix(prefix)


def _rate(per_level: dict[str, int], seconds: int = 60) -> eta.ServiceRate:
    """A steady history: ``per_level`` starts in each 10 s bucket of the last ``seconds``."""
    now_ms = 1_000_000_000
    current = now_ms // 1000 // 10 * 10
    buckets = [eta.HistoryBucket(current - 10 * b, dict(per_level), {}) for b in range(1, 7)]
    return eta.service_rate(
        buckets, now_ms=current * 1000, since_ms=0, bucket_s=10, window_s=seconds
    )


def test_the_virtual_time_moves_at_the_pace_of_the_backlogged_level():
    # critical and low both backlogged: 8 and 2 jobs a second, 4:1
    rate = _rate({"critical": 80, "low": 20})
    assert rate.jobs_per_s == pytest.approx(10)
    assert rate.vt_per_s == pytest.approx(12 * 2)  # 12 * max(8/4, 2/1)
    # the 5th low job of a lone low tenant (tags 12, 24, ...): 4 low jobs before it, each
    # one in five jobs served: 20 jobs, 2 s
    wait = eta.placed_wait(tag=60, level=L, vt=0, ahead=5, rate=rate)
    assert wait.expected_s == pytest.approx(2.0)
    # no recent estimates of low to judge by: not high, and a wide range
    assert wait.confidence == "medium"
    assert wait.low_s < wait.expected_s < wait.high_s


def test_the_flow_over_its_share_waits_for_its_share_not_for_the_jobs_ahead():
    """Two tenants of a level, one flooding: its 100th job waits for 100 of its own turns
    at half the workers, though only 60 jobs are ahead of it now."""
    rate = _rate({"normal": 100})  # 10 jobs a second, one level
    flood = eta.FlowSnapshot(N, 1, vt=0.0, last=600.0, counted=1, total=2)
    tag = eta.place(flood)  # 600 + 12 * 2 / 2
    assert tag == 612
    wait = eta.placed_wait(tag=tag, level=N, vt=0.0, ahead=60, rate=rate)
    assert wait.expected_s == pytest.approx((612 - 6) / 60)  # vt moves 60 a second
    share = eta.flow_share(level=N, tenant_weight=1, level_share=2, rate=rate)
    assert share == pytest.approx(0.5)
    trickle = eta.FlowSnapshot(N, 1, vt=0.0, last=None, counted=0, total=1, frontier=600.0)
    assert eta.place(trickle) == 6  # joining: at the other's spacing, at the head
    assert eta.placed_wait(tag=6, level=N, vt=0.0, ahead=1, rate=rate).expected_s == 0.1


def test_nothing_measured_gives_no_estimate_unless_nothing_is_ahead():
    assert eta.placed_wait(tag=6, level=N, vt=0, ahead=0, rate=eta.NO_RATE).expected_s == 0
    none = eta.placed_wait(tag=60, level=N, vt=0, ahead=3, rate=eta.NO_RATE)
    assert none.expected_s is None and none.confidence == "none"


def test_held_jobs_wait_for_their_tenants_room():
    limits = TenantLimits(max_active=2)
    reason = eta.held_reason(limits, paused=False, held_ahead=3, occupied=2)
    assert reason == "max_active"
    # 3 held before it, 2 running: it is the 4th release, 2 at a time, 1 s runs
    assert eta.held_delay_s(limits, reason=reason, held_ahead=3, occupied=2, run_s=1.0) == 2.0
    rate = TenantLimits(rate_max=10, rate_duration_ms=1000)
    assert eta.held_reason(rate, paused=False, held_ahead=5, occupied=0) == "rate"
    assert eta.held_delay_s(rate, reason="rate", held_ahead=5, occupied=0, run_s=None) == 0.5
    assert eta.held_reason(limits, paused=True, held_ahead=0, occupied=0) == "paused"
    assert eta.held_delay_s(limits, reason="paused", held_ahead=0, occupied=0, run_s=1) is None
    assert eta.held_reason(limits, paused=False, held_ahead=0, occupied=1) is None


def test_with_fairness_by_time_the_clock_moves_by_worker_time():
    """A level whose jobs run 4x the typical time moves its flows' clocks 4 turns a job:
    its pace counts worker time over the typical run time, not starts."""
    now_ms = 1_000_000_000
    current = now_ms // 1000 // 10 * 10
    buckets = [
        eta.HistoryBucket(current - 10 * b, {"normal": 50}, {"normal": 50 * 40})
        for b in range(1, 3)
    ]
    kwargs = {"now_ms": current * 1000, "since_ms": 0, "bucket_s": 10, "window_s": 20}
    by_jobs = eta.service_rate(buckets, **kwargs)
    by_time = eta.service_rate(buckets, typical_ms=10.0, by_time=True, **kwargs)
    assert by_jobs.vt_per_s == pytest.approx(12 * 5 / 2)
    assert by_time.vt_per_s == pytest.approx(4 * by_jobs.vt_per_s)
    assert by_time.jobs_per_s == by_jobs.jobs_per_s == pytest.approx(5)


def test_the_clocks_sampled_pace_counts_tags_placed_wider_than_one_turn():
    """A flood whose jobs were placed while a quiet weight-2 tenant was counted (steps of
    18, not 6) moves the virtual time 18 a job there: the samples show it, the model
    (6 a job) does not, and the tag distance is read at the sampled pace."""
    now_ms = 1_000_000_000
    current = now_ms // 1000 // 10 * 10
    # 10 jobs a second, all normal; the virtual time moved 9 a job (a mix of 6 and 18)
    buckets = [
        eta.HistoryBucket(
            current - 10 * b,
            {"normal": 90 if b == 0 else 100},  # the current bucket: 9 s so far
            {},
            vt_first=((current - 10 * b) * 1000, 900.0 * (3 - b)),
            vt_last=((current - 10 * b + 9) * 1000, 900.0 * (3 - b) + 810.0),
        )
        for b in range(3)
    ]
    rate = eta.service_rate(
        buckets, now_ms=current * 1000 + 9_000, since_ms=0, bucket_s=10, window_s=20
    )
    assert rate.vt_per_s == pytest.approx(60)  # the model: 12 * 10 / 2
    assert rate.vt_moved_per_s == pytest.approx(90)  # (2610 - 0) / 29 s
    # 90 tag units ahead of the virtual time: 10 jobs, 1 s (the model's pace: 1.5 s)
    wait = eta.placed_wait(tag=96, level=N, vt=0.0, ahead=10, rate=rate)
    assert wait.expected_s == pytest.approx(1.0)
    # samples over too short a span (under VT_SAMPLED_S): the model's pace
    short = [
        eta.HistoryBucket(
            current,
            {"normal": 90},
            {},
            vt_first=(current * 1000, 0.0),
            vt_last=(current * 1000 + 4_000, 360.0),
        )
    ]
    rate = eta.service_rate(short, now_ms=current * 1000 + 9_000, since_ms=0, bucket_s=10)
    assert rate.vt_moved_per_s == 0.0
    assert eta.placed_wait(tag=96, level=N, vt=0.0, ahead=10, rate=rate).expected_s == (
        pytest.approx(90 / rate.vt_per_s)
    )


def test_the_loop_samples_the_virtual_time_where_the_estimate_reads_it():
    """``vt_sample.lua`` keeps the clock's virtual time (as the estimate's read moves it
    to the first job waiting) in the current bucket, first and last sample; the
    estimate's read returns them with the bucket."""
    prefix = run_prefix()
    broker = SyncBroker(Broker(REDIS_URL, prefix, fairness_by="jobs"))
    reads = StatusReads(broker.broker.conn, fairness_by="jobs")
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        broker.add_jobs("q", [NewJob("x", {}, N, tenant="a")] * 5)
        while time.time() % 10 > 8:  # both samples in one 10 s bucket
            time.sleep(0.1)
        broker.run(broker.broker.history.sample_virtual_time, "q")
        client.zpopmin(f"{prefix}:q:prioritized", 2)  # two jobs taken: the clock moves 12
        broker.run(broker.broker.history.sample_virtual_time, "q")
        raw = broker.run(reads.estimate, "q", level=N, tenant="a", tenant_weight=1)
        sampled = [b for b in raw.history.buckets if b.vt_first is not None]
        assert len(sampled) == 1
        bucket = sampled[0]
        assert bucket.vt_last is not None
        assert bucket.vt_last[1] - bucket.vt_first[1] == pytest.approx(12)
        assert bucket.vt_last[1] == pytest.approx(raw.placement.flow.vt)
        assert 0 <= bucket.vt_last[0] - bucket.vt_first[0] < 5_000
        key = f"{prefix}:q:fq:hist:{bucket.start_s}"
        assert 0 < client.ttl(key) <= 3_600 + 20
    finally:
        broker.close()
        client.close()
        delete_prefix(prefix)
