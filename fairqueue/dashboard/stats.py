"""Dashboard statistics: one function, :func:`queue_stats`, feeds the admin page, its
JSON endpoint and anything else that wants a queue's live state.

Counts, the page of the order, the last pass and the lock are exact on every call,
O(page); what needs every waiting job's metadata (per-level waiting and overdue, top
tenants) is scanned on the request up to ``SYNC_SCAN_LIMIT`` jobs, above that served
from a per-process cache refreshed in the background (``backlog.exact`` says which;
docs/dashboard.md). The returned dict is plain JSON data, display strings beside raw
values, and no payloads.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from dataclasses import dataclass, replace
from typing import Any, Final

from fairqueue.broker import (
    STATUS_TENANTS,
    BacklogScan,
    Broker,
    HistoryRead,
    LimitsStatus,
    MemoryState,
    WaitingJob,
    WorkerProcess,
    get_sync_broker,
)
from fairqueue.conf import get_settings
from fairqueue.dashboard.account_rows import SERVED_TENANTS, queue_accounts
from fairqueue.dashboard.attention import memory_figures, queue_warnings

# The backlog scan's knobs and cache, where callers of the stats have always found them.
from fairqueue.dashboard.backlog_scans import SCAN_PAGE_SIZE as SCAN_PAGE_SIZE
from fairqueue.dashboard.backlog_scans import SYNC_SCAN_LIMIT
from fairqueue.dashboard.backlog_scans import clear_backlog_cache as clear_backlog_cache
from fairqueue.dashboard.backlog_scans import scans_in_flight as scans_in_flight
from fairqueue.dashboard.charts import history_view
from fairqueue.dashboard.culprits import note_held_levels, overdue_flows
from fairqueue.dashboard.failures import failures_figures, queue_failures
from fairqueue.dashboard.limited_tenants import HELD_JOBS_SHOWN, limits_section
from fairqueue.dashboard.moment import moment, read_checked_backlog, waiting_of
from fairqueue.dashboard.order_rows import UNPARSED, order_section
from fairqueue.dashboard.overview import anoisy_figures
from fairqueue.dashboard.wording import (
    format_duration,
    format_time,
    pass_words,
    tenant_words,
)
from fairqueue.dashboard.worker_list import workers_section
from fairqueue.enqueue.outbox import outbox_stats
from fairqueue.rebalance.pass_result import LAST_RUN_RECORD, PASS_COUNTS
from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, LEVELS_BY_RANK
from fairqueue.scheduling.shares import (
    DEFAULT_WINDOW_MIN,
    clamp_window_min,
    parse_bucket,
    summarize,
)

DEFAULT_PER_PAGE: Final = 20
MAX_PER_PAGE: Final = 200
TOP_TENANTS: Final = 5


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


# -- the stats ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatsAsk:
    """What a caller asks of the stats (:func:`queue_stats`' keyword arguments)."""

    page: int = 1
    per_page: int = DEFAULT_PER_PAGE
    now_ms: int | None = None
    sync_scan_limit: int = SYNC_SCAN_LIMIT
    history_minutes: int = DEFAULT_WINDOW_MIN
    #: Limited tenants listed at most (their totals count every one).
    listed: int = STATUS_TENANTS


def queue_stats(job_type: str, **ask: Any) -> dict[str, Any]:
    """Everything the dashboard shows about ``job_type``'s queue (sync callers); ``ask``:
    the fields of :class:`StatsAsk`.

    Raises:
        UnknownJobTypeError: ``job_type`` is not configured.
        BrokerUnavailableError: Redis could not be reached.
        BrokerRejectedError: Redis answered with an error (e.g. out of memory).
    """
    return queues_stats([job_type], StatsAsk(**ask))[0]


def queues_stats(job_types: list[str], ask: StatsAsk) -> list[dict[str, Any]]:
    """:func:`queue_stats` of each of ``job_types``, read at once on the broker's loop
    (one gather: a queue's reads wait for Redis while the others' are parsed), all as
    of one moment's clock. Raises as :func:`queue_stats`."""
    sync_broker = get_sync_broker()
    now_ms = int(time.time() * 1000) if ask.now_ms is None else ask.now_ms
    ask = replace(ask, now_ms=now_ms)
    minutes = clamp_window_min(ask.history_minutes)

    async def one(job_type: str) -> dict[str, Any]:
        stats, noisy, failures = await asyncio.gather(
            aqueue_stats(job_type, ask, broker=sync_broker.broker),
            anoisy_figures(job_type, broker=sync_broker.broker),
            queue_failures(
                sync_broker.broker,
                get_settings().queue_for(job_type),
                now_ms=now_ms,
                minutes=minutes,
            ),
        )
        await note_held_levels(sync_broker.broker, stats)
        return {**stats, "noisy": noisy, "failures": failures_figures(failures)}

    async def read_all() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(one(job_type) for job_type in job_types)))

    found = sync_broker.run(read_all)
    for stats in found:
        stats["outbox"] = outbox_figures(stats["job_type"])
        # its history's most served tenants by account (one database query); the
        # page lists the first few of them
        history = stats["history"]
        stats["accounts"] = queue_accounts(history["tenants"], history["served_total"])
        history["tenants"] = history["tenants"][:TOP_TENANTS]
    return found


