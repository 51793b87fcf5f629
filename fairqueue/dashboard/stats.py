"""Dashboard statistics: one function, :func:`queue_stats`, feeds the admin page, its
JSON endpoint and anything else that wants a queue's live state (django-rq's
``get_statistics`` habit).

What a call costs, whatever the backlog size:

* exact and live on every call, O(page + window): BullMQ's counts by state, the page of
  the waiting order asked for (read in pop order, so it is what a worker takes next), the
  last pass record, the leader lock, and the head of the queue (the rebalance window),
  where jobs fairqueue has not placed yet (other producers' jobs, promoted delayed jobs,
  jobs without room) are flagged as unplaced: the next pass adopts them;
* O(backlog): per-level waiting and overdue counts, oldest job per level and top tenants
  need every waiting job's metadata. A Redis-side scan does that at about 6-10 ms per
  1,000 jobs, so it runs on the request only while the backlog is at most
  ``SYNC_SCAN_LIMIT`` jobs (exact, as of now). Above that the last scan is served from a
  per-process cache and refreshed in the background (on the broker's event loop, never
  awaited by a request) every ``BACKLOG_REFRESH_S`` seconds or ``SCAN_DUTY_FACTOR``
  scan durations, whichever is longer, so a page over a 100,000-job backlog stays far
  below 300 ms; the stats say so (``backlog.exact`` is false, with the scan's age) and
  the page shows it.

* the limited tenants (``stats["limits"]``): exact totals summed inside Redis a page of
  1,000 tenants per script call (about 2 ms each: 10 calls at 10,000 tenants holding
  jobs, on one connection), and at most 200 tenants read in full, in one call;

* the history (``stats["history"]``): what workers started over the last minutes, as
  the rebalance pass recorded it from BullMQ's events stream (:mod:`fairqueue.history`);
  one pipelined read of the hour's buckets (360 small hashes and zsets) per request,
  whatever the traffic.

The returned dict is plain JSON data (numbers, strings, lists, dicts, None), with display
strings next to raw values so the page and its JavaScript show the same text. No
payloads: the job detail view reads those separately, behind their own permission.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from fairqueue.broker import (
    MAX_PRIORITY,
    TAG_FLOOR,
    BacklogScan,
    Broker,
    HistoryRead,
    LimitsStatus,
    MemoryState,
    WaitingJob,
    WaitingSnapshot,
    get_sync_broker,
    pending_from_job,
)
from fairqueue.conf import get_settings
from fairqueue.dashboard.attention import queue_warnings
from fairqueue.dashboard.charts import history_view
from fairqueue.dashboard.limited_tenants import HELD_JOBS_SHOWN, limits_section
from fairqueue.dashboard.moment import moment, settle_exact
from fairqueue.dashboard.overview import noisy_figures
from fairqueue.dashboard.wording import (
    decision_words,
    format_duration,
    format_time,
    pass_words,
    tenant_words,
)
from fairqueue.enqueue.outbox import outbox_stats
from fairqueue.rebalance.passes import LAST_RUN_RECORD, PASS_COUNTS
from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, LEVELS_BY_RANK
from fairqueue.scheduling.order import AGED, WEIGHTED_FAIR
from fairqueue.scheduling.shares import (
    DEFAULT_WINDOW_MIN,
    clamp_window_min,
    parse_bucket,
    summarize,
)

#: Backlogs up to this many waiting jobs are scanned on every request (about 60 ms).
SYNC_SCAN_LIMIT: Final = 10_000
#: Larger backlogs are rescanned in the background at most this often (per process)...
BACKLOG_REFRESH_S: Final = 10.0
#: ...and at most once per this many scan durations, so scans keep Redis busy for at
#: most 1/20 of the time however large the backlog grows.
SCAN_DUTY_FACTOR: Final = 20
#: Jobs per scan script call: each call blocks Redis for about 3-5 ms, so requests (and
#: workers) served meanwhile wait at most that long for Redis.
SCAN_PAGE_SIZE: Final = 500
#: Cached scans unused for this long are dropped.
_CACHE_IDLE_S: Final = 600.0
#: A background scan still running after this long is presumed lost.
_TASK_ABANDONED_S: Final = 120.0
DEFAULT_PER_PAGE: Final = 20
MAX_PER_PAGE: Final = 200
TOP_TENANTS: Final = 5
STATES: Final = ("wait", "prioritized", "active", "delayed", "failed", "completed")
UNPARSED: Final = "?"


def clamp_page(page: object, per_page: object) -> tuple[int, int]:
    """Turn request input into a valid (page, per_page); bad input gets the defaults."""

    def as_int(value: object, default: int) -> int:
        try:
            return int(str(value))
        except (TypeError, ValueError):
            return default

    return (
        max(1, as_int(page, 1)),
        min(MAX_PER_PAGE, max(1, as_int(per_page, DEFAULT_PER_PAGE))),
    )


# -- the backlog scan cache ---------------------------------------------------------------


@dataclass(slots=True)
class _CachedScan:
    scan: BacklogScan | None = None
    computed_at_ms: int | None = None
    task: asyncio.Future[None] | None = None
    task_started: float = 0.0
    error: str | None = None
    used_at: float = 0.0


_cache: dict[tuple[str, str], _CachedScan] = {}
_cache_lock = threading.Lock()


def clear_backlog_cache() -> None:
    """Forget cached scans (tests; or after changing Redis under a running process)."""
    with _cache_lock:
        _cache.clear()


def scans_in_flight() -> int:
    """Background scans still running in this process (tests and benchmarks)."""
    with _cache_lock:
        return sum(1 for entry in _cache.values() if entry.task and not entry.task.done())


def _refresh_every_ms(scan: BacklogScan | None) -> float:
    duration_ms = scan.duration_ms if scan is not None else 0.0
    return max(BACKLOG_REFRESH_S * 1000, SCAN_DUTY_FACTOR * duration_ms)


def _cache_entry(key: tuple[str, str]) -> _CachedScan:
    now = time.monotonic()
    with _cache_lock:
        for stale in [k for k, v in _cache.items() if now - v.used_at > _CACHE_IDLE_S]:
            del _cache[stale]
        entry = _cache.setdefault(key, _CachedScan())
        entry.used_at = now
        return entry


async def _backlog(
    broker: Broker, queue: str, *, total: int, now_ms: int, max_wait_ms: int, sync_limit: int
) -> tuple[BacklogScan | None, dict[str, Any]]:
    """The backlog scan to show and a description of how fresh it is."""
    cutoff_ms = now_ms - max_wait_ms
    if total <= sync_limit:
        scan = await broker.dashboard.scan_backlog(
            queue, cutoff_ms=cutoff_ms, page_size=SCAN_PAGE_SIZE
        )
        return scan, {
            "exact": True,
            "pending": False,
            "computed_at_ms": now_ms,
            "age_ms": 0,
            "scan_ms": round(scan.duration_ms, 1),
            "note": f"Exact: all {scan.scanned} waiting jobs scanned for this request.",
        }

    entry = _cache_entry((broker.prefix, queue))
    fresh = entry.computed_at_ms is not None and now_ms - entry.computed_at_ms < _refresh_every_ms(
        entry.scan
    )
    running = (
        entry.task is not None
        and not entry.task.done()
        # A task left on an event loop that has gone away never finishes: start anew.
        and time.monotonic() - entry.task_started < _TASK_ABANDONED_S
    )
    if not fresh and not running:
        entry.task = asyncio.ensure_future(_refresh(broker, queue, entry, max_wait_ms))
        entry.task_started = time.monotonic()
    cached = entry.scan
    if cached is None:
        note = (
            f"The backlog holds {total} jobs, more than the {sync_limit} scanned on every "
            "request: per-level counts are being computed in the background."
        )
        if entry.error:
            note += f" The last attempt failed ({entry.error})."
        return None, {
            "exact": False,
            "pending": True,
            "computed_at_ms": None,
            "age_ms": None,
            "scan_ms": None,
            "note": note,
        }
    age_ms = now_ms - (entry.computed_at_ms or now_ms)
    return cached, {
        "exact": False,
        "pending": False,
        "computed_at_ms": entry.computed_at_ms,
        "age_ms": age_ms,
        "scan_ms": round(cached.duration_ms, 1),
        "note": (
            f"Per-level counts, oldest jobs and top tenants are from a background scan of "
            f"{cached.scanned} jobs {format_duration(age_ms)} ago (the backlog is "
            f"larger than {sync_limit} jobs, so it is rescanned in the background every "
            f"{_refresh_every_ms(cached) / 1000:.0f} s or so, not per request)."
        ),
    }


async def _refresh(broker: Broker, queue: str, entry: _CachedScan, max_wait_ms: int) -> None:
    started_ms = int(time.time() * 1000)
    try:
        scan = await broker.dashboard.scan_backlog(
            queue, cutoff_ms=started_ms - max_wait_ms, page_size=SCAN_PAGE_SIZE
        )
    except Exception as exc:  # shown on the page; the next request retries
        entry.error = type(exc).__name__
        return
    entry.scan, entry.computed_at_ms, entry.error = scan, started_ms, None


# -- the stats ----------------------------------------------------------------------------


def queue_stats(
    job_type: str,
    *,
    page: int = 1,
    per_page: int = DEFAULT_PER_PAGE,
    now_ms: int | None = None,
    sync_scan_limit: int = SYNC_SCAN_LIMIT,
    history_minutes: int = DEFAULT_WINDOW_MIN,
) -> dict[str, Any]:
    """Everything the dashboard shows about ``job_type``'s queue (sync callers).

    Raises:
        UnknownJobTypeError: ``job_type`` is not configured.
        BrokerUnavailableError: Redis could not be reached.
        BrokerRejectedError: Redis answered with an error (e.g. out of memory).
    """
    sync_broker = get_sync_broker()
    stats = sync_broker.run(
        aqueue_stats,
        job_type,
        page=page,
        per_page=per_page,
        now_ms=now_ms,
        sync_scan_limit=sync_scan_limit,
        history_minutes=history_minutes,
        broker=sync_broker.broker,
    )
    stats["outbox"] = outbox_figures(job_type)
    stats["noisy"] = noisy_figures(job_type, broker=sync_broker)
    return stats


def outbox_figures(job_type: str) -> dict[str, Any]:
    """The outbox depth of ``job_type`` and its oldest row's age (one database query;
    durable jobs the relay has not moved to Redis yet)."""
    found = outbox_stats(job_type)
    age_ms = found["oldest_age_ms"]
    return {**found, "oldest_age": format_duration(age_ms if isinstance(age_ms, int) else None)}


async def aqueue_stats(
    job_type: str,
    *,
    broker: Broker,
    page: int = 1,
    per_page: int = DEFAULT_PER_PAGE,
    now_ms: int | None = None,
    sync_scan_limit: int = SYNC_SCAN_LIMIT,
    history_minutes: int = DEFAULT_WINDOW_MIN,
) -> dict[str, Any]:
    """:func:`queue_stats` for async callers, on ``broker``'s event loop."""
    settings = get_settings()
    queue = settings.queue_for(job_type)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    max_wait_ms = settings.max_wait_ms
    window = settings.rebalance_window
    page, per_page = clamp_page(page, per_page)
    start = (page - 1) * per_page

    reads = await _read_queue(
        broker,
        queue,
        start=start,
        per_page=per_page,
        window=window,
        now_ms=now_ms,
        history_minutes=history_minutes,
    )
    counts = reads.counts
    total = counts["wait"] + counts["prioritized"]
    scan, backlog = await _backlog(
        broker,
        queue,
        total=total,
        now_ms=now_ms,
        max_wait_ms=max_wait_ms,
        sync_limit=sync_scan_limit,
    )
    if backlog["exact"] and scan is not None:
        backlog = await settle_exact(broker, queue, counts, scan, backlog)

    levels = _levels(scan, now_ms=now_ms, max_wait_ms=max_wait_ms)
    overdue_total = None if scan is None else sum(levels[name]["overdue"] for name in levels)
    stats: dict[str, Any] = {
        "job_type": job_type,
        "queue": queue,
        "now_ms": now_ms,
        "read_at": moment(now_ms),
        "counts": counts,
        "waiting_total": total,
        "paused": reads.paused,
        "redis_memory": _memory(reads.memory),
        "max_wait_ms": max_wait_ms,
        "max_wait": format_duration(max_wait_ms),
        "interval_ms": settings.rebalance_interval_ms,
        "levels": levels,
        "unparsed": None if scan is None else _unparsed(scan),
        "overdue_total": overdue_total,
        "backlog": backlog,
        "order": _order(
            reads, total=total, page=page, per_page=per_page, now_ms=now_ms, max_wait_ms=max_wait_ms
        ),
        "limits": limits_section(reads.limited),
        "last_pass": _last_pass(reads.last_pass, now_ms=now_ms),
        "lock": _lock_info(reads.lock),
        "history": _history(
            reads.recorded,
            scan,
            now_ms=now_ms,
            max_wait_ms=max_wait_ms,
            minutes=clamp_window_min(history_minutes),
        ),
    }
    stats["warnings"] = queue_warnings(stats)
    return stats


