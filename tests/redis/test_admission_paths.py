"""Admission with ``max_wait_ms`` counts everything that will run ahead of a job, so
every way in gives the same answer for the same state: a flow flooding through single
enqueues, batches, delayed enqueues (``delay_ms``), ``enqueue_on_commit`` in one
transaction, ``aenqueue_job`` or the tasks backend is refused once its jobs ahead would
make it wait too long, and a flow within its share beside it is never refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from django.db import transaction
from django.test import override_settings

from fairqueue import ExpectedWaitTooLongError, enqueue_job, enqueue_jobs, estimate_start
from fairqueue.enqueue.api import aenqueue_job, enqueue_on_commit
from fairqueue.rebalance.passes import rebalance_queue
from tests.helpers import drain_with_stock_worker

pytestmark = pytest.mark.django_db(transaction=True)

#: Jobs each path sends: three times what the bound admits (an overload of 3x).
ADMITS = 10
SENT = 3 * ADMITS
#: The delayed path's delay: longer than the test, so nothing it adds is promoted.
DELAY_MS = 120_000

try:  # Django 6: its own django.tasks; Django 5.2: the django-tasks backport
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task()
def admission_task(tenant_id: str | None = None) -> int:
    return 1


def _expected_admitted(bound: int, delay_ms: int | None = None) -> int:
    """How many jobs a fresh flow gets admitted under ``bound`` now, one at a time: the
    first whose admission wait (as the ``count``-th of the flow) passes the bound."""
    for count in range(1, SENT + 1):
        wait = estimate_start(
            "email", tenant_id="fresh", priority_level="normal", delay_ms=delay_ms, count=count
        ).admission_wait_ms
        if wait is not None and wait > bound:
            return count - 1
    return SENT


def _admitted(send: Callable[[], int], times: int) -> int:
    """Jobs admitted over ``times`` calls of ``send`` (each returns the jobs it sent)."""
    admitted = 0
    for _ in range(times):
        try:
            admitted += send()
        except ExpectedWaitTooLongError:
            pass
    return admitted


def _path_sends() -> dict[str, tuple[Callable[[str, int], Callable[[], int]], int]]:
    """Per path: a sender of one call for a tenant under a bound, and the calls that
    make SENT jobs."""

    def single(tenant: str, bound: int) -> Callable[[], int]:
        options = {"priority_level": "normal", "max_wait_ms": bound}
        return lambda: bool(enqueue_job("email", {}, tenant_id=tenant, **options))

    def batch(tenant: str, bound: int) -> Callable[[], int]:
        options = {"priority_level": "normal", "max_wait_ms": bound}
        return lambda: len(enqueue_jobs("email", [{}] * 3, tenant_id=tenant, **options))

    def delayed(tenant: str, bound: int) -> Callable[[], int]:
        options = {"priority_level": "normal", "max_wait_ms": bound, "delay_ms": DELAY_MS}
        return lambda: bool(enqueue_job("email", {}, tenant_id=tenant, **options))

    def on_commit(tenant: str, bound: int) -> Callable[[], int]:
        options = {"priority_level": "normal", "max_wait_ms": bound}
        return lambda: bool(enqueue_on_commit("email", {}, tenant_id=tenant, **options))

    def in_async(tenant: str, bound: int) -> Callable[[], int]:
        options = {"priority_level": "normal", "max_wait_ms": bound}
        return lambda: bool(asyncio.run(aenqueue_job("email", {}, tenant_id=tenant, **options)))

    def tasks_backend(tenant: str, bound: int) -> Callable[[], int]:
        return lambda: bool(admission_task.using(priority=0).enqueue(tenant_id=tenant))

    return {
        "single": (single, SENT),
        "batch": (batch, SENT // 3),
        "delay_ms": (delayed, SENT),
        "enqueue_on_commit": (on_commit, SENT),
        "aenqueue_job": (in_async, SENT),
        "tasks backend": (tasks_backend, SENT),
    }


def _measure_pace(prefix: str, redis_client) -> None:
    """Let what waits run and measure the pace afresh, as the loop's history step does
    (each path starts from the same state, with a pace measured just before)."""
    rebalance_queue("email", rebalancer="admission-test")  # the history's cursor
    enqueue_jobs("email", [{}] * 40, tenant_id="warm", priority_level="normal")
    drain_with_stock_worker(prefix, "email", redis_client.zcard(f"{prefix}:email:prioritized"))
    rebalance_queue("email", rebalancer="admission-test")
    # the previous path's admitted jobs carried their expected start and waited for the
    # whole of its test: their bins measure the test's pauses, not estimates
    for key in redis_client.scan_iter(f"{prefix}:email:fq:hist:*"):
        if redis_client.type(key) in (b"hash", "hash"):
            names = [f if isinstance(f, str) else f.decode() for f in redis_client.hkeys(key)]
            bins = [name for name in names if name.startswith("e:")]
            if bins:
                redis_client.hdel(key, *bins)


def test_every_path_refuses_a_flood_alike_and_never_a_flow_within_its_share(
    fq_prefix, redis_client
):
    backend = "fairqueue.tasks.backend.FairQueueBackend"
    admitted, expected = {}, {}
    for name, (sender, calls) in _path_sends().items():
        _measure_pace(fq_prefix, redis_client)
        delay = DELAY_MS if name == "delay_ms" else None
        # the bound: where a fresh flow's ADMITS-th job is expected to start (a delayed
        # one's, with its delay)
        bound = estimate_start(
            "email", tenant_id="fresh", priority_level="normal", count=ADMITS, delay_ms=delay
        ).expected_wait_ms
        assert bound is not None and bound > 0
        expected[name] = _expected_admitted(bound, delay)
        options = {"JOB_TYPES": {"default": "email"}, "MAX_WAIT_MS": bound}
        with override_settings(TASKS={"default": {"BACKEND": backend, "OPTIONS": options}}):
            with transaction.atomic():  # the outbox rows stay unrelayed until its end
                admitted[name] = _admitted(sender(f"flood-{name}", bound), calls)
                # a flow within its share beside the flood: its one job is admitted
                assert _admitted(sender(f"calm-{name}", bound), 1) > 0, name
    for name, count in admitted.items():
        # the same answer as the estimate of the same state (a batch: whole batches)
        slack = 3 if name == "batch" else 2
        assert abs(count - expected[name]) <= slack, (name, admitted, expected)
        assert count < SENT // 2, (name, admitted)  # refused in overload


def test_a_delayed_job_is_estimated_behind_its_flows_delayed_jobs_due_before_it(
    fq_prefix, redis_client
):
    """Its flow's delayed jobs not placed yet (fq:dly:<level>:<tenant>, by ready time)
    count ahead of a delayed job due after them, not of one due before them; the pass
    drops each from the index as it places it."""
    import time

    from bullmq import Queue

    from tests.helpers.keys import REDIS_URL

    index = f"{fq_prefix}:email:fq:dly:normal:t"
    soon = [
        enqueue_job("email", {}, tenant_id="t", priority_level="normal", delay_ms=2_000)
        for _ in range(4)
    ]
    later = enqueue_job("email", {}, tenant_id="t", priority_level="normal", delay_ms=DELAY_MS)
    assert redis_client.zrange(index, 0, -1) == [job.job_id for job in soon] + [later.job_id]
    assert 0 < redis_client.pttl(index) <= DELAY_MS + 300_000
    after_them = estimate_start("email", tenant_id="t", priority_level="normal", delay_ms=9_000)
    before_them = estimate_start("email", tenant_id="t", priority_level="normal", delay_ms=1)
    assert after_them.ahead == 4 and before_them.ahead == 0
    time.sleep(2.1)

    async def promote():  # as a worker's look at the delayed set would
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        await queue.promoteJobs()
        await queue.close()

    asyncio.run(promote())  # promoteJobs promotes every delayed job, due or not
    assert rebalance_queue("email").adopted == 5
    assert not redis_client.exists(index)  # placed: counted as waiting, not twice
    assert (
        estimate_start("email", tenant_id="t", priority_level="normal", delay_ms=9_000).ahead == 5
    )


def test_a_delayed_job_a_worker_took_before_any_pass_placed_it_no_longer_counts(
    fq_prefix, redis_client
):
    """On an idle queue a worker takes a promoted delayed job from the cap at once, before
    any pass places it (and drops it from its flow's index): it ran, so it is not ahead of
    the flow's next delayed job, and a flow whose jobs all ran is never refused for them.
    One still promoted and unplaced counts."""
    import time

    from bullmq import Queue

    from tests.helpers.keys import REDIS_URL

    index = f"{fq_prefix}:email:fq:dly:normal:t"
    ran = [
        enqueue_job("email", {}, tenant_id="t", priority_level="normal", delay_ms=50).job_id
        for _ in range(3)
    ]
    time.sleep(0.1)

    async def promote():  # as a worker's look at the delayed set would
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        await queue.promoteJobs()
        await queue.close()

    asyncio.run(promote())
    assert [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 3)] == ran
    assert redis_client.zcard(index) == 3  # no pass ran: the index still has them
    after = estimate_start("email", tenant_id="t", priority_level="normal", delay_ms=9_000)
    assert after.ahead == 0
    parked = enqueue_job("email", {}, tenant_id="t", priority_level="normal", delay_ms=50)
    time.sleep(0.1)
    asyncio.run(promote())  # at the cap, not placed yet: still ahead
    assert redis_client.zscore(index, parked.job_id) is not None
    after = estimate_start("email", tenant_id="t", priority_level="normal", delay_ms=9_000)
    assert after.ahead == 1


def test_a_long_pending_backlog_is_carried_on_at_its_flows_pace(fq_prefix):
    """Past the jobs an estimate places one by one, the flow's tags go on evenly spaced:
    a flow with 300 delayed jobs due before the job gets the tag and place of the 301st
    job of a flow placed one by one, in the same state (a level with another's backlog)."""
    enqueue_jobs("email", [{}] * 50, tenant_id="other", priority_level="normal")
    for _ in range(300):
        enqueue_job("email", {}, tenant_id="pending", priority_level="normal", delay_ms=1_000)
    carried = estimate_start("email", tenant_id="pending", priority_level="normal", delay_ms=5_000)
    placed = estimate_start("email", tenant_id="fresh", priority_level="normal", count=301)
    assert carried.ahead == placed.ahead
    assert carried.tag == pytest.approx(placed.tag, rel=1e-9)


@pytest.mark.parametrize("late", [False, True])
def test_admission_holds_the_late_end_of_recent_estimates_to_the_bound(
    fq_prefix, redis_client, late
):
    """Admitting on the expected wait keeps the jobs whose estimates came out low (those
    estimated late are refused), so the admitted ones wait past the bound by the
    estimates' spread. When one in five of the level's recent estimates started 1.4x
    late, a job expected just within the bound is refused; with close ones, admitted."""
    from fairqueue.scheduling.calibration import error_bin
    from tests.helpers.jobs import write_history

    bins = {error_bin(1000, 1000): 32, error_bin(1400 if late else 1000, 1000): 8}
    write_history(redis_client, fq_prefix, {("normal", "a"): 10.0}, bins={"normal": bins})
    enqueue_jobs("email", [{}] * 20, tenant_id="a", priority_level="normal")
    est = estimate_start("email", tenant_id="a", priority_level="normal")
    assert est.expected_wait_ms is not None and est.admission_wait_ms is not None
    bound = est.expected_wait_ms + 50
    if late:  # the late end (1.5x), stretched by the bound's tolerance: 1.25x
        assert est.admission_wait_ms >= 1.2 * est.expected_wait_ms
        with pytest.raises(ExpectedWaitTooLongError) as refused:
            enqueue_job("email", {}, tenant_id="a", priority_level="normal", max_wait_ms=bound)
        assert refused.value.admission_wait_ms > bound >= refused.value.expected_wait_ms
    else:
        assert est.admission_wait_ms <= bound
        job = enqueue_job("email", {}, tenant_id="a", priority_level="normal", max_wait_ms=bound)
        # admitted without estimate=True, its expected start still rides on it: how it
        # comes out calibrates later admissions
        opts = json.loads(redis_client.hget(f"{fq_prefix}:email:{job.job_id}", "opts"))
        assert abs(opts["fqEta"] - est.expected_start_ms) < 2_000 and job.estimate is None