def outbox_figures(job_type: str) -> dict[str, Any]:
    """The outbox depth of ``job_type`` and its oldest row's age (one database query;
    durable jobs the relay has not moved to Redis yet)."""
    found = outbox_stats(job_type)
    age_ms = found["oldest_age_ms"]
    return {**found, "oldest_age": format_duration(age_ms if isinstance(age_ms, int) else None)}


async def aqueue_stats(job_type: str, ask: StatsAsk, *, broker: Broker) -> dict[str, Any]:
    """:func:`queue_stats` for async callers, on ``broker``'s event loop (without the
    outbox, noisy and account figures, which :func:`queue_stats` adds from it)."""
    settings = get_settings()
    queue = settings.queue_for(job_type)
    now_ms = int(time.time() * 1000) if ask.now_ms is None else ask.now_ms
    max_wait_ms = settings.max_wait_ms
    page, per_page = clamp_page(ask.page, ask.per_page)
    minutes = clamp_window_min(ask.history_minutes)

    reads = await _read_queue(
        broker,
        queue,
        start=(page - 1) * per_page,
        per_page=per_page,
        window=settings.rebalance_window,
        now_ms=now_ms,
        window_s=minutes * 60,
        listed=ask.listed,
    )
    counts = reads.counts
    total = waiting_of(counts)
    limit = ask.sync_scan_limit
    scan, backlog = await read_checked_backlog(
        broker, queue, counts, now_ms=now_ms, max_wait_ms=max_wait_ms, sync_limit=limit
    )

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
        "redis_memory": memory_figures(reads.memory),
        "max_wait_ms": max_wait_ms,
        "max_wait": format_duration(max_wait_ms),
        "interval_ms": settings.rebalance_interval_ms,
        "levels": levels,
        "unparsed": None if scan is None else _unparsed(scan),
        "overdue_total": overdue_total,
        "overdue_flows": overdue_flows(scan),
        "backlog": backlog,
        "order": order_section(
            reads.rows, reads.head, total, page, per_page, now_ms=now_ms, max_wait_ms=max_wait_ms
        ),
        "limits": limits_section(reads.limited),
        "workers": workers_section(reads.workers, now_ms=now_ms),
        "last_pass": _last_pass(reads.last_pass, now_ms=now_ms),
        "lock": _lock_info(reads.lock),
        "history": _history(
            reads.recorded,
            scan,
            now_ms=now_ms,
            max_wait_ms=max_wait_ms,
            minutes=minutes,
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
    #: (jobs compared, of them unplaced) at the head of the order (the rebalance window).
    head: tuple[int, int]
    rows: list[WaitingJob]
    recorded: HistoryRead
    paused: bool
    memory: MemoryState | None
    limited: LimitsStatus
    workers: list[WorkerProcess]


async def _read_queue(
    broker: Broker,
    queue: str,
    *,
    start: int,
    per_page: int,
    window: int,
    now_ms: int,
    window_s: int,
    listed: int,
) -> _QueueReads:
    counts, last_pass, lock, head, rows = await asyncio.gather(
        broker.passes.counts(queue),
        broker.passes.read_status(queue, LAST_RUN_RECORD),
        broker.lock.lock_holder(broker.fair_key(queue, "leader")),
        # The head the policy's order is compared with, from its scores: O(log n).
        broker.dashboard.head_unplaced(queue, window=window),
        broker.dashboard.read_page(queue, start=start, count=per_page),
    )
    recorded, paused, memory, limited, workers = await asyncio.gather(
        broker.history.read_history(queue, now_s=now_ms // 1000, window_s=window_s),
        broker.dashboard.is_paused(queue),
        broker.dashboard.memory_state(),
        broker.limits.status(queue, listed=listed, held_ids=HELD_JOBS_SHOWN),
        broker.workers.processes(queue, now_ms=now_ms),
    )
    return _QueueReads(
        counts, last_pass, lock, head, rows, recorded, paused, memory, limited, workers
    )


def _lock_info(lock: tuple[str | None, int]) -> dict[str, Any]:
    holder, ttl_ms = lock
    return {
        "holder": holder,
        "ttl_ms": ttl_ms if holder else None,
        "display": holder or "free (no rebalancer holds it)",
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
        top_tenants=SERVED_TENANTS,
    )
    return history_view(summary, now_ms=now_ms, since_ms=recorded.since_ms)


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