@dataclass(frozen=True, slots=True)
class _QueueReads:
    """What one request reads of a queue (two gathers of typed reads)."""

    counts: dict[str, int]
    last_pass: dict[str, Any] | None
    lock: tuple[str | None, int]
    head: WaitingSnapshot
    rows: list[WaitingJob]
    recorded: HistoryRead
    paused: bool
    memory: MemoryState | None
    limited: LimitsStatus


async def _read_queue(
    broker: Broker,
    queue: str,
    *,
    start: int,
    per_page: int,
    window: int,
    now_ms: int,
    history_minutes: int,
) -> _QueueReads:
    counts, last_pass, lock, head, rows = await asyncio.gather(
        broker.passes.counts(queue),
        broker.passes.read_status(queue, LAST_RUN_RECORD),
        broker.lock.lock_holder(broker.fair_key(queue, "leader")),
        # The head the policy's order is compared with: O(window) however long the queue.
        broker.passes.read_head(queue, count=window),
        broker.dashboard.read_page(queue, start=start, count=per_page),
    )
    recorded, paused, memory, limited = await asyncio.gather(
        broker.history.read_history(
            queue, now_s=now_ms // 1000, window_s=clamp_window_min(history_minutes) * 60
        ),
        broker.dashboard.is_paused(queue),
        broker.dashboard.memory_state(),
        broker.limits.status(queue, held_ids=HELD_JOBS_SHOWN),
    )
    return _QueueReads(counts, last_pass, lock, head, rows, recorded, paused, memory, limited)


