"""One rebalance pass: maintenance of the fair order the add script makes (docs/design.md,
"The pass is maintenance"). It adopts jobs that arrived without a place, counts overdue
jobs per level from the ready-time index (and trims it), rebases tags before they reach
BullMQ's cap and records the history from BullMQ's events stream, ``HISTORY_PAGES``
pages at most. Every script call does bounded work and is fenced by the queue's leader
lock inside Redis (a pass whose lock another rebalancer took stops writing:
``lock_lost``); time is Redis's, never this host's.
"""

from __future__ import annotations

import logging
import time
from typing import Final, TypeVar

from fairqueue.broker import (
    AdoptedPage,
    Broker,
    Fence,
    IndexWalk,
    LockLostError,
    RecordedPage,
    get_broker,
    get_sync_broker,
)
from fairqueue.conf import get_settings
from fairqueue.metrics import by_job_type, get_metrics
from fairqueue.rebalance.leadership import LeaderLock, lock_ttl_ms, rebalancer_id
from fairqueue.rebalance.pass_result import LAST_RUN_RECORD, PassResult, Timed
from fairqueue.scheduling.levels import (
    LEVELS_BY_RANK,
)
from fairqueue.usage.ledger import ledger_for

logger = logging.getLogger("fairqueue.rebalance")

T = TypeVar("T")

#: Untagged jobs adopted per script call, and calls per pass at most.
ADOPT_PAGE_SIZE: Final = 500
ADOPT_PAGES: Final = 20
#: Index entries per walk call (about a millisecond of Redis each, under 5 ms at a
#: million waiting jobs). For the overdue count a pass
#: walks one page per ``WALK_MS_PER_PAGE`` of its interval (at least one, at most
#: ``MAX_WALK_PAGES``), and a quarter of that (at least one) for the sweep of younger
#: entries (an id left behind costs a few bytes): about 1% of Redis's time whatever the
#: interval, so the pass never competes with the workers.
WALK_PAGE_SIZE: Final = 250
WALK_MS_PER_PAGE: Final = 60
MAX_WALK_PAGES: Final = 80
SWEEP_SHARE: Final = 4
#: Tag-band jobs moved per rebase call, and calls per pass at most.
REBASE_PAGE_SIZE: Final = 500
REBASE_PAGES: Final = 40
#: Pages (of 500 waiting jobs) of a weight change's re-placement each tick goes on with.
REPLACE_PAGES_PER_TICK: Final = 4
#: Stream entries read per history call (about 3 per job: added, active, completed), and
#: calls per pass at most (BullMQ keeps about 10,000 entries: a stream's worth per pass).
#: Pages of 250: a call stays under 5 ms of Redis at a million waiting jobs and 10,000
#: tenants (benchmarks/bench_release_scale.py), its fixed work (the lock, the cursor,
#: the buckets' writes) still spread over many entries.
HISTORY_PAGE_SIZE: Final = 250
HISTORY_PAGES: Final = 48
#: BullMQ's defaults for the stalled-job check the pass runs (its workers' own
#: ``maxStalledCount`` and ``stalledInterval``): a job that stalls more often than this
#: is failed, and between two of the pass's checks workers skip theirs for this long.
MAX_STALLED_COUNT: Final = 1
STALLED_CHECK_MS: Final = 30_000

#: Where each queue's sweep of the index stopped, per process: (prefix, queue) -> cursor.
_sweep_cursors: dict[tuple[str, str], tuple[str, int]] = {}


def walk_pages(interval_ms: int) -> int:
    """Index pages a pass may walk (each way) at this interval."""
    return max(1, min(MAX_WALK_PAGES, round(interval_ms / WALK_MS_PER_PAGE)))


