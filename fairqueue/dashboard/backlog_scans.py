"""The backlog scan behind the dashboard's per-level numbers: on the request while the
backlog is small (exact, as of the request), else from a per-process cache refreshed in
the background (on the broker's event loop, never awaited by a request), which the
page says it shows, with its age. :mod:`fairqueue.dashboard.stats` describes what each
costs."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from fairqueue.broker import BacklogScan, Broker
from fairqueue.dashboard.wording import format_duration

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


async def read_backlog(
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