def _lock_info(lock: tuple[str | None, int]) -> dict[str, Any]:
    holder, ttl_ms = lock
    return {
        "holder": holder,
        "ttl_ms": ttl_ms if holder else None,
        "display": holder or "free (no rebalancer holds it)",
    }


def _order(
    reads: _QueueReads, *, total: int, page: int, per_page: int, now_ms: int, max_wait_ms: int
) -> dict[str, Any]:
    """A page of the waiting order, and how many of its head the pass has not placed."""
    start = (page - 1) * per_page
    num_pages = max(1, math.ceil(total / per_page))
    return {
        "page": page,
        "per_page": per_page,
        "num_pages": num_pages,
        "has_previous": page > 1,
        "has_next": page < num_pages,
        "first_position": start + 1,
        "jobs": _rows(reads.rows, start=start, now_ms=now_ms, max_wait_ms=max_wait_ms),
        "compared": len(reads.head.jobs),
        "drift_count": sum(1 for job in reads.head.jobs if is_unplaced(job)),
    }


def _history(
    recorded: HistoryRead, scan: BacklogScan | None, *, now_ms: int, max_wait_ms: int, minutes: int
) -> dict[str, Any]:
    """The last ``minutes`` of what workers started (recorded by the pass), with the jobs
    still waiting (from the backlog scan) counted as demand."""
    buckets = [
        parse_bucket(start, fields, tenants)
        for start, (fields, tenants) in recorded.buckets.items()
    ]
    waiting_now = None
    if scan is not None:
        waiting_now = {
            level: (found.waiting, found.oldest_ms) for level, found in scan.levels.items()
        }
    summary = summarize(
        buckets,
        now_ms=now_ms,
        window_s=minutes * 60,
        max_wait_ms=max_wait_ms,
        waiting_now=waiting_now,
        top_tenants=TOP_TENANTS,
    )
    return history_view(summary, now_ms=now_ms, since_ms=recorded.since_ms)


