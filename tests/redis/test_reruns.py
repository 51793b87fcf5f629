"""Every attempt takes a fair turn (docs/design.md, "Every attempt is a turn"): a job
that runs again is placed by the fair clock like a new arrival of its flow, never at the
front, and keeps its first ready time and its one index entry."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from bullmq import Queue

from fairqueue import InvalidJobOptionError, enqueue_job, enqueue_jobs
from fairqueue.broker import MAX_PRIORITY, TAG_FLOOR
from fairqueue.rebalance.passes import rebalance_queue
from tests.helpers import wait_until
from tests.helpers.jobs import index_ids
from tests.helpers.keys import REDIS_URL
from tests.helpers.usage import take_jobs_failing_first

# Timing-sensitive (live workers, loops): `make test` runs them after the parallel part.
pytestmark = [pytest.mark.django_db, pytest.mark.serial]

SCORE_BASE = 1 << 32


def _enqueue_two_tenants(per_tenant: int, **options) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {"a": [], "b": []}
    for _ in range(per_tenant):
        for tenant in ids:
            ids[tenant].append(enqueue_job("email", {}, tenant_id=tenant, **options).job_id)
    return ids


def _rank(redis_client, prefix: str, job_id: str) -> int | None:
    return redis_client.zrank(f"{prefix}:email:prioritized", job_id)


def _score(redis_client, prefix: str, job_id: str) -> float:
    return redis_client.zscore(f"{prefix}:email:prioritized", job_id)


def _assert_one_index_entry_per_waiting_job(redis_client, prefix: str, *, walked=True) -> None:
    """Each waiting job has one entry in the ready-time index; ``walked``: a pass's walk
    ran since jobs left, so no entry of a job gone is left either."""
    indexed = [job_id for ids in index_ids(redis_client, prefix).values() for job_id in ids]
    waiting = redis_client.zrange(f"{prefix}:email:prioritized", 0, -1)
    assert len(indexed) == len(set(indexed)) and set(waiting) <= set(indexed)
    if walked:
        assert sorted(indexed) == sorted(waiting)


def test_a_retry_does_not_jump_the_queue(fq_prefix, redis_client):
    ids = _enqueue_two_tenants(5, attempts=2)
    first = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, 0)[0]
    taken = asyncio.run(take_jobs_failing_first(fq_prefix, 2, fail={first}))
    # BullMQ re-added the failed job at the priority in its hash: the back of the line,
    # not the front (where it would run next, ahead of every other flow's turn).
    assert taken[0] == first and taken[1] != first
    assert _rank(redis_client, fq_prefix, first) == 8  # the last of 9 waiting
    assert int(redis_client.hget(f"{fq_prefix}:email:{first}", "priority")) == MAX_PRIORITY

    result = rebalance_queue("email", rebalancer="reruns-test")
    assert result.adopted == 1
    # Placed by the fair clock, like a new arrival of its flow: behind its own tenant's
    # line, in the tag band, its hash still at the cap for the next re-add.
    flow = "a" if first in ids["a"] else "b"
    own = [_rank(redis_client, fq_prefix, job_id) for job_id in ids[flow] if job_id != first]
    score = _score(redis_client, fq_prefix, first)
    assert TAG_FLOOR * SCORE_BASE <= score < MAX_PRIORITY * SCORE_BASE
    assert _rank(redis_client, fq_prefix, first) > max(r for r in own if r is not None)
    assert int(redis_client.hget(f"{fq_prefix}:email:{first}", "priority")) == MAX_PRIORITY
    _assert_one_index_entry_per_waiting_job(redis_client, fq_prefix)


def test_a_retry_keeps_its_first_ready_time(fq_prefix, redis_client, settings):
    """The wait bound counts from the job's first ready time: a retry of a job that has
    waited past the bound is counted as aged and goes to the front of its own flow's
    line, in the place of its flow's first waiting job, which takes the turn at the back
    its flow was charged; no other flow's job moves."""
    from fairqueue import conf

    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "MAX_WAIT_MS": 1_500}
    conf.reload_settings()
    ids = _enqueue_two_tenants(3, attempts=2)
    first = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, 0)[0]
    flow = "a" if first in ids["a"] else "b"
    other = "b" if flow == "a" else "a"
    time.sleep(1.6)  # its first wait passes the bound; its re-add, just now, does not
    asyncio.run(take_jobs_failing_first(fq_prefix, 2, fail={first}))
    before = {job_id: _score(redis_client, fq_prefix, job_id) for job_id in ids[flow] + ids[other]}
    # a job of its flow added now: younger than the retry, so behind it in its line
    later = enqueue_job("email", {}, tenant_id=flow).job_id
    later_score = _score(redis_client, fq_prefix, later)
    result = rebalance_queue("email", rebalancer="reruns-test")
    assert (result.adopted, result.aged) == (1, 1)
    own = [j for j in ids[flow] if j != first and before.get(j) is not None]
    own_before = sorted(before[j] for j in own) + [later_score]
    own_after = sorted(_score(redis_client, fq_prefix, j) for j in [*own, later, first])
    # its flow holds the turns it held plus one at the back, the retry in the first
    assert own_after[:-1] == own_before
    assert _score(redis_client, fq_prefix, first) == own_before[0]
    assert all(_score(redis_client, fq_prefix, j) == before[j] for j in ids[other] if before[j])
    _assert_one_index_entry_per_waiting_job(redis_client, fq_prefix)


