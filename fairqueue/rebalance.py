"""One rebalance pass: read the waiting set, order it, write what changed, record it.

Seed 1's pass, with SPEC decisions 5-9:

1. Read the head of the queue as BullMQ will pop it - the ``wait`` list (priority 0,
   foreign producers), the window band (what earlier passes ordered) and enough of the
   tag band (newly enqueued jobs, already placed by their fair tags) to fill the
   working window (``REBALANCE_WINDOW``, default 1,000).
2. Scan the rest of the backlog inside Redis for jobs past the wait bound, so the bound
   holds for every waiting job, not just the window (decision 9).
3. Rebuild :class:`~fairqueue.scheduler.PendingJob` s from durable job data (``tenantId``,
   ``priorityLevel``, BullMQ's ``timestamp``); foreign jobs fall back to
   ``normalize_priority`` of the priority their producer asked for and the ``default``
   tenant. A job whose data is not a JSON object, or has no timestamp, is skipped, counted,
   and keeps its place at the end of the window.
4. Order them with :func:`~fairqueue.scheduler.order_pending_jobs` and give them window
   priorities (:func:`plan_priorities`) that change as few jobs as possible: an
   unchanged set writes nothing, and consuming the head renumbers nothing.
5. Write with BullMQ's own ``changePriority`` in pipelined batches; a job that finished
   or vanished meanwhile is counted, never fatal.
6. Record metrics and a status record the dashboard reads.
"""

from __future__ import annotations

import bisect
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from .broker import (
    REBASE_THRESHOLD,
    WINDOW_BAND_TOP,
    Broker,
    WaitingJob,
    get_broker,
    get_sync_broker,
)
from .conf import get_settings
from .exceptions import UnknownJobTypeError
from .levels import (
    DEFAULT_TENANT,
    PAYLOAD_LEVEL_KEY,
    PAYLOAD_TENANT_KEY,
    PriorityLevel,
    normalize_priority,
)
from .metrics import get_metrics
from .scheduler import AGED, PendingJob, ScheduledJob, is_overdue, order_pending_jobs

logger = logging.getLogger("fairqueue.rebalance")

#: Preferred gap between neighbouring window priorities: room to slot later jobs in
#: between without renumbering their neighbours.
PRIORITY_SPACING: Final = 32
#: Most window-band jobs a pass reads (the band normally holds about one window).
MAX_WINDOW_BAND: Final = 100_000
#: What a pass did, as counts: recorded for the dashboard, which shows them.
PASS_COUNTS: Final = (
    "examined",
    "reordered",
    "written",
    "aged",
    "overdue",
    "skipped",
    "missing",
    "failed",
    "rebased",
)
LAST_RUN_RECORD: Final = "last_pass"


@dataclass(frozen=True, slots=True)
class PlannedJob:
    job_id: str
    position: int
    decision: str
    current_priority: int
    new_priority: int
    pending: PendingJob | None


@dataclass(slots=True)
class PassResult:
    """What one pass did. Counts only: no payloads, no tenant ids."""

    job_type: str
    queue: str
    examined: int = 0
    reordered: int = 0
    written: int = 0
    aged: int = 0
    overdue: int = 0
    skipped: int = 0
    failed: int = 0
    missing: int = 0
    rebased: int = 0
    round_trips: int = 0
    duration_ms: float = 0.0
    dry_run: bool = False
    plan: list[PlannedJob] = field(default_factory=list, repr=False)

    def record(self, at_ms: int, rebalancer: str | None) -> dict[str, object]:
        """The status record the dashboard shows (counts only)."""
        return {
            **{name: getattr(self, name) for name in (*PASS_COUNTS, "round_trips", "duration_ms")},
            "job_type": self.job_type,
            "at_ms": at_ms,
            "by": rebalancer or "",
        }

    def summary(self) -> str:
        return (
            f"{self.job_type}: examined={self.examined} reordered={self.reordered} "
            f"written={self.written} aged={self.aged} overdue={self.overdue} "
            f"skipped={self.skipped} failed={self.failed} missing={self.missing} "
            f"duration={self.duration_ms:.1f}ms{' (dry run)' if self.dry_run else ''}"
        )


