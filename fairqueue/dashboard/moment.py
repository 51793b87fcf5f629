"""Which moment a page's numbers are from, and whether its counts agree.

BullMQ's counts and the by-level scan are separate reads: jobs that arrive, start or
move between them (or while the scan pages through the queue) made the page say
"Waiting in all 158" beside "all 182 waiting jobs scanned". The scan is bracketed by two
reads of BullMQ's counts: when both equal what the scan read, nothing moved and the
numbers agree; otherwise the page says the queue moved and by how much, rather than
calling the scan exact.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fairqueue.broker import BacklogScan, Broker
from fairqueue.dashboard.backlog_scans import SYNC_SCAN_LIMIT, read_backlog


def waiting_of(counts: dict[str, int]) -> int:
    """Waiting jobs as BullMQ counts them: its wait list and its prioritized set."""
    return counts["wait"] + counts["prioritized"]


def moment(now_ms: int) -> dict[str, Any]:
    """When a page's numbers were read, for the page to say so."""
    at = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    return {"at_ms": now_ms, "at": at.strftime("%Y-%m-%d %H:%M:%S.") + f"{now_ms % 1000:03d} UTC"}


async def settle_exact(
    broker: Broker,
    queue: str,
    counts: dict[str, int],
    scan: BacklogScan,
    backlog: dict[str, Any],
) -> dict[str, Any]:
    """The exact scan's note, checked against BullMQ's counts read again after it."""
    after = await broker.passes.counts(queue)
    before_n, after_n = waiting_of(counts), waiting_of(after)
    agrees = before_n == after_n == scan.scanned
    if agrees:
        note = (
            f"Exact: BullMQ counts {after_n} waiting jobs and the scan read each of them "
            "for this request (nothing moved meanwhile)."
        )
    else:
        note = (
            f"The queue moved while it was read: BullMQ counted {before_n} waiting jobs "
            f"before the by-level scan and {after_n} after it, and the scan read "
            f"{scan.scanned} (a job that moves during the scan can be missed or read "
            "twice). The by-level numbers are the scan's; BullMQ's counts above are from "
            "before it."
        )
    return {**backlog, "agrees": agrees, "waiting_after": after_n, "note": note}


async def read_checked_backlog(
    broker: Broker,
    queue: str,
    counts: dict[str, int],
    *,
    now_ms: int,
    max_wait_ms: int,
    sync_limit: int = SYNC_SCAN_LIMIT,
) -> tuple[BacklogScan | None, dict[str, Any]]:
    """The by-level scan of ``queue``'s waiting jobs (:func:`read_backlog`), an exact one
    checked against BullMQ's ``counts`` read again after it (:func:`settle_exact`): what
    the queue, tenant and account pages read, so they show one number."""
    scan, backlog = await read_backlog(
        broker,
        queue,
        total=waiting_of(counts),
        now_ms=now_ms,
        max_wait_ms=max_wait_ms,
        sync_limit=sync_limit,
    )
    if backlog["exact"] and scan is not None:
        backlog = await settle_exact(broker, queue, counts, scan, backlog)
    return scan, backlog
