"""The breaker for poison tenants: a tenant whose attempts of one job type (nearly) all
fail has its jobs of that type held, then tried again one job at a time
(docs/usage.md#the-breaker).

It counts attempts (a failed attempt with attempts left, or a stalled one, is a
failure), per tenant and job type, in a sliding window of ``WINDOW_S`` seconds kept in
the loop's memory in :data:`BUCKETS` buckets (no Redis read). At ``MIN_JOBS`` attempts
and a ``FAILURE_RATIO`` failed share (:func:`failing`) it opens: the tenant is held in
the job type's queue (:mod:`fairqueue.usage.holds`), audited and counted; after
``COOL_OFF_S`` one held job is released as the probe, whose success closes it and whose
failure reopens it. :func:`close_breaker` closes it by hand. A loop restart forgets the
windows; the holds live in the database.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
from collections.abc import Iterable
from typing import Any, Final

from django.db import transaction

from fairqueue.broker import get_sync_broker
from fairqueue.conf import get_settings
from fairqueue.conf.usage_settings import BreakerSettings
from fairqueue.scheduling.levels import INTERNAL_TENANT, validate_tenant_id
from fairqueue.usage.holds import (
    audit_hold,
    end_hold,
    held_queues,
    now,
    pause_in,
    paused_by_operator,
    queues_of,
)
from fairqueue.usage.holds import resume_in as _resume_in
from fairqueue.usage.ledger import Change, Written

logger = logging.getLogger("fairqueue.breaker")

ACTOR: Final = "fairqueue breaker"
#: The window is kept in this many buckets per tenant and job type.
BUCKETS: Final = 10


class Windows:
    """Attempts completed and failed per (tenant, job type) over the last window, in
    :data:`BUCKETS` buckets: memory bounded by the rows that changed within a window."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (tenant, job type) -> bucket number -> [completed, failed]
        self._rows: dict[tuple[str, str], dict[int, list[int]]] = {}
        self._pruned = 0

    @staticmethod
    def _bucket(at_s: float, window_s: int) -> int:
        return math.floor(at_s * BUCKETS / window_s)

    def add(
        self, key: tuple[str, str], at_s: float, completed: int, failed: int, window_s: int
    ) -> tuple[int, int]:
        """Add a write's change at ``at_s``; returns the window's (completed, failed)."""
        bucket = self._bucket(at_s, window_s)
        oldest = bucket - BUCKETS + 1
        with self._lock:
            if bucket - self._pruned >= BUCKETS:
                self._prune(oldest)
                self._pruned = bucket
            row = self._rows.setdefault(key, {})
            for old in [b for b in row if b < oldest]:
                del row[old]
            counts = row.setdefault(bucket, [0, 0])
            counts[0] += max(0, completed)
            counts[1] += max(0, failed)
            return sum(c[0] for c in row.values()), sum(c[1] for c in row.values())

    def _prune(self, oldest: int) -> None:
        for key in [k for k, row in self._rows.items() if max(row, default=oldest - 1) < oldest]:
            del self._rows[key]

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._rows.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
            self._pruned = 0

    def __len__(self) -> int:
        return len(self._rows)


#: The loop process's windows (one loop per process).
windows = Windows()


def failing(completed: int, failed: int, settings: BreakerSettings) -> bool:
    """The breaker's rule: of the attempts that ended in the window, ``completed``
    completed and ``failed`` failed (retried or not) or were lost with their worker; it
    opens when at least ``MIN_JOBS`` ended and the failed share reaches
    ``FAILURE_RATIO``."""
    ended = completed + failed
    return ended >= settings.min_jobs and failed >= settings.failure_ratio * ended


def attempt_outcomes(changes: Iterable[Change]) -> tuple[int, int]:
    """Attempts completed and attempts failed in a write's changes of one row: a failed
    attempt with attempts left is a failure (its job's retry is another attempt), and so
    is a stall (its worker died)."""
    completed = sum(max(0, c.completed) for c in changes)
    failed = sum(max(0, c.failed) + max(0, c.lost) for c in changes)
    return completed, failed