def rebalancer_id() -> str:
    """Who is rebalancing: host, pid and a random suffix (no secrets)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# -- pure parts ---------------------------------------------------------------------------


def pending_from_job(job: WaitingJob) -> PendingJob | None:
    """Rebuild the policy's view of a job from its durable data; ``None`` if it cannot be.

    fairqueue's jobs carry ``tenantId`` and ``priorityLevel`` in their data; jobs from
    other producers fall back to the priority their producer asked for and the
    ``default`` tenant (seed 1, "Worker restart safety").
    """
    if job.data is None or job.timestamp_ms is None:
        return None
    tenant = job.data.get(PAYLOAD_TENANT_KEY)
    if tenant is None:
        tenant = DEFAULT_TENANT
    elif not isinstance(tenant, str) or not tenant:
        return None
    raw_level = job.data.get(PAYLOAD_LEVEL_KEY)
    try:
        if raw_level is not None:
            level = PriorityLevel(raw_level)
        else:
            requested = job.requested_priority
            level = normalize_priority(requested if requested is not None else job.priority)
    except ValueError:
        return None
    return PendingJob(job.job_id, level, tenant, job.timestamp_ms)


def _longest_increasing(values: Sequence[int | None]) -> list[int]:
    """Indexes of a longest strictly increasing subsequence (``None`` never taken)."""
    tails: list[int] = []  # tails[k]: smallest tail value of an increasing run of k+1
    tail_index: list[int] = []
    previous: list[int] = [-1] * len(values)
    for index, value in enumerate(values):
        if value is None:
            continue
        k = bisect.bisect_left(tails, value)
        if k == len(tails):
            tails.append(value)
            tail_index.append(index)
        else:
            tails[k] = value
            tail_index[k] = index
        previous[index] = tail_index[k - 1] if k else -1
    result: list[int] = []
    index = tail_index[-1] if tail_index else -1
    while index != -1:
        result.append(index)
        index = previous[index]
    return result[::-1]


def plan_priorities(
    current: Sequence[int], *, upper: int, spacing: int = PRIORITY_SPACING
) -> list[int]:
    """Strictly increasing priorities in ``1 .. upper-1`` for jobs in run order, keeping
    as many ``current`` values as possible.

    The jobs whose current priorities already increase (a longest increasing subsequence)
    keep them; the others are slotted into the gaps, ``spacing`` apart where there is
    room. A gap too small for its jobs gives up a neighbouring anchor; when the tail of
    the band runs out of room the whole window is renumbered from the bottom, which is
    free again because workers consumed the jobs that were there.

    Raises:
        ValueError: more jobs than priorities below ``upper``.
    """
    n = len(current)
    if n == 0:
        return []
    if n > upper - 1:
        raise ValueError(f"{n} jobs do not fit below priority {upper}")
    anchors = _longest_increasing([c if 0 < c < upper else None for c in current])

    def fits(lo_value: int, hi_value: int, count: int, tail: bool) -> bool:
        need = count * spacing if tail else count
        return hi_value - lo_value - 1 >= need

    while True:
        bounds = [-1, *anchors, n]
        values = [0, *(current[i] for i in anchors), upper]
        for k in range(len(bounds) - 1):
            count = bounds[k + 1] - bounds[k] - 1
            tail = bounds[k + 1] == n
            if count and not fits(values[k], values[k + 1], count, tail):
                break
        else:
            break
        if tail:  # no room at the top: renumber the window from the bottom
            anchors = []
            break
        del anchors[k]  # give up the anchor that closes this gap on the right

    result = [0] * n
    bounds = [-1, *anchors, n]
    values = [0, *(current[i] for i in anchors), upper]
    for i in anchors:
        result[i] = current[i]
    for k in range(len(bounds) - 1):
        count = bounds[k + 1] - bounds[k] - 1
        if not count:
            continue
        lo, hi = values[k], values[k + 1]
        step = max(1, min(spacing, (hi - lo - 1) // count))
        if bounds[k + 1] != n:
            step = max(1, (hi - lo) // (count + 1))
        for offset, index in enumerate(range(bounds[k] + 1, bounds[k + 1]), start=1):
            result[index] = lo + step * offset
    return result


# -- the pass -----------------------------------------------------------------------------


async def arebalance_queue(
    job_type: str,
    *,
    now_ms: int | None = None,
    dry_run: bool = False,
    broker: Broker | None = None,
    rebalancer: str | None = None,
) -> PassResult:
    """One pass over ``job_type``'s queue (async). See the module docstring."""
    started = time.perf_counter()
    settings = get_settings()
    if job_type not in settings.queues:
        raise UnknownJobTypeError(
            f"job_type={job_type!r} is not allowed: expected one of {sorted(settings.queues)}"
        )
    queue = settings.queues[job_type]
    broker = broker or get_broker()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    result = PassResult(job_type=job_type, queue=queue, dry_run=dry_run)

    snapshot = await broker.read_head(
        queue, window=settings.rebalance_window, max_window_band=MAX_WINDOW_BAND
    )
    cutoff_ms = now_ms - settings.max_wait_ms
    # Every waiting job is checked against the bound; the oldest overdue ones join the
    # window (as many as a window holds: more could not run before the next pass).
    deep = await broker.find_overdue(
        queue,
        cutoff_ms=cutoff_ms,
        start=snapshot.prioritized_read,
        oldest=settings.rebalance_window,
    )
    # Ranks shift while we read (workers pop, producers add), so the scan may meet a
    # job the head already holds: keep one copy.
    head_ids = {job.job_id for job in snapshot.jobs}
    deep_ids = [job_id for job_id in deep.job_ids if job_id not in head_ids]
    deep_jobs = await broker.read_jobs(queue, deep_ids, payload=False)
    result.round_trips = 3 + bool(deep_ids)
    jobs = snapshot.jobs + deep_jobs
    deep_set = set(deep_ids)
    result.examined = len(jobs)

    pending: list[PendingJob] = []
    unparsed: list[WaitingJob] = []
    for job in jobs:
        parsed = pending_from_job(job)
        if parsed is None:
            unparsed.append(job)
        else:
            pending.append(parsed)
    result.skipped = len(unparsed)
    if unparsed:
        logger.warning(
            "%s: %d waiting job(s) have unreadable fairqueue metadata; they keep their place",
            job_type,
            len(unparsed),
        )

    order = order_pending_jobs(pending, now_ms=now_ms, max_wait_ms=settings.max_wait_ms)
    by_id = {job.job_id: job for job in jobs}
    pending_by_id = {job.job_id: job for job in pending}
    sequence: list[tuple[ScheduledJob | None, WaitingJob]] = [
        (item, by_id[item.job_id]) for item in order
    ] + [(None, job) for job in unparsed]
    current = [job.priority if not job.in_wait_list else 0 for _, job in sequence]
    upper = min(snapshot.upper_bound, WINDOW_BAND_TOP)
    try:
        planned = plan_priorities(current, upper=upper)
    except ValueError:
        # Pathological: more jobs share tiny priorities than fit below them (foreign
        # producers). Use the whole window band; jobs we did not read may interleave.
        logger.warning("%s: window does not fit below the next job; using the full band", job_type)
        planned = plan_priorities(current, upper=WINDOW_BAND_TOP)

    pop_index = {job.job_id: index for index, job in enumerate(jobs)}
    changes: list[tuple[str, int]] = []
    for position, ((item, job), old, new) in enumerate(
        zip(sequence, current, planned, strict=True), start=1
    ):
        decision = item.decision if item is not None else "skipped"
        result.plan.append(
            PlannedJob(job.job_id, position, decision, old, new, pending_by_id.get(job.job_id))
        )
        if pop_index[job.job_id] != position - 1:
            result.reordered += 1
        if new != old:
            changes.append((job.job_id, new))
    # Overdue: those in the head plus every one found deeper (not only those promoted).
    head_overdue = sum(
        1
        for job in pending
        if job.job_id not in deep_set
        and is_overdue(job, now_ms=now_ms, max_wait_ms=settings.max_wait_ms)
    )
    result.overdue = head_overdue + deep.total
    result.aged = sum(1 for item in result.plan if item.decision == AGED)

    if not dry_run:
        written_ids: set[str] = set()
        if changes:
            write = await broker.set_priorities(queue, changes)
            result.written = write.written
            result.missing = len(write.missing)
            result.failed = len(write.failed)
            result.round_trips += write.round_trips
            lost = set(write.missing) | set(write.failed)
            written_ids = {job_id for job_id, _ in changes if job_id not in lost}
            if write.missing or write.failed:
                logger.warning(
                    "%s: %d job(s) finished or vanished mid-pass, %d write(s) failed; "
                    "the rest of the pass was applied",
                    job_type,
                    len(write.missing),
                    len(write.failed),
                )
        if snapshot.tag_band_head is not None and snapshot.tag_band_head > REBASE_THRESHOLD:
            shift = snapshot.tag_band_head - WINDOW_BAND_TOP
            result.rebased = await broker.rebase_tag_band(queue, shift - shift % 4)
            result.round_trips += 1
        _record_metrics(result, written_ids)
        result.duration_ms = (time.perf_counter() - started) * 1000
        await broker.write_status(queue, LAST_RUN_RECORD, result.record(now_ms, rebalancer))
    result.duration_ms = (time.perf_counter() - started) * 1000
    return result