def is_unplaced(job: WaitingJob) -> bool:
    """Whether ``job`` waits outside fairqueue's tag order (the next pass adopts it)."""
    return job.in_wait_list or not TAG_FLOOR <= job.priority < MAX_PRIORITY


def _rows(
    jobs: list[WaitingJob],
    *,
    start: int,
    now_ms: int,
    max_wait_ms: int,
) -> list[dict[str, Any]]:
    rows = []
    for index, job in enumerate(jobs):
        position = start + index + 1
        pending = pending_from_job(job)
        ready_ms = job.ready_ms if job.ready_ms is not None else job.timestamp_ms
        waited_ms = None if ready_ms is None else max(0, now_ms - ready_ms)
        overdue = waited_ms is not None and waited_ms > max_wait_ms
        if pending is None:
            decision = "skipped"
        else:
            decision = AGED if overdue else WEIGHTED_FAIR
        tenant = job_tenant(job, pending.tenant_id) if pending else UNPARSED
        rows.append(
            {
                "position": position,
                "job_id": job.job_id,
                "name": job.name,
                "level": pending.priority_level.value if pending else UNPARSED,
                "tenant": tenant,
                "tenant_display": tenant_words(tenant),
                "decision_display": decision_words(decision),
                "enqueued_at_ms": job.timestamp_ms,
                "waited_ms": waited_ms,
                "waited": format_duration(waited_ms),
                "decision": decision,
                "overdue": overdue,
                "priority": job.priority,
                "drift": is_unplaced(job),
            }
        )
    return rows