def test_retried_failed_jobs_have_one_index_entry_each(fq_prefix, redis_client):
    _enqueue_two_tenants(4, attempts=1)
    every = set(redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1))
    asyncio.run(take_jobs_failing_first(fq_prefix, 8, fail=every))
    assert redis_client.zcard(f"{fq_prefix}:email:failed") == 8

    async def retry_failed() -> None:
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        await queue.retryJobs({"state": "failed"})
        await queue.close()

    asyncio.run(retry_failed())
    rebalance_queue("email", rebalancer="reruns-test")
    assert set(redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)) == every
    _assert_one_index_entry_per_waiting_job(redis_client, fq_prefix)
    # ...and the pass's walk, run to the end, counts each of them once.
    result = rebalance_queue("email", rebalancer="reruns-test")
    assert result.adopted == 0
    _assert_one_index_entry_per_waiting_job(redis_client, fq_prefix)


# -- backoff ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "stored"),
    [
        (250, {"type": "fixed", "delay": 250}),
        ({"type": "exponential", "delay": 100}, {"type": "exponential", "delay": 100}),
        ({"type": "fixed", "delay": 0}, {"type": "fixed", "delay": 0}),
    ],
)
def test_backoff_reaches_bullmq_opts(
    fq_prefix, redis_client, django_capture_on_commit_callbacks, backoff, stored
):
    single = enqueue_job("email", {}, tenant_id="a", attempts=3, backoff=backoff)
    batch = enqueue_jobs("email", [{}, {}], tenant_id="b", attempts=3, backoff=backoff)
    with django_capture_on_commit_callbacks(execute=True):  # the relay runs after commit
        durable = enqueue_job("email", {}, tenant_id="c", attempts=3, backoff=backoff, durable=True)
    for job in (single, *batch, durable):
        opts = json.loads(redis_client.hget(f"{fq_prefix}:email:{job.job_id}", "opts"))
        assert opts["backoff"] == stored and opts["attempts"] == 3


@pytest.mark.parametrize(
    "backoff",
    [
        -1,
        True,
        1.5,
        "fixed",
        {"type": "linear", "delay": 10},
        {"type": "fixed"},
        {"type": "fixed", "delay": -5},
        {"type": "fixed", "delay": 10, "jitter": 0.5},
    ],
)
def test_a_bad_backoff_is_refused_by_name(fq_prefix, redis_client, backoff):
    with pytest.raises(InvalidJobOptionError, match=r"^backoff=.* is not allowed: expected None"):
        enqueue_job("email", {}, tenant_id="a", attempts=3, backoff=backoff)
    assert redis_client.zcard(f"{fq_prefix}:email:prioritized") == 0


def test_a_retry_after_backoff_does_not_jump_the_queue(fq_prefix, redis_client):
    ids = _enqueue_two_tenants(5, attempts=2, backoff={"type": "fixed", "delay": 50})
    first = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, 0)[0]
    taken = asyncio.run(take_jobs_failing_first(fq_prefix, 2, fail={first}))
    assert redis_client.zscore(f"{fq_prefix}:email:delayed", first) is not None
    time.sleep(0.1)  # the backoff is over: the next worker's fetch promotes the retry...
    taken += asyncio.run(take_jobs_failing_first(fq_prefix, 1, fail=set()))
    # ...at the priority in its hash: the back, not the front.
    assert taken[0] == first and first not in taken[1:]
    assert (
        _rank(redis_client, fq_prefix, first)
        == redis_client.zcard(f"{fq_prefix}:email:prioritized") - 1
    )
    rebalance_queue("email", rebalancer="reruns-test")
    flow = "a" if first in ids["a"] else "b"
    own = [_rank(redis_client, fq_prefix, job_id) for job_id in ids[flow] if job_id != first]
    assert _rank(redis_client, fq_prefix, first) > max(r for r in own if r is not None)
    _assert_one_index_entry_per_waiting_job(redis_client, fq_prefix)


# -- stalled jobs -------------------------------------------------------------------------

