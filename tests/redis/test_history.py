"""The dashboard's history: the pure math (bins, percentiles, water-filling, backlogs,
summaries) and, live, what the pass records from BullMQ's events stream while a stock
worker drains a mixed backlog."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairqueue import conf
from fairqueue.broker import Fence, get_sync_broker
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.scheduling import shares as history
from fairqueue.scheduling.shares import (
    BUCKET_S,
    WAIT_EDGES,
    Bucket,
    backlogs,
    bin_bounds,
    max_min,
    parse_bucket,
    percentile,
    summarize,
    wait_bin,
)
from tests.helpers import stock_worker_until
from tests.helpers.keys import REDIS_URL
from tests.helpers.node import run_node_worker

# Timing-sensitive (live workers, loops): `make test` runs them after the parallel part.
pytestmark = pytest.mark.serial

WEIGHTS = {"critical": 4, "high": 3, "normal": 2, "low": 1}

# -- bins and percentiles -----------------------------------------------------------------


def test_wait_bins__cover_every_wait_in_order():
    assert wait_bin(0) == 0
    assert wait_bin(1) == 1
    assert list(WAIT_EDGES) == sorted(set(WAIT_EDGES))
    for index in range(len(WAIT_EDGES) + 1):
        low, high = bin_bounds(index)
        assert wait_bin(int(low)) == index
        assert wait_bin(math.ceil(high) - 1) == index or high - low < 1
    assert WAIT_EDGES[-1] > 86_400_000  # the largest bound fits below the last edge


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=10_000_000), min_size=1, max_size=300),
    st.sampled_from([0.5, 0.9, 0.99, 1.0]),
)
def test_percentile__within_one_bin_of_the_exact_value(waits, q):
    histogram: dict[int, int] = {}
    for wait in waits:
        histogram[wait_bin(wait)] = histogram.get(wait_bin(wait), 0) + 1
    exact = sorted(waits)[max(0, math.ceil(q * len(waits)) - 1)]
    estimate = percentile(histogram, q)
    low, high = bin_bounds(wait_bin(exact))
    assert low <= estimate <= high


def test_percentile__empty_and_bad_q():
    assert percentile({}, 0.5) is None
    with pytest.raises(ValueError, match="q=0"):
        percentile({1: 1}, 0)


# -- water-filling ------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.floats(min_value=0, max_value=10_000),
    st.dictionaries(
        st.sampled_from(list(WEIGHTS)), st.floats(min_value=0, max_value=10_000), min_size=1
    ),
)
def test_max_min__fills_capacity_never_exceeds_demand_and_keeps_weights(capacity, demands):
    alloc = max_min(capacity, demands, WEIGHTS)
    assert sum(alloc.values()) == pytest.approx(min(capacity, sum(demands.values())), abs=1e-6)
    for key, share in alloc.items():
        assert -1e-9 <= share <= demands[key] + 1e-6
    # Anyone left short got at least as much per weight as everyone else.
    short = [key for key in alloc if alloc[key] < demands[key] - 1e-6]
    for key in short:
        for other in alloc:
            assert alloc[key] / WEIGHTS[key] >= alloc[other] / WEIGHTS[other] - 1e-6


def test_max_min__a_small_demand_is_met_and_the_rest_split_by_weight():
    alloc = max_min(100, {"critical": 1e9, "low": 5, "high": 1e9}, WEIGHTS)
    assert alloc["low"] == 5
    assert alloc["critical"] == pytest.approx(95 * 4 / 7)
    assert alloc["high"] == pytest.approx(95 * 3 / 7)


# -- backlogs and summaries ---------------------------------------------------------------


def test_backlogs__running_arrivals_less_services_from_the_least_consistent_start():
    buckets = [
        Bucket(0, served={"low": 5}, arrived={"low": 2}),  # 3 had waited from before
        Bucket(10, served={"low": 1}, arrived={"low": 4}),
        Bucket(20, served={"low": 3}, arrived={}),
    ]
    assert [row["low"] for row in backlogs(buckets)] == [3, 0, 3]


def test_parse_bucket__reads_the_recorders_fields_and_ignores_others():
    bucket = parse_bucket(
        30,
        {
            "s:low": "4",
            "s:?": "1",
            "a:low": "2",
            "o:low": "1",
            "w:low:7": "3",
            "r": "1",
            "g": "250",
            "junk": "x",
            "w:low:x": "1",
        },
        [("low\nacme", 4.0), ("broken", 1.0)],
    )
    assert bucket.served == {"low": 4, "?": 1}
    assert bucket.arrived == {"low": 2} and bucket.over == {"low": 1}
    assert bucket.waits == {"low": {7: 3}} and bucket.retried == 1 and bucket.gap_ms == 250
    assert bucket.tenants == {("low", "acme"): 4}


def _backlogged(start_s, served):
    return Bucket(start_s, served=served, arrived=dict(served))


def test_summarize__backlogged_levels_are_entitled_to_their_weights():
    now_ms = 1_000_000_000
    first = (now_ms // 1000 - 60) // BUCKET_S * BUCKET_S
    served = {"critical": 40, "high": 30, "normal": 20, "low": 10}
    buckets = [Bucket(first, served=served, arrived=dict.fromkeys(WEIGHTS, 1000))]
    buckets += [Bucket(first + BUCKET_S * i, served=served) for i in range(1, 6)]
    out = summarize(buckets, now_ms=now_ms, window_s=120, max_wait_ms=1000)
    for level, weight in WEIGHTS.items():
        assert out["levels"][level]["entitled_share"] == pytest.approx(weight / 10, abs=0.01)
        assert out["levels"][level]["weight_share"] == weight / 10


def test_summarize__underloaded_levels_are_entitled_to_what_they_asked():
    now_ms = 1_000_000_000
    first = (now_ms // 1000 - 60) // BUCKET_S * BUCKET_S
    buckets = [_backlogged(first + BUCKET_S * i, {level: 5 for level in WEIGHTS}) for i in range(6)]
    out = summarize(buckets, now_ms=now_ms, window_s=120, max_wait_ms=1000)
    for level in WEIGHTS:
        assert out["levels"][level]["share"] == 0.25
        assert out["levels"][level]["entitled_share"] == pytest.approx(0.25)


def test_summarize__a_starved_level_shows_its_entitlement_against_nothing_served():
    now_ms = 1_000_000_000
    first = (now_ms // 1000 - 60) // BUCKET_S * BUCKET_S
    buckets = [_backlogged(first + BUCKET_S * i, {"critical": 100}) for i in range(6)]
    # Low has 50 jobs waiting since the first bucket and none started.
    out = summarize(
        buckets,
        now_ms=now_ms,
        window_s=120,
        max_wait_ms=1000,
        waiting_now={"low": (50, first * 1000 + 1)},
    )
    assert out["levels"]["low"]["share"] == 0
    # Backlogged in every bucket: 1 / (4 + 1) of each bucket's service, all along.
    assert out["levels"]["low"]["entitled_share"] == pytest.approx(0.2)
    assert out["levels"]["critical"]["entitled_share"] == pytest.approx(0.8)


def test_summarize__window_waits_tenants_and_gaps():
    now_ms = 1_000_000_000
    last = now_ms // 1000 // BUCKET_S * BUCKET_S
    old = Bucket(last - 600, served={"low": 99}, arrived={"low": 99})
    recent = Bucket(
        last,
        served={"low": 10, "?": 2},
        arrived={"low": 10},
        waits={"low": {wait_bin(5): 9, wait_bin(5000): 1}},
        over={"low": 1},
        gap_ms=500,
        tenants={("low", "acme"): 7, ("low", "beta"): 3},
    )
    out = summarize([old, recent], now_ms=now_ms, window_s=60, max_wait_ms=1000, top_tenants=1)
    low = out["levels"]["low"]
    assert low["served"] == 10 and out["unknown"] == 2 and out["served_total"] == 12
    assert low["over_bound"] == 1
    assert bin_bounds(wait_bin(5))[0] <= low["p50_ms"] <= bin_bounds(wait_bin(5))[1]
    assert bin_bounds(wait_bin(5000))[0] <= low["p99_ms"] <= bin_bounds(wait_bin(5000))[1]
    assert out["tenants"] == [{"level": "low", "tenant": "acme", "served": 7, "share": 7 / 12}]
    assert out["gap_ms"] == 500 and out["coverage"] == pytest.approx(1 - 500 / 60_000)
    assert [row["start_s"] for row in out["series"]] == [last]


# -- live: a stock worker drains while passes record ----------------------------------------


async def _work(prefix, queue, count, seen, stop):
    async def take(job):
        seen.append((job.id, job.data, job.timestamp, job.processedOn))
        await asyncio.sleep(0.003)  # a drain of about a second: passes run meanwhile

    try:
        await stock_worker_until(prefix, queue, take, count)
    finally:
        stop.set()


def _passes(stop, results):
    while not stop.is_set():
        results.append(rebalance_queue("email", rebalancer="history-test"))
        time.sleep(0.1)


def _recorded(now_ms, max_wait_ms=300_000, waiting_now=None):
    sync = get_sync_broker()
    raw = sync.run(sync.broker.history.read_history, "email", now_s=now_ms // 1000)
    buckets = [
        parse_bucket(start, fields, tenants) for start, (fields, tenants) in raw.buckets.items()
    ]
    return summarize(
        buckets,
        now_ms=now_ms,
        window_s=600,
        max_wait_ms=max_wait_ms,
        waiting_now=waiting_now,
        top_tenants=20,
    )


@pytest.mark.django_db
def test_live__history_matches_what_a_stock_worker_took_and_waited(
    fq_prefix, redis_client, settings
):
    # Fairness by jobs: the levels' shares checked are of jobs, and a 3 ms job's worker
    # time, to the millisecond of Redis's clock on a loaded machine, is mostly noise.
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "FAIRNESS_BY": "jobs"}
    conf.reload_settings()
    history_keys_before = redis_client.keys(f"{fq_prefix}:email:fq:hist*")
    assert history_keys_before == []
    tenants = {
        "critical": ["c0", "c1"],
        "high": ["h0"],
        "normal": ["n0", "n1", "n2"],
        "low": ["l0"],
    }
    for i in range(120):
        for level, names in tenants.items():
            enqueue_jobs("email", [{"i": i}], tenant_id=names[i % len(names)], priority_level=level)
    rebalance_queue("email", rebalancer="history-test")  # history starts here
    served_n = 300
    seen: list = []
    stop = threading.Event()
    results: list = []
    passes = threading.Thread(target=_passes, args=(stop, results))
    passes.start()
    try:
        asyncio.run(_work(fq_prefix, "email", served_n, seen, stop))
    finally:
        stop.set()
        passes.join(30)
    rebalance_queue("email", rebalancer="history-test")
    assert len(results) >= 2  # passes ran while the worker drained

    now_ms = int(time.time() * 1000)
    left = {
        level: 120 - sum(1 for _, data, _, _ in seen if data["priorityLevel"] == level)
        for level in tenants
    }
    out = _recorded(now_ms, waiting_now={level: (n, now_ms - 5_000) for level, n in left.items()})

    # Every start the worker made is recorded once, at its level and tenant.
    started = len(seen) + redis_client.llen(f"{fq_prefix}:email:active")
    assert out["served_total"] == started and out["unknown"] == 0 and out["gap_ms"] == 0
    measured = {level: 0 for level in tenants}
    by_tenant: dict = {}
    for _, data, _, _ in seen:
        measured[data["priorityLevel"]] += 1
        key = (data["priorityLevel"], data["tenantId"])
        by_tenant[key] = by_tenant.get(key, 0) + 1
    for level in tenants:
        assert out["levels"][level]["served"] >= measured[level]
        assert out["levels"][level]["served"] <= measured[level] + 1  # one may be active
        share = out["levels"][level]["share"]
        assert share == pytest.approx(measured[level] / len(seen), abs=0.01)
        # Every level stayed backlogged: served 4:3:2:1, as entitled.
        assert out["levels"][level]["entitled_share"] == pytest.approx(
            WEIGHTS[level] / 10, abs=0.03
        )
        assert share == pytest.approx(out["levels"][level]["entitled_share"], abs=0.03)
    for row in out["tenants"]:
        assert (
            by_tenant[(row["level"], row["tenant"])]
            <= row["served"]
            <= by_tenant[(row["level"], row["tenant"])] + 1
        )

    # Waits: the recorded p50/p99 per level are within a bin (19%) and a few ms (the
    # worker's clock stamps processedOn, Redis's the event) of the measured ones.
    for level in tenants:
        waits = sorted(p - t for _, data, t, p in seen if data["priorityLevel"] == level)
        for q, key in ((0.5, "p50_ms"), (0.99, "p99_ms")):
            exact = waits[max(0, math.ceil(q * len(waits)) - 1)]
            assert out["levels"][level][key] == pytest.approx(exact, rel=0.2, abs=25)
        assert out["levels"][level]["over_bound"] == 0

    # A bound shorter than the waits: every recorded wait over it counts.
    assert sum(out["levels"][level]["waits_recorded"] for level in tenants) == started

    # Bounded: only fq:hist keys with a TTL were added.
    for key in redis_client.keys(f"{fq_prefix}:email:fq:hist:*"):
        assert 0 < redis_client.ttl(key) <= history.RETENTION_S + 2 * BUCKET_S


@pytest.mark.django_db
def test_live__removed_hashes_count_unknown_and_a_trimmed_stream_is_a_gap(fq_prefix, redis_client):
    enqueue_jobs("email", [{"i": i} for i in range(6)], tenant_id="acme", priority_level="high")
    rebalance_queue("email", rebalancer="history-test")  # the cursor now exists
    seen: list = []
    asyncio.run(_work(fq_prefix, "email", 6, seen, threading.Event()))
    # Retention removed two finished jobs before the pass read them.
    for job_id, *_ in seen[:2]:
        redis_client.delete(f"{fq_prefix}:email:{job_id}")
    result = rebalance_queue("email", rebalancer="history-test")
    assert (result.recorded, result.unrecorded, result.history_gap_ms) == (4, 2, 0)

    # More jobs, then BullMQ's cap trims the stream past the cursor before the next pass.
    enqueue_jobs("email", [{"i": i} for i in range(5)], tenant_id="acme", priority_level="low")
    more: list = []
    asyncio.run(_work(fq_prefix, "email", 5, more, threading.Event()))
    time.sleep(0.02)
    redis_client.xtrim(f"{fq_prefix}:email:events", maxlen=1, approximate=False)
    result = rebalance_queue("email", rebalancer="history-test")
    assert result.history_gap_ms > 0 and result.recorded == 0
    out = _recorded(int(time.time() * 1000))
    assert out["unknown"] == 2 and out["levels"]["high"]["served"] == 4
    assert out["gap_ms"] == result.history_gap_ms

    # A dry run records nothing; nor does a pass whose lock another rebalancer holds.
    assert rebalance_queue("email", dry_run=True).recorded == 0


@pytest.mark.django_db
def test_live__level_and_tenant_read_as_text_or_decoded_agree(fq_prefix, redis_client):
    """fairqueue's own jobs are read from the text of their data and opts; a tenant with
    an escape, a foreign job with its keys in another order and one without fqReady are
    decoded: every one is recorded at its level and tenant, with a wait."""
    from bullmq import Queue

    enqueue_jobs("email", [{"i": 1}], tenant_id="plain", priority_level="high")
    enqueue_jobs("email", [{"i": 2}], tenant_id='quo"te-\u00e9', priority_level="low")

    async def add_foreign():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        await queue.add("email", {"i": 3, "tenantId": "foreign", "priorityLevel": "critical"})
        await queue.add("email", {"priorityLevel": "normal", "tenantId": "nofq", "i": 4})
        await queue.close()

    rebalance_queue("email", rebalancer="history-test")  # the cursor now exists
    asyncio.run(add_foreign())
    seen: list = []
    asyncio.run(_work(fq_prefix, "email", 4, seen, threading.Event()))
    result = rebalance_queue("email", rebalancer="history-test")
    assert (result.recorded, result.unrecorded) == (4, 0)
    out = _recorded(int(time.time() * 1000))
    tenants = {(row["level"], row["tenant"]): row["served"] for row in out["tenants"]}
    assert tenants == {
        ("high", "plain"): 1,
        ("low", 'quo"te-\u00e9'): 1,
        ("critical", "foreign"): 1,
        ("normal", "nofq"): 1,
    }
    assert sum(out["levels"][level]["waits_recorded"] for level in WEIGHTS) == 4


@pytest.mark.django_db
def test_live__a_stock_node_worker_is_recorded_too(node_worker, fq_prefix, redis_client):  # noqa: F811
    rebalance_queue("email", rebalancer="history-test")  # history starts here
    enqueue_jobs("email", [{} for _ in range(16)], tenant_id="acme", priority_level="critical")
    enqueue_jobs("email", [{} for _ in range(8)], tenant_id="free", priority_level="low")
    processed = run_node_worker(node_worker, fq_prefix, 24)
    rebalance_queue("email", rebalancer="history-test")
    out = _recorded(int(time.time() * 1000))
    assert out["served_total"] == 24 and out["unknown"] == 0
    assert out["levels"]["critical"]["served"] == 16 and out["levels"]["low"]["served"] == 8
    assert {(row["level"], row["tenant"], row["served"]) for row in out["tenants"]} == {
        ("critical", "acme", 16),
        ("low", "free", 8),
    }
    # The Node worker's own processedOn - timestamp, against the recorded p99.
    waits = sorted(
        int(redis_client.hget(f"{fq_prefix}:email:{job_id}", "processedOn"))
        - int(redis_client.hget(f"{fq_prefix}:email:{job_id}", "timestamp"))
        for job_id in processed
        if redis_client.hget(f"{fq_prefix}:email:{job_id}", "data").find("low") >= 0
    )
    assert out["levels"]["low"]["p99_ms"] == pytest.approx(waits[-1], rel=0.2, abs=25)


async def _fail_once(prefix, queue, count, attempts_seen):

    def process(job):
        attempts_seen.append(job.id)
        if job.attemptsMade == 0:
            raise RuntimeError("first attempt fails")

    await stock_worker_until(prefix, queue, process, count, 30)


@pytest.mark.django_db
def test_live__a_retried_job_counts_as_started_each_time_without_a_wait(fq_prefix):
    rebalance_queue("email", rebalancer="history-test")
    enqueue_jobs("email", [{"i": 1}], tenant_id="acme", priority_level="normal", attempts=2)
    seen: list = []
    asyncio.run(_fail_once(fq_prefix, "email", 2, seen))
    assert len(seen) == 2  # the same job, twice
    result = rebalance_queue("email", rebalancer="history-test")
    assert result.recorded == 2
    out = _recorded(int(time.time() * 1000))
    # Both starts count. The job had two attempts by the time the pass read it, and its
    # timestamp is its first add's, so neither start has a wait (rather than a wrong one).
    assert out["levels"]["normal"]["served"] == 2 and out["retried"] == 2
    assert out["levels"]["normal"]["waits_recorded"] == 0


@pytest.mark.django_db
def test_live__only_the_lock_holder_records(fq_prefix, redis_client):
    from fairqueue.broker import LockLostError

    rebalance_queue("email", rebalancer="history-test")
    redis_client.set(f"{fq_prefix}:email:fq:leader", "someone-else", px=10_000)
    broker = get_sync_broker()
    with pytest.raises(LockLostError):
        broker.run(
            broker.broker.history.record_history_page,
            "email",
            fence=Fence(f"{fq_prefix}:email:fq:leader", "me", 1_000),
            max_wait_ms=1_000,
        )
    assert rebalance_queue("email", rebalancer="me").recorded == 0


@pytest.mark.django_db(transaction=True)
def test_live__the_loop_records_between_passes(fq_prefix, redis_client):
    """``rebalance_fair`` records the history every second between its passes, so a
    long interval does not let BullMQ trim the events before they are read."""
    import json

    from tests.helpers import drain_with_stock_worker, wait_until
    from tests.helpers.processes import spawn, stop

    loop = spawn(["rebalance_fair", "--queue", "email", "--interval-ms", "8000"], fq_prefix)
    try:
        status = f"{fq_prefix}:email:fq:last_pass"
        assert wait_until(lambda: redis_client.exists(status), timeout_s=20)
        first_pass = json.loads(redis_client.get(status))["at_ms"]
        enqueue_jobs("email", [{"i": i} for i in range(10)], tenant_id="acme")
        drain_with_stock_worker(fq_prefix, "email", 10)
        assert wait_until(
            lambda: _recorded(int(time.time() * 1000))["served_total"] == 10, timeout_s=5
        )
        # Recorded before the next pass ran.
        assert json.loads(redis_client.get(status))["at_ms"] == first_pass
    finally:
        assert stop(loop) == 0, loop.stdout.read()