def job_tenant(job: WaitingJob, flow_tenant: str) -> str | None:
    """The tenant a job was enqueued for, ``None`` for a job without one (whose flow is the
    default tenant's, which a tenant named "default" would share)."""
    if job.data is not None and job.data.get("tenantId") is None:
        return None
    return flow_tenant


def _levels(scan: BacklogScan | None, *, now_ms: int, max_wait_ms: int) -> dict[str, Any]:
    """Per-level rows, with bar lengths (percent) for the page's two small charts."""
    levels: dict[str, dict[str, Any]] = {}
    for level in LEVELS_BY_RANK:
        found = scan.levels.get(level.value) if scan is not None else None
        oldest_ms = found.oldest_ms if found else None
        age_ms = None if oldest_ms is None else max(0, now_ms - oldest_ms)
        tenants = (scan.tenants.get(level.value, {}) if scan is not None else {}).items()
        top = heapq.nsmallest(TOP_TENANTS, tenants, key=lambda item: (-item[1], item[0]))
        # The scan counts jobs without a tenant under "" (no tenant id is empty).
        shown = [(tenant or None, count) for tenant, count in top]
        levels[level.value] = {
            "weight": DEFAULT_FAIR_WEIGHTS[level],
            "waiting": None if scan is None else (found.waiting if found else 0),
            "overdue": None if scan is None else (found.overdue if found else 0),
            "oldest_ms": oldest_ms,
            "oldest_age_ms": age_ms,
            "oldest_age": format_duration(age_ms),
            "top_tenants": [
                {"tenant": tenant, "display": tenant_words(tenant), "waiting": count}
                for tenant, count in shown
            ],
        }
    most = max((row["waiting"] or 0 for row in levels.values()), default=0)
    age_scale = max([max_wait_ms] + [row["oldest_age_ms"] or 0 for row in levels.values()])
    for row in levels.values():
        row["waiting_pct"] = round(100 * (row["waiting"] or 0) / most, 1) if most else 0
        row["age_pct"] = round(100 * (row["oldest_age_ms"] or 0) / age_scale, 1)
        row["bound_pct"] = round(100 * max_wait_ms / age_scale, 1)
    return levels


def _unparsed(scan: BacklogScan) -> dict[str, int]:
    found = scan.levels.get(UNPARSED)
    return {"waiting": found.waiting if found else 0, "overdue": found.overdue if found else 0}


def _last_pass(record: dict[str, Any] | None, *, now_ms: int) -> dict[str, Any] | None:
    if not record:
        return None
    at_ms = record.get("at_ms")
    at_ms = at_ms if isinstance(at_ms, int) else None
    age_ms = None if at_ms is None else max(0, now_ms - at_ms)
    wrote: dict[str, int] = {
        name: value for name in PASS_COUNTS if isinstance(value := record.get(name), int)
    }
    duration = record.get("duration_ms")
    return {
        "at_ms": at_ms,
        "at": format_time(at_ms),
        "age_ms": age_ms,
        "age": format_duration(age_ms),
        "by": str(record.get("by") or "—"),
        "dry_run": bool(record.get("dry_run")),
        "duration_ms": round(duration, 1) if isinstance(duration, int | float) else None,
        "wrote": wrote,
        "summary": pass_words(wrote),
    }


def _memory(state: MemoryState | None) -> dict[str, Any] | None:
    if state is None:
        return None
    return {
        "used_bytes": state.used_bytes,
        "max_bytes": state.max_bytes,
        "policy": state.policy,
        "refuses_writes": state.refuses_writes,
    }