#: A stock Python worker that takes one job, says so, and hangs in it (then is killed).
HANGING_WORKER = """
import asyncio, sys
from bullmq import Worker

async def main(url, prefix):
    taken = asyncio.Event()
    async def process(job, token):
        print(job.id, flush=True)
        await asyncio.sleep(3600)
    worker = Worker("email", process, {"connection": url, "prefix": prefix,
                    "concurrency": 1, "lockDuration": 1000, "autorun": False})
    await worker.run()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _kill_a_worker_mid_job(prefix: str) -> str:
    worker = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", HANGING_WORKER, REDIS_URL, prefix],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        job_id = worker.stdout.readline().strip()
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
    return job_id


def test_a_stalled_job_is_recovered_in_its_flows_turn_exactly_once(fq_prefix, redis_client):
    ids = _enqueue_two_tenants(5)
    stalled = _kill_a_worker_mid_job(fq_prefix)
    assert redis_client.lrange(f"{fq_prefix}:email:active", 0, -1) == [stalled]
    passes = []

    def recovered() -> bool:
        passes.append(rebalance_queue("email", rebalancer="reruns-test"))
        return passes[-1].recovered > 0

    # The pass's first check marks the job; once its lock (1 s) has expired, the next
    # recovers it.
    assert wait_until(recovered, timeout_s=15, interval_s=0.2)
    assert sum(result.recovered for result in passes) == 1
    assert redis_client.llen(f"{fq_prefix}:email:active") == 0
    assert redis_client.llen(f"{fq_prefix}:email:wait") == 0
    # Placed like a new arrival of its flow: not at the front where BullMQ puts it.
    flow = "a" if stalled in ids["a"] else "b"
    own = [_rank(redis_client, fq_prefix, job_id) for job_id in ids[flow] if job_id != stalled]
    assert _rank(redis_client, fq_prefix, stalled) > max(r for r in own if r is not None)
    assert int(redis_client.hget(f"{fq_prefix}:email:{stalled}", "stc")) == 1
    _assert_one_index_entry_per_waiting_job(redis_client, fq_prefix)
    # ...and it runs exactly once more, with every other job.
    taken = asyncio.run(take_jobs_failing_first(fq_prefix, 10, fail=set()))
    assert sorted(taken) == sorted(ids["a"] + ids["b"])


def test_the_loop_places_a_retry_within_a_tick(fq_prefix, redis_client, transactional_db):
    """Between two passes (a long interval here) the loop's tick adopts a job that runs
    again, so it waits for its fair place a tick (HISTORY_EVERY_MS), not an interval."""
    from fairqueue.rebalance.rebalancer import HISTORY_EVERY_MS, Rebalancer

    _enqueue_two_tenants(5, attempts=2)
    first = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, 0)[0]
    rebalancer = Rebalancer(["email"], interval_ms=60_000)
    loop = threading.Thread(target=rebalancer.run, daemon=True)
    loop.start()
    try:
        assert wait_until(lambda: rebalancer.locks["email"].held, timeout_s=10)
        asyncio.run(take_jobs_failing_first(fq_prefix, 2, fail={first}))

        def placed() -> bool:
            score = _score(redis_client, fq_prefix, first)
            return score is not None and score < MAX_PRIORITY * SCORE_BASE

        assert wait_until(placed, timeout_s=20 * HISTORY_EVERY_MS / 1000)
    finally:
        rebalancer.request_stop()
        loop.join(10)
    _assert_one_index_entry_per_waiting_job(redis_client, fq_prefix, walked=False)


# -- a job's fairqueue keys go with it ----------------------------------------------------


def test_delayed_jobs_leave_no_fairqueue_entry_behind(fq_prefix, redis_client):
    """A delayed job's meta lives in its own opts, not in fq:jobs: drained by a worker
    straight from BullMQ's promotion (before any pass), or removed, nothing of it is left
    once the pass's walk has dropped its index entry."""
    ids = [enqueue_job("email", {}, tenant_id="t", delay_ms=20).job_id for _ in range(5)]
    assert redis_client.hlen(f"{fq_prefix}:email:fq:jobs") == 0
    time.sleep(0.05)
    taken = asyncio.run(take_jobs_failing_first(fq_prefix, 5, fail=set()))
    assert sorted(taken) == sorted(ids)
    rebalance_queue("email", rebalancer="reruns-test")
    assert redis_client.hlen(f"{fq_prefix}:email:fq:jobs") == 0
    assert index_ids(redis_client, fq_prefix) == {}

    removed = enqueue_job("email", {}, tenant_id="t", delay_ms=60_000).job_id

    async def remove() -> None:
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        await queue.remove(removed)
        await queue.close()

    asyncio.run(remove())
    rebalance_queue("email", rebalancer="reruns-test")
    assert index_ids(redis_client, fq_prefix) == {}
    assert redis_client.hlen(f"{fq_prefix}:email:fq:jobs") == 0


def test_a_promoted_delayed_job_is_placed_from_its_own_meta(fq_prefix, redis_client):
    job = enqueue_job("email", {}, tenant_id="t", tenant_weight=3, delay_ms=20)
    opts = json.loads(redis_client.hget(f"{fq_prefix}:email:{job.job_id}", "opts"))
    assert opts["fqMeta"] == "normal\n3\nt" and opts["fqReady"] > 0
    time.sleep(0.05)
    # BullMQ promotes due delayed jobs when a worker fetches; here with its own script.

    async def promote() -> None:
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        await queue.promoteJobs()
        await queue.close()

    asyncio.run(promote())
    result = rebalance_queue("email", rebalancer="reruns-test")
    assert result.adopted == 1
    assert redis_client.zscore(f"{fq_prefix}:email:prioritized", job.job_id) < (
        MAX_PRIORITY * SCORE_BASE
    )
    assert redis_client.hget(f"{fq_prefix}:email:fq:fweights", "normal\nt") == "3"
    _assert_one_index_entry_per_waiting_job(redis_client, fq_prefix)