async def arebalance_queue(
    job_type: str,
    *,
    dry_run: bool = False,
    broker: Broker | None = None,
    rebalancer: str | None = None,
    interval_ms: int | None = None,
    by: str | None = None,
    record_history: bool = True,
) -> PassResult:
    """One pass over ``job_type``'s queue (async). See the module docstring.

    Args:
        rebalancer: the leader lock token of a rebalance loop that holds the lock. Without
            it the pass takes the lock for itself (if free) and releases it after.
        interval_ms: the loop's pass interval (default ``QUEUE_FAIR_REBALANCE_INTERVAL_MS``):
            each script call renews the lock to :func:`lock_ttl_ms` of it, and the index
            walks get a page budget in proportion to it.
        by: who ran the pass, for its status record (default: ``rebalancer``).
        record_history: record the dashboard's history (``False``: benchmarks compare).
    """
    started = time.perf_counter()
    settings = get_settings()
    queue = settings.queue_for(job_type)
    broker = broker or get_broker()
    result = PassResult(job_type=job_type, queue=queue, dry_run=dry_run)
    interval_ms = interval_ms or settings.rebalance_interval_ms
    fence = Fence(
        lock_key=broker.fair_key(queue, "leader"),
        token=rebalancer or f"pass:{rebalancer_id()}",
        ttl_ms=lock_ttl_ms(interval_ms),
    )
    pages = walk_pages(interval_ms)
    timed = Timed(result)
    try:
        if not dry_run:
            await _prepare_queue(timed, broker, queue, fence)
        await _adopt_pages(timed, broker, queue, fence, dry_run=dry_run)
        await _count_overdue(timed, broker, queue, fence, pages, settings.max_wait_ms, dry_run)
        if not dry_run:
            await _sweep(timed, broker, queue, fence, pages)
            await _rebase(timed, broker, queue, fence)
            if record_history:
                await _record(timed, broker, queue, fence, settings.max_wait_ms)
                # the moves its history step began, as a tick's: a loop whose interval
                # leaves no room for ticks between passes runs none
                await timed(broker.limits.replace_pages(queue, pages=REPLACE_PAGES_PER_TICK))
    except LockLostError:
        result.lock_lost = True
        logger.warning("%s: another rebalancer holds the lock; this pass stopped", job_type)
    finally:
        if rebalancer is None and not dry_run:
            await broker.lock.release_lock(fence.lock_key, fence.token)
    result.duration_ms = (time.perf_counter() - started) * 1000
    if not dry_run and not result.lock_lost:
        _record_metrics(result)
        now_ms = int(time.time() * 1000)
        await broker.passes.write_status(
            queue, LAST_RUN_RECORD, result.record(now_ms, by or rebalancer)
        )
    return result


async def _prepare_queue(timed: Timed, broker: Broker, queue: str, fence: Fence) -> None:
    """What a pass does before it adopts: forget the keys of a queue BullMQ obliterated,
    recover stalled jobs, and release held jobs whose tenant has room (the loop does this
    every few ms between passes; a pass alone, as with Celery beat, releases here)."""
    result = timed.result
    await broker.passes.forget_obliterated(queue, fence=fence, status_names=(LAST_RUN_RECORD,))
    await _recover_stalled(timed, broker, queue, fence, result)
    held = await timed(broker.limits.release(queue))
    result.released, result.held = held.released, held.held


async def _adopt_pages(
    timed: Timed, broker: Broker, queue: str, fence: Fence, *, dry_run: bool
) -> None:
    """Adopt untagged jobs, ``ADOPT_PAGES`` pages at most, until a page comes back short
    or parks jobs (the tag band is full until a rebase)."""
    for _ in range(ADOPT_PAGES):
        page = await _adopt(timed, broker, queue, fence, timed.result, dry_run=dry_run)
        if page.examined < ADOPT_PAGE_SIZE or page.parked or dry_run:
            break


async def _count_overdue(
    timed: Timed,
    broker: Broker,
    queue: str,
    fence: Fence,
    pages: int,
    max_wait_ms: int,
    dry_run: bool,
) -> None:
    """Count the jobs past the wait bound, per level, from the oldest index entry."""
    result = timed.result
    overdue = await _walk(
        timed, broker, queue, fence, pages=pages, max_wait_ms=max_wait_ms, dry_run=dry_run
    )
    result.overdue_by_level = {
        level.value: overdue.waiting[level.value]
        for level in LEVELS_BY_RANK
        if overdue.waiting.get(level.value)
    }
    result.overdue = sum(overdue.waiting.values()) + overdue.left
    result.cleaned = overdue.removed