def after_write(queue: str, written: Written) -> None:
    """The loop's breaker step for ``queue`` after a ledger write: open the breakers of
    the rows failing over their window, release the probes whose cool-off ended, close or
    reopen on the probes' outcomes, and set ``queue_fair_breaker_open``.

    A failure of one breaker's transition does not stop the others; the first is raised
    at the end (the usage step logs it by class and tries again next step). A breaker
    that failed to change stays as it was: held.
    """
    from fairqueue.models import TenantHold

    settings = get_settings()
    config = settings.breaker
    job_types = sorted(jt for jt, q in settings.queues.items() if q == queue)
    active = {
        (hold.tenant_id, hold.job_type): hold
        for hold in TenantHold.objects.filter(
            reason=TenantHold.BREAKER, lifted_at__isnull=True, job_type__in=job_types
        )
    }
    errors: list[Exception] = []
    at = now()
    by_row: dict[tuple[str, str], list[Change]] = {}
    for change in written.changes:
        if change.job_type in job_types:
            by_row.setdefault((change.tenant_id, change.job_type), []).append(change)
    if config.enabled:
        for key, changes in by_row.items():
            if key in active or key[0] == INTERNAL_TENANT:
                continue  # a probe's outcome, read below; internal work is never held
            completed, failed = attempt_outcomes(changes)
            if not completed and not failed:
                continue
            seen = windows.add(key, at.timestamp(), completed, failed, config.window_s)
            if failing(*seen, config):
                try:
                    active[key] = open_breaker(key[0], key[1], *seen, config=config)
                except Exception as exc:  # held or not, as Redis and the database say
                    errors.append(exc)
    for key, hold in list(active.items()):
        try:
            if hold.lifted_at is not None:
                continue
            if hold.state == TenantHold.PROBE:
                _check_probe(queue, hold, by_row.get(key, []), config)
            elif hold.until is None or hold.until <= at:
                _release_probe(queue, hold)
        except Exception as exc:  # stays as it was (held) until a step succeeds
            errors.append(exc)
    _set_gauge(job_types, [hold for hold in active.values() if hold.lifted_at is None])
    if errors:
        raise errors[0]


def _set_gauge(job_types: Iterable[str], holds: Iterable[Any]) -> None:
    from fairqueue.metrics import by_job_type, get_metrics

    counts = dict.fromkeys(job_types, 0)
    for hold in holds:
        counts[hold.job_type] = counts.get(hold.job_type, 0) + 1
    gauge = get_metrics().breaker_open
    for job_type, count in counts.items():
        by_job_type(gauge, job_type).set(count)


def open_breaker(
    tenant_id: str, job_type: str, completed: int, failed: int, *, config: BreakerSettings
) -> Any:
    """Hold ``tenant_id``'s jobs of ``job_type``: Redis first (as ``pause_tenant``
    does), undone if the database write fails. Returns the ``TenantHold``."""
    from fairqueue.models import TenantHold

    queues = queues_of(job_type)
    pause_in(queues, tenant_id)
    at = now()
    try:
        with transaction.atomic():
            hold = TenantHold.objects.create(
                tenant_id=tenant_id,
                job_type=job_type,
                reason=TenantHold.BREAKER,
                action=TenantHold.HOLD,
                state=TenantHold.OPEN,
                created_at=at,
                until=at + dt.timedelta(seconds=config.cool_off_s),
            )
            audit_hold(
                hold,
                event="opened",
                actor=ACTOR,
                why=f"{failed} of {completed + failed} attempts failed (retried or not, or "
                f"stalled) in the last {config.window_s} s (opens at "
                f"{config.failure_ratio:g} of at least {config.min_jobs}); a probe after "
                f"{config.cool_off_s} s",
            )
    except Exception:
        _resume_in(queues, tenant_id)
        raise
    windows.forget((tenant_id, job_type))
    logger.warning("a breaker opened for job type %s: its tenant's jobs are held", job_type)
    return hold


def _release_probe(queue: str, hold: Any) -> None:
    """After the cool-off: release one held job as the probe, unless something else (an
    operator's pause, a quota, another breaker of the queue) holds the tenant here."""
    from fairqueue.models import TenantHold

    if paused_by_operator(hold.tenant_id) or queue in held_queues(
        hold.tenant_id, excluding=hold.pk
    ):
        return
    sync_broker = get_sync_broker()
    limits = sync_broker.broker.limits
    job_id = sync_broker.run(limits.probe, queue, hold.tenant_id)
    if job_id is None:
        return  # nothing held: the tenant's next job is the probe
    outcome = sync_broker.run(limits.job_outcome, queue, job_id)
    with transaction.atomic():
        hold.state = TenantHold.PROBE
        hold.probe_job_id = job_id
        hold.probe_attempts = outcome.attempts_made
        hold.save(update_fields=["state", "probe_job_id", "probe_attempts"])
        audit_hold(
            hold,
            event="probe",
            actor=ACTOR,
            why=f"cool-off over: job {job_id} released as the probe",
        )