def _record_metrics(result: PassResult, written_ids: set[str]) -> None:
    metrics = get_metrics()
    aged = sum(1 for item in result.plan if item.decision == AGED and item.job_id in written_ids)
    fair = sum(1 for item in result.plan if item.decision != AGED and item.job_id in written_ids)
    if aged:
        metrics.decisions.labels(result.job_type, "aged").inc(aged)
        metrics.aged_boosts.labels(result.job_type).inc(aged)
    if fair:
        metrics.decisions.labels(result.job_type, "weighted_fair").inc(fair)
    metrics.overdue_waiting.labels(result.job_type).set(result.overdue)


def rebalance_queue(
    job_type: str,
    *,
    now_ms: int | None = None,
    dry_run: bool = False,
    rebalancer: str | None = None,
) -> PassResult:
    """One pass over ``job_type``'s queue, from sync code (commands, Celery, views)."""
    sync_broker = get_sync_broker()
    return sync_broker.run(
        arebalance_queue,
        job_type,
        now_ms=now_ms,
        dry_run=dry_run,
        broker=sync_broker.broker,
        rebalancer=rebalancer,
    )


# -- leadership ---------------------------------------------------------------------------


class LeaderLock:
    """Who may write a queue's order: the holder of a Redis lock (SET NX PX + token).

    Any number of rebalancers may run, one per host for availability; per queue only the
    holder writes. The holder renews the lock every pass; if it dies the lock expires
    after ``ttl_ms`` (two intervals) and another rebalancer takes over.
    """

    def __init__(self, queue: str, token: str, ttl_ms: int) -> None:
        self.queue = queue
        self.token = token
        self.ttl_ms = ttl_ms
        self.held = False

    @property
    def key(self) -> str:
        return get_sync_broker().broker.fair_key(self.queue, "leader")

    def acquire(self) -> bool:
        """Take the lock if it is free or renew it if we hold it."""
        self.held = get_sync_broker().acquire_lock(self.key, self.token, self.ttl_ms)
        return self.held

    def release(self) -> None:
        if self.held:
            get_sync_broker().release_lock(self.key, self.token)
            self.held = False


def lock_ttl_ms(interval_ms: int) -> int:
    """Two intervals, so a dead leader is replaced within two intervals; at least one
    second so a slow pass does not lose the lock it is renewing."""
    return max(2 * interval_ms, 1_000)


def rebalance_as_leader(
    job_type: str, *, token: str, interval_ms: int, dry_run: bool = False
) -> PassResult | None:
    """Run a pass if we hold (or can take) the queue's leader lock; ``None`` otherwise."""
    queue = get_settings().queues.get(job_type)
    if queue is None:
        raise UnknownJobTypeError(
            f"job_type={job_type!r} is not allowed: expected one of {sorted(get_settings().queues)}"
        )
    lock = LeaderLock(queue, token, lock_ttl_ms(interval_ms))
    if dry_run:
        return rebalance_queue(job_type, dry_run=True, rebalancer=token)
    if not lock.acquire():
        return None
    return rebalance_queue(job_type, rebalancer=token)