async def _sweep(timed: Timed, broker: Broker, queue: str, fence: Fence, pages: int) -> None:
    """One step of the sweep of younger index entries, from where the last one stopped."""
    sweep_key = (broker.prefix, queue)
    sweep = await _walk(
        timed,
        broker,
        queue,
        fence,
        pages=max(1, pages // SWEEP_SHARE),
        cursor=_sweep_cursors.pop(sweep_key, None),
    )
    if sweep.cursor is not None:
        _sweep_cursors[sweep_key] = sweep.cursor
    timed.result.cleaned += sweep.removed


async def _rebase(timed: Timed, broker: Broker, queue: str, fence: Fence) -> None:
    """Move the tag band down, ``REBASE_PAGES`` pages at most, while a rebase is due."""
    for _ in range(REBASE_PAGES):
        moved, done = await timed(
            broker.passes.rebase_page(queue, fence=fence, page_size=REBASE_PAGE_SIZE)
        )
        timed.result.rebased += moved
        if done:
            break


async def _record(timed: Timed, broker: Broker, queue: str, fence: Fence, max_wait_ms: int) -> None:
    """Record the history: the events stream from its cursor, ``HISTORY_PAGES`` pages
    at most (the stream's cap is about that much)."""
    result = timed.result
    for _ in range(HISTORY_PAGES):
        recorded = await timed(
            broker.history.record_history_page(
                queue,
                fence=fence,
                max_wait_ms=max_wait_ms,
                page_size=HISTORY_PAGE_SIZE,
                fairness_by=get_settings().fairness_by,
                ledger=ledger_for(queue),
            )
        )
        metrics = get_metrics()
        for level, (worker_ms, retries) in recorded.served.items():
            done_ms, restarts = result.served.get(level, (0, 0))
            result.served[level] = (done_ms + worker_ms, restarts + retries)
            if worker_ms:
                by_job_type(metrics.worker_seconds, result.job_type, level).inc(worker_ms / 1000)
            if retries:
                by_job_type(metrics.retries, result.job_type, level).inc(retries)
        result.recorded += recorded.recorded
        result.unrecorded += recorded.unknown
        result.history_gap_ms += recorded.gap_ms
        _record_starts(queue, recorded, result.job_type)
        if not recorded.more:
            break
    # where the virtual time stands, once a pass: the estimate's pace of the clock
    await timed(broker.history.sample_virtual_time(queue))


def _record_starts(queue: str, page: RecordedPage, job_type: str = "") -> None:
    """The starts and waits a history page read, into the rebalancer's metrics: once
    per page, as the script moved its cursor past them (never counted twice)."""
    if not (page.started_by_level or page.waits):
        return
    metrics = get_metrics()
    for level, error_ms in page.estimate_errors:
        metrics.start_estimate_error.labels(job_type, queue, level).observe(error_ms / 1000)
    for level, count in page.started_by_level.items():
        metrics.jobs_started.labels(queue, level).inc(count)
    for level, wait_ms in page.waits:
        metrics.wait_seconds.labels(queue, level).observe(wait_ms / 1000)


async def _recover_stalled(
    timed: Timed, broker: Broker, queue: str, fence: Fence, result: PassResult
) -> None:
    settings = get_settings()
    stalled = await timed(
        broker.passes.recover_stalled(
            queue,
            fence=fence,
            max_wait_ms=settings.max_wait_ms,
            max_payload_bytes=settings.max_payload_bytes,
            max_stalled_count=MAX_STALLED_COUNT,
            check_ms=STALLED_CHECK_MS,
            fairness_by=settings.fairness_by,
        )
    )
    result.recovered += stalled.recovered
    result.aged += stalled.aged


async def _adopt(
    timed: Timed, broker: Broker, queue: str, fence: Fence, result: PassResult, *, dry_run: bool
) -> AdoptedPage:
    settings = get_settings()
    page = await timed(
        broker.passes.adopt_page(
            queue,
            fence=fence,
            page_size=ADOPT_PAGE_SIZE,
            max_wait_ms=settings.max_wait_ms,
            max_payload_bytes=settings.max_payload_bytes,
            dry_run=dry_run,
            fairness_by=settings.fairness_by,
        )
    )
    result.adopted += page.adopted
    result.aged += page.aged
    result.parked = page.parked
    return page


async def arun_tick(
    job_type: str,
    *,
    rebalancer: str,
    interval_ms: int,
    broker: Broker | None = None,
    history_only: bool = False,
) -> PassResult:
    """What a loop holding the queue's lock runs between two passes, every
    ``HISTORY_EVERY_MS``: the stalled-job check and one page of adoption, so a job that
    runs again (a retry, a promoted backoff, a stalled job) waits at most a tick for its
    fair place instead of a whole interval, and the history step (BullMQ keeps about
    10,000 events, about 3 per job, so at 1,000 jobs/s a 5 s interval alone would see
    about half of them). Fenced like a pass; ``history_only``: the history step alone
    (benchmarks compare it).

    Raises:
        UnknownJobTypeError: ``job_type`` is not configured.
    """
    settings = get_settings()
    queue = settings.queue_for(job_type)
    broker = broker or get_broker()
    result = PassResult(job_type=job_type, queue=queue)
    fence = Fence(broker.fair_key(queue, "leader"), rebalancer, lock_ttl_ms(interval_ms))
    started = time.perf_counter()
    timed = Timed(result)
    try:
        if not history_only:
            await _recover_stalled(timed, broker, queue, fence, result)
            await _adopt(timed, broker, queue, fence, result, dry_run=False)
        await _record(timed, broker, queue, fence, settings.max_wait_ms)
        if not history_only:
            # a weight change's waiting jobs placed again, where its call left off, and a
            # cold flow's its history step just measured (in the same tick: its backlog
            # runs cheap until then)
            await timed(broker.limits.replace_pages(queue, pages=REPLACE_PAGES_PER_TICK))
    except LockLostError:
        result.lock_lost = True
    result.duration_ms = (time.perf_counter() - started) * 1000
    return result


def run_tick(
    job_type: str, *, rebalancer: str, interval_ms: int, history_only: bool = False
) -> PassResult:
    """:func:`arun_tick` from sync code (the rebalance loop)."""
    sync_broker = get_sync_broker()
    return sync_broker.run(
        arun_tick,
        job_type,
        rebalancer=rebalancer,
        interval_ms=interval_ms,
        broker=sync_broker.broker,
        history_only=history_only,
    )


async def _walk(
    timed: Timed,
    broker: Broker,
    queue: str,
    fence: Fence,
    *,
    pages: int,
    max_wait_ms: int | None = None,
    cursor: tuple[str, int] | None = None,
    dry_run: bool = False,
) -> IndexWalk:
    """The overdue walk (``max_wait_ms`` given: up to the bound, from the oldest entry)
    or a sweep step (from ``cursor`` towards the youngest), ``pages`` pages at most."""
    walk = IndexWalk()
    for _ in range(pages):
        walk.extend(
            await timed(
                broker.passes.walk_index_page(
                    queue,
                    fence=fence,
                    max_wait_ms=max_wait_ms,
                    page_size=WALK_PAGE_SIZE,
                    cursor=walk.cursor if walk.pages else cursor,
                    dry_run=dry_run,
                )
            )
        )
        if walk.cursor is None:
            break
    return walk


def _record_metrics(result: PassResult) -> None:
    metrics = get_metrics()
    if result.aged:
        metrics.decisions.labels(result.job_type, result.queue, "aged").inc(result.aged)
        metrics.aged_boosts.labels(result.job_type, result.queue).inc(result.aged)
    if result.adopted - result.aged:
        metrics.decisions.labels(result.job_type, result.queue, "weighted_fair").inc(
            result.adopted - result.aged
        )
    metrics.overdue_waiting.labels(result.job_type, result.queue).set(result.overdue)
    metrics.held_jobs.labels(result.job_type, result.queue).set(result.held)
    for level in LEVELS_BY_RANK:
        metrics.level_overdue_waiting.labels(result.queue, level.value).set(
            result.overdue_by_level.get(level.value, 0)
        )
    metrics.pass_duration.labels(result.job_type, result.queue).observe(result.duration_ms / 1000)
    metrics.last_pass_success.labels(result.job_type, result.queue).set(time.time())


def rebalance_queue(
    job_type: str,
    *,
    dry_run: bool = False,
    rebalancer: str | None = None,
    interval_ms: int | None = None,
    by: str | None = None,
    record_history: bool = True,
) -> PassResult:
    """One pass over ``job_type``'s queue, from sync code (commands, Celery, views)."""
    sync_broker = get_sync_broker()
    return sync_broker.run(
        arebalance_queue,
        job_type,
        dry_run=dry_run,
        broker=sync_broker.broker,
        rebalancer=rebalancer,
        interval_ms=interval_ms,
        by=by,
        record_history=record_history,
    )


def rebalance_as_leader(
    job_type: str, *, token: str, interval_ms: int, dry_run: bool = False
) -> PassResult | None:
    """Run a pass if we hold (or can take) the queue's leader lock; ``None`` otherwise."""
    queue = get_settings().queue_for(job_type)
    lock = LeaderLock(queue, token, lock_ttl_ms(interval_ms))
    if dry_run:
        return rebalance_queue(job_type, dry_run=True, rebalancer=token)
    if not lock.acquire():
        return None
    return rebalance_queue(job_type, rebalancer=token, interval_ms=interval_ms)
