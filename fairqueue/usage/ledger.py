"""The usage ledger's database side: the loop writes Redis's per-day counters into
``TenantUsage`` (docs/usage.md).

Redis holds each day's cumulative counters per tenant and job type, counted by the
history step with the page they come from (once or not at all). The loop reads the rows
changed since it last wrote them and writes their *absolute* values, per epoch, merging
with what the row holds by taking the larger of each counter. So:

* a loop killed -9 after Redis counted and before the database write only leaves the
  rows dirty: the next loop writes them (nothing lost, nothing twice);
* a row written twice is unchanged the second time;
* Redis losing the day's counters (a restart without persistence) starts a new epoch,
  so what the database already had is kept and the new counters add to it.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Q

from fairqueue.broker import UsageRead, get_sync_broker
from fairqueue.conf import get_settings
from fairqueue.scheduling.usage import Ledger, UsageValues, total

logger = logging.getLogger("fairqueue.usage")

#: The epoch a day's counters get when this process's history step creates them.
_EPOCH = secrets.token_hex(6)
#: Rows one write reads from Redis and writes in one transaction.
WRITE_BATCH = 500


def ledger_for(queue: str) -> Ledger | None:
    """What the history step of ``queue`` counts into the ledger (``None``: the ledger
    is off, ``FAIRQUEUE['USAGE_LEDGER'] = False``)."""
    settings = get_settings()
    if not settings.usage_ledger:
        return None
    job_types = tuple(sorted(jt for jt, q in settings.queues.items() if q == queue))
    return Ledger(job_types=job_types, epoch=_EPOCH)


@dataclass(frozen=True, slots=True)
class Change:
    """What one write added to a row (for quotas and the breaker)."""

    tenant_id: str
    job_type: str
    day: dt.date
    completed: int
    failed: int
    worker_ms: int
    #: Of ``failed``, the attempts that had attempts left (the job was retried).
    retried: int = 0
    #: Attempts started.
    started: int = 0
    #: Attempts lost: their worker died (BullMQ's stalled-job check put the job back).
    lost: int = 0


@dataclass(slots=True)
class Written:
    """What :func:`write_usage` did."""

    rows: int = 0
    changes: list[Change] = field(default_factory=list)
    #: Rows still dirty in Redis (more to write at the next call).
    more: bool = False


def write_usage(queue: str, *, batch: int = WRITE_BATCH) -> Written:
    """Write up to ``batch`` changed rows of ``queue``'s ledger to the database.

    Raises:
        BrokerError: Redis failed (nothing was marked written: the next call retries).
        DatabaseError: the database failed (the rows stay dirty in Redis).
    """
    sync_broker = get_sync_broker()
    store = sync_broker.broker.usage
    reads: list[UsageRead] = sync_broker.run(store.read_dirty, queue, batch)
    result = Written(more=len(reads) >= batch)
    if not reads:
        return result
    result.changes = _upsert([read for read in reads if read.epoch is not None])
    result.rows = len(reads)
    sync_broker.run(store.mark_written, queue, reads)
    return result


def _day(text: str) -> dt.date:
    return dt.date(int(text[:4]), int(text[4:6]), int(text[6:8]))


def _upsert(reads: Sequence[UsageRead]) -> list[Change]:
    """Merge ``reads`` into their rows in one transaction (absolute values per epoch)."""
    from fairqueue.models import TenantUsage

    if not reads:
        return []
    wanted = {(r.tenant, r.job_type, _day(r.day)): r for r in reads}
    match = Q()
    for tenant, job_type, day in wanted:
        match |= Q(tenant_id=tenant, job_type=job_type, day=day)
    changes: list[Change] = []
    with transaction.atomic():
        existing = {
            (row.tenant_id, row.job_type, row.day): row
            for row in TenantUsage.objects.select_for_update().filter(match)
        }
        new_rows, changed_rows = [], []
        for key, read in wanted.items():
            row = existing.get(key)
            if row is None:
                row = TenantUsage(tenant_id=key[0], job_type=key[1], day=key[2], segments={})
                new_rows.append(row)
            else:
                changed_rows.append(row)
            segments = dict(row.segments or {})
            before = UsageValues.from_list(segments.get(str(read.epoch), []))
            after = before.merged(read.values)
            segments[str(read.epoch)] = after.as_list()
            _apply(row, segments)
            changes.append(
                Change(
                    key[0],
                    key[1],
                    key[2],
                    after.completed - before.completed,
                    after.failed - before.failed,
                    after.worker_ms - before.worker_ms,
                    after.retried - before.retried,
                    after.attempts - before.attempts,
                    after.lost - before.lost,
                )
            )
        if new_rows:
            TenantUsage.objects.bulk_create(new_rows)
        if changed_rows:
            TenantUsage.objects.bulk_update(
                changed_rows,
                [
                    "segments",
                    "attempts",
                    "completed",
                    "failed",
                    "worker_ms",
                    "wait_ms_total",
                    "wait_ms_max",
                    "updated_at",
                ],
            )
    return changes


def _apply(row: object, segments: dict[str, list[int]]) -> None:
    sums = total(segments)
    row.segments = segments  # type: ignore[attr-defined]
    row.attempts = sums.attempts  # type: ignore[attr-defined]
    row.completed = sums.completed  # type: ignore[attr-defined]
    row.failed = sums.failed  # type: ignore[attr-defined]
    row.worker_ms = sums.worker_ms  # type: ignore[attr-defined]
    row.wait_ms_total = sums.wait_ms_total  # type: ignore[attr-defined]
    row.wait_ms_max = sums.wait_ms_max  # type: ignore[attr-defined]
    row.updated_at = dt.datetime.now(dt.UTC)  # type: ignore[attr-defined]


def write_all_usage(queue: str, *, rounds: int = 20) -> Written:
    """:func:`write_usage` until nothing is dirty (at most ``rounds`` batches)."""
    done = Written()
    for _ in range(rounds):
        step = write_usage(queue)
        done.rows += step.rows
        done.changes += step.changes
        done.more = step.more
        if not step.more:
            break
    return done