def _check_probe(queue: str, hold: Any, changes: list[Change], config: BreakerSettings) -> None:
    """Close on the probe's success, reopen on its failure, else wait. A probe whose job
    is gone (removed on completion or failure) is judged by the ledger's change of its
    row; with none, another cool-off then another probe."""
    sync_broker = get_sync_broker()
    outcome = sync_broker.run(sync_broker.broker.limits.job_outcome, queue, hold.probe_job_id)
    if outcome.completed:
        _close(hold, event="closed", actor=ACTOR, why=f"probe {hold.probe_job_id} completed")
    elif outcome.failed or outcome.attempts_made > hold.probe_attempts:
        _reopen(hold, config, f"probe {hold.probe_job_id} failed")
    elif not outcome.exists:
        if any(c.failed for c in changes):
            _reopen(hold, config, f"probe {hold.probe_job_id} failed (its job is gone)")
        elif any(c.completed for c in changes):
            _close(hold, event="closed", actor=ACTOR, why=f"probe {hold.probe_job_id} completed")
        else:
            _reopen(hold, config, f"probe {hold.probe_job_id} is gone without an outcome")


def _reopen(hold: Any, config: BreakerSettings, why: str) -> None:
    from fairqueue.models import TenantHold

    at = now()
    with transaction.atomic():
        hold.state = TenantHold.OPEN
        hold.until = at + dt.timedelta(seconds=config.cool_off_s)
        hold.probe_job_id = ""
        hold.probe_attempts = 0
        hold.save(update_fields=["state", "until", "probe_job_id", "probe_attempts"])
        audit_hold(
            hold,
            event="reopened",
            actor=ACTOR,
            why=f"{why}; another probe after {config.cool_off_s} s",
        )


def _close(hold: Any, *, event: str, actor: object, why: str) -> None:
    end_hold(hold, event=event, actor=actor, why=why)
    windows.forget((hold.tenant_id, hold.job_type))
    # After the commit: a failure here leaves the tenant held (never the reverse); the
    # operator closes again, or an operator's resume lifts it.
    _resume_in(queues_of(hold.job_type), hold.tenant_id, excluding=hold.pk)


def close_breaker(
    tenant_id: str, job_type: str | None = None, *, actor: object = None, source: str = ""
) -> int:
    """Close a tenant's open breakers by hand (of ``job_type`` only, unless ``None``):
    its held jobs of that type are released, unless something else holds the tenant (an
    operator's pause, a quota). Audited (``HoldAudit``, event ``closed``, ``actor``).

    Returns:
        How many breakers were open and are now closed.

    Raises:
        InvalidTenantError: ``tenant_id`` is not a tenant id.
        UnknownJobTypeError: ``job_type`` is not configured.
        BrokerError: Redis failed after the breaker was closed in the database; the
            tenant stays held there: call again, or resume it.
    """
    from fairqueue.models import TenantHold

    tenant_id = validate_tenant_id(tenant_id, none_allowed=False)
    holds = TenantHold.objects.filter(
        tenant_id=tenant_id, reason=TenantHold.BREAKER, lifted_at__isnull=True
    )
    if job_type is not None:
        get_settings().queue_for(job_type)
        holds = holds.filter(job_type=job_type)
    closed = 0
    for hold in holds:
        _close(hold, event="closed", actor=actor, why=source or "closed by an operator")
        closed += 1
    if closed:
        logger.info("%d breaker(s) closed by hand", closed)
    return closed


def breaker_status(*, limit: int = 50) -> list[dict[str, Any]]:
    """The open breakers (probing included), oldest first, at most ``limit``: what the
    dashboard lists."""
    from fairqueue.models import TenantHold

    rows = TenantHold.objects.filter(reason=TenantHold.BREAKER, lifted_at__isnull=True).order_by(
        "created_at", "tenant_id"
    )[:limit]
    return [
        {
            "tenant_id": hold.tenant_id,
            "job_type": hold.job_type,
            "state": hold.state,
            "since": hold.created_at,
            "probe_at": hold.until if hold.state == TenantHold.OPEN else None,
            "probe_job_id": hold.probe_job_id or None,
        }
        for hold in rows
    ]
