"""The transactional outbox's relay: move durable jobs from the database to BullMQ.

A durable enqueue writes an :class:`~fairqueue.models.OutboxJob` row in the caller's
transaction; the relay adds each row's job through the same add script as a direct
enqueue, under the row's BullMQ id, then deletes the row in the transaction that
follows the add. A relay that dies between the two adds it again under the same id,
which BullMQ answers by keeping the existing job; rows are claimed with ``SELECT ...
FOR UPDATE SKIP LOCKED`` where the database has it (SQLite: run one relay). The
``rebalance_fair`` loop, ``manage.py fairqueue_relay`` and a durable enqueue's own
best-effort try after commit all relay (docs/enqueueing.md, "Durable enqueue").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from django.db import transaction
from django.db.models import Count, Min, Q
from django.utils import timezone

from fairqueue.broker import BACK_OF_LINE, NewJob, get_sync_broker, refuses_every_write
from fairqueue.conf import get_settings
from fairqueue.enqueue.priority import resolve_account_limits, tenant_limits
from fairqueue.exceptions import (
    BrokerRejectedError,
    BrokerUnavailableError,
    TenantBacklogFullError,
)
from fairqueue.metrics import by_job_type, get_metrics, record_enqueue
from fairqueue.scheduling.hierarchy import ACCOUNT_MARK
from fairqueue.scheduling.levels import (
    DEFAULT_TENANT,
    INTERNAL_TENANT,
    PAYLOAD_ACCOUNT_KEY,
    PriorityLevel,
)
from fairqueue.scheduling.limits import NO_LIMITS
from fairqueue.scheduling.wire import add_encoded_limits, encoded_limits

logger = logging.getLogger("fairqueue.outbox")

#: ``last_error`` of a row whose fairqueue-chosen job id held another job.
JOB_ID_COLLISION: Final = "JobIdCollision"
#: ``last_error`` of a row refused because its tenant is at its ``max_waiting``.
REFUSED_BACKLOG_FULL: Final = "TenantBacklogFull"
#: The longest a refused row waits between tries (its backoff doubles up to this).
RETRY_MAX_S: Final = 300

#: Rows claimed per transaction (one add-script call per queue for undelayed jobs).
RELAY_BATCH_SIZE: Final = 250
#: Batches per relay run at most (10,000 rows), so a run stays bounded.
RELAY_MAX_BATCHES: Final = 40
#: Tenants at their ``max_waiting`` a relay run meets at most: each costs one refused add
#: (the add script names one full tenant per call), so past this many the run ends and
#: the rows it did not reach wait for the next run, untried. The loop relays between its
#: release steps: a run full of refusals must not hold them up.
RELAY_MAX_FULL_TENANTS: Final = 16


@dataclass(slots=True)
class RelayResult:
    """What one relay run did (counts only)."""

    #: Rows whose job Redis now has, and deleted.
    sent: int = 0
    #: Of those, jobs that were already in Redis (a retry after a crash, or a caller's
    #: ``job_id`` that exists): nothing was added for them.
    existing: int = 0
    #: Rows Redis refused (kept, tried again behind the others).
    refused: int = 0
    #: Of those, rows whose fairqueue-chosen id held another job (kept, reported).
    collisions: int = 0
    #: The Redis error with which Redis refused every write, if it did (the run
    #: stopped at its first add).
    refusing: str | None = None
    #: (queue, tenant) at its ``max_waiting`` in this run: its other rows are not
    #: claimed again by this run (the next one tries them), so a tenant with thousands
    #: of refused rows costs a run one refused add, not one per batch.
    full: set[tuple[str, str]] = field(default_factory=set)

    def summary(self) -> str:
        text = f"outbox: sent={self.sent} existing={self.existing} refused={self.refused}"
        if self.collisions:
            text += f" collisions={self.collisions}"
        return text


def _new_job(row, now: datetime) -> NewJob:
    delay_ms = None
    if row.delay_ms:
        # The delay counts from the durable enqueue, not from the relay.
        elapsed_ms = int((now - row.created_at).total_seconds() * 1000)
        delay_ms = max(0, row.delay_ms - elapsed_ms) or None
    from fairqueue.enqueue.lookups import lookup_account_weight  # the models: lazily

    data = json.loads(row.data)
    account = data.get(PAYLOAD_ACCOUNT_KEY) if isinstance(data, dict) else None
    # its account's weight now (an account deleted since: the tenant is its own account)
    account_weight = lookup_account_weight(account) if isinstance(account, str) else None
    of_account = resolve_account_limits(account) if account_weight is not None else None
    limits = _limits_of(row.tenant)
    if limits is None and of_account is not None:  # held for its account's limits
        limits = add_encoded_limits(NO_LIMITS)
    return NewJob(
        name=row.job_type,
        data=data,
        level=PriorityLevel(row.level),
        job_id=row.bullmq_job_id,
        delay_ms=delay_ms,
        attempts=row.attempts,
        backoff=row.backoff,
        cost_ms=row.cost_ms,
        tenant=row.tenant,
        tenant_weight=row.tenant_weight,
        limits=limits,
        account=account if account_weight is not None else None,
        account_weight=account_weight or 1,
        account_limits=None if of_account is None else encoded_limits(of_account),
    )


def _limits_of(tenant: str) -> str | None:
    """The encoded limits of a row's tenant (``None``: none, or an internal job)."""
    if tenant in (DEFAULT_TENANT, INTERNAL_TENANT):
        return None
    limits = tenant_limits(tenant)
    return add_encoded_limits(limits) if limits.holds else None


class _ServerRefusal(Exception):
    """Redis refuses every write (out of memory, read-only, an ACL): the run stops."""

    def __init__(self, error: BrokerRejectedError) -> None:
        super().__init__(error.redis_error)
        self.error = error


def _same_job(row, stored: tuple[str, str] | None) -> bool:
    """Whether ``stored`` (name, data) is the job ``row`` describes."""
    if stored is None:
        return False
    name, data = stored
    try:
        return name == row.job_type and json.loads(data) == json.loads(row.data)
    except ValueError:
        return False


def _checks_collisions(row) -> bool:
    """Rows whose id fairqueue chose: an existing job of that id must be this row's own
    (a relay that crashed after its add). A caller's ``job_id`` is an idempotency key:
    an existing job of that id is the point, whatever its payload."""
    from fairqueue.models import OUTBOX_JOB_ID_PREFIX

    return not row.job_id or row.job_id.startswith(OUTBOX_JOB_ID_PREFIX)


def retry_delay(tries: int) -> timedelta:
    """How long a row refused ``tries`` times waits before its next try: one second,
    doubling, at most :data:`RETRY_MAX_S`. A refusal (a tenant at its ``max_waiting``,
    a job Redis will not take) is the row's own: other rows go on meanwhile."""
    return timedelta(seconds=min(RETRY_MAX_S, 2 ** max(0, tries - 1)))


def _refuse(row, error: str, result: RelayResult, now: datetime) -> bool:
    """Count a refusal of ``row`` and set its next try; whether its error changed (a
    state change: the caller logs one line, not one per try)."""
    return bool(_refuse_all([row], error, result, now))


def _refuse_all(rows: Sequence, error: str, result: RelayResult, now: datetime) -> list:
    """:func:`_refuse` of several rows in one UPDATE (a full tenant's rows of a batch):
    the rows whose error changed."""
    from fairqueue.models import OutboxJob

    error = error[:200]
    changed = [row for row in rows if error != row.last_error]
    for row in rows:
        row.tries += 1
        row.last_error = error
        row.retry_at = now + retry_delay(row.tries)
    OutboxJob.objects.using(rows[0]._state.db).bulk_update(
        rows, ["tries", "last_error", "retry_at"]
    )
    result.refused += len(rows)
    return changed


def _settle_existing(queue: str, rows: Sequence, result: RelayResult) -> list[int]:
    """Of ``rows`` whose id BullMQ already had: the pks of those whose existing job is
    their own; the others keep their rows, reported as a collision (never deleted: their
    job was not added)."""
    sync = get_sync_broker()
    checked = [row for row in rows if _checks_collisions(row)]
    stored = sync.run(
        sync.broker.results.stored_payloads, queue, [row.bullmq_job_id for row in checked]
    )
    collided = {
        row.pk for row, found in zip(checked, stored, strict=True) if not _same_job(row, found)
    }
    done = []
    for row in rows:
        if row.pk not in collided:
            result.existing += 1
            done.append(row.pk)
            continue
        changed = _refuse(row, JOB_ID_COLLISION, result, timezone.now())
        result.collisions += 1
        if not changed:
            continue  # logged when it first collided
        # The id only: the payload and the tenant are user data.
        logger.warning(
            "outbox row %s: job id %s already holds another job in queue %s; the row "
            "is kept (last_error %s) and its job was not added",
            row.pk,
            row.bullmq_job_id,
            queue,
            JOB_ID_COLLISION,
        )
    return done


def _add_rows(queue: str, rows: Sequence, now: datetime, result: RelayResult) -> list[int]:
    """Add ``rows``' jobs to ``queue``; the pks of the rows Redis now has. Raises
    BrokerUnavailableError if Redis is unreachable (the rows stay), _ServerRefusal if
    Redis refuses writes in general (the rows stay, untouched but for ``last_error``)."""
    broker = get_sync_broker()
    try:
        jobs = [_new_job(row, now) for row in rows]
        added = broker.add_jobs(queue, jobs)
    except BrokerUnavailableError:
        raise
    except TenantBacklogFullError as exc:
        # As many of that tenant's (or account's) rows as it has room for go on (oldest
        # first), with the other rows, in one add, not one by one; the rest wait, each
        # its own backoff (rows are separate enqueues, not one batch).
        account = getattr(exc, "account_id", None)
        theirs = {
            row.pk
            for row, job in zip(rows, jobs, strict=True)
            if (job.account == account if account is not None else row.tenant == exc.tenant_id)
        }
        mine = [row for row in rows if row.pk in theirs]
        fit = mine[: max(0, exc.limit - exc.waiting)]
        if len(fit) == len(mine):  # refused though they all seemed to fit (a race)
            fit = []
        full = mine[len(fit) :]
        result.full.add((queue, exc.tenant_id or ACCOUNT_MARK + str(account)))
        for row in _refuse_all(full, REFUSED_BACKLOG_FULL, result, now) if full else []:
            logger.warning(
                "outbox row %s: refused, its tenant is at its max_waiting in queue %s; "
                "tried again with a backoff (up to %d s)",
                row.pk,
                queue,
                RETRY_MAX_S,
            )
        rest = [row for row in rows if row.pk not in theirs] + fit
        if len(result.full) >= RELAY_MAX_FULL_TENANTS:
            return []  # the rest waits for the next run, untried (see RelayResult.full)
        return _add_rows(queue, rest, now, result) if rest and full else []
    except BrokerRejectedError as exc:
        if refuses_every_write(exc):
            raise _ServerRefusal(exc) from exc
        return _refused(queue, rows, now, result, exc.redis_error)
    except Exception as exc:
        return _refused(queue, rows, now, result, type(exc).__name__)
    done, existing = [], []
    for row, job in zip(rows, added, strict=True):
        if job.priority is None:
            existing.append(row)
            continue
        done.append(row.pk)
        if row.tries:  # a state change: it was refused before
            logger.info("outbox row %s: sent after %d refused tries", row.pk, row.tries)
        record_enqueue(
            queue, row.job_type, PriorityLevel(row.level), placed=job.priority < BACK_OF_LINE
        )
    return done + _settle_existing(queue, existing, result)


def _refused(queue: str, rows: Sequence, now: datetime, result: RelayResult, error: str):
    if len(rows) > 1:  # find the row Redis refuses; send the others
        done: list[int] = []
        for row in rows:
            done += _add_rows(queue, [row], now, result)
        return done
    row = rows[0]
    if _refuse(row, error, result, now):
        logger.warning(
            "outbox row %s: Redis refused the job (%s); tried again with a backoff",
            row.pk,
            row.last_error,
        )
    return []


def _already_in_old_queue(queue: str, rows: Sequence, result: RelayResult) -> list[int]:
    """Rows written for another queue than their job type's now (``QUEUES`` changed)
    whose job that queue already has (a relay crashed after adding it there, before the
    change): they are sent, not added again to the new queue."""
    sync = get_sync_broker()
    moved = [row for row in rows if row.queue != queue]
    done = []
    by_old: dict[str, list] = {}
    for row in moved:
        by_old.setdefault(row.queue, []).append(row)
    for old_queue, old_rows in by_old.items():
        stored = sync.run(
            sync.broker.results.stored_payloads,
            old_queue,
            [row.bullmq_job_id for row in old_rows],
        )
        for row, found in zip(old_rows, stored, strict=True):
            if _same_job(row, found):
                result.existing += 1
                done.append(row.pk)
    return done


def _relay_batch(
    job_types: Sequence[str],
    pks: Sequence[int] | None,
    batch_size: int,
    using: str | None,
    result: RelayResult,
) -> int:
    """Claim up to ``batch_size`` rows, add their jobs, delete them; rows claimed."""
    from fairqueue.models import OutboxJob

    queues = get_settings().queues
    stop: BaseException | None = None
    with transaction.atomic(using=using):
        rows = OutboxJob.objects.using(using).select_for_update(skip_locked=True)
        rows = rows.filter(job_type__in=job_types)
        if pks is not None:
            rows = rows.filter(pk__in=pks)
        # a refused row waits out its own backoff (retry_delay): no retry storm
        rows = rows.filter(Q(retry_at__isnull=True) | Q(retry_at__lte=timezone.now()))
        for queue, tenant in result.full:  # at most RELAY_MAX_FULL_TENANTS
            of_queue = [job_type for job_type in job_types if queues[job_type] == queue]
            rows = rows.exclude(tenant=tenant, job_type__in=of_queue)
        claimed = list(rows.order_by("tries", "id")[:batch_size])
        if not claimed:
            return 0
        by_queue: dict[str, list] = {}
        for row in claimed:
            # The job type's queue now, not when the row was written (QUEUES may have
            # moved it since: docs/enqueueing.md, "When QUEUES changes").
            by_queue.setdefault(queues[row.job_type], []).append(row)
        now = timezone.now()
        done: list[int] = []
        for queue, queue_rows in by_queue.items():
            try:
                sent = _already_in_old_queue(queue, queue_rows, result)
                done += sent
                rest = [row for row in queue_rows if row.pk not in set(sent)]
                if rest:
                    done += _add_rows(queue, rest, now, result)
            except BrokerUnavailableError as exc:
                stop = exc  # keep what other queues' adds did; the rest waits
                break
            except _ServerRefusal as refusal:
                # One UPDATE, no tries: the rows are not at fault, the server is.
                pending = [row.pk for row in queue_rows if row.pk not in set(done)]
                OutboxJob.objects.using(using).filter(pk__in=pending).update(
                    last_error=refusal.error.redis_error[:200]
                )
                result.refusing = refusal.error.redis_error
                stop = refusal.error
                break
        if done:
            OutboxJob.objects.using(using).filter(pk__in=done).delete()
            result.sent += len(done)
    if stop is not None:
        raise stop
    return len(claimed)


def relay_outbox(
    *,
    job_types: Iterable[str] | None = None,
    pks: Iterable[int] | None = None,
    batch_size: int = RELAY_BATCH_SIZE,
    max_batches: int = RELAY_MAX_BATCHES,
    using: str | None = None,
) -> RelayResult:
    """Move waiting outbox rows to BullMQ, oldest first, at most ``max_batches`` batches.

    Each row goes to its job type's queue as ``FAIRQUEUE['QUEUES']`` maps it now. Rows of
    a job type that is no longer configured are left alone (``manage.py check`` warns:
    fairqueue.W020) until the job type comes back or someone deletes them.

    Args:
        job_types: only rows of these job types (a ``rebalance_fair --queue`` subset);
            default: every configured job type.
        pks: only these rows (a durable enqueue relaying its own rows after commit).

    Raises:
        BrokerUnavailableError: Redis is unreachable; rows not sent stay for the next run.
        BrokerRejectedError: Redis refuses writes in general (``OutOfMemoryError``,
            ``ReadOnlyError``, ``NoPermissionError``...): the run stopped at its first
            add; the rows stay, their ``last_error`` naming the Redis error.
    """
    configured = get_settings().queues
    job_types = [
        job_type
        for job_type in (configured if job_types is None else job_types)
        if job_type in configured
    ]
    pks = None if pks is None else list(pks)
    result = RelayResult()
    try:
        for _ in range(max_batches):
            if _relay_batch(job_types, pks, batch_size, using, result) < batch_size:
                break
            if len(result.full) >= RELAY_MAX_FULL_TENANTS:
                break  # the rows after them wait for the next run
    finally:
        if pks is None:
            _record_pending_quietly(using)
    return result


def _record_pending_quietly(using: str | None) -> None:
    """Update the gauge without masking the run's own error (the database may be the
    thing that failed)."""
    try:
        record_outbox_pending(using=using)
    except Exception as exc:
        logger.debug("outbox gauge not updated (%s)", type(exc).__name__)


def outbox_stats(job_type: str | None = None, *, using: str | None = None) -> dict[str, object]:
    """Rows waiting (for ``job_type``, or all) and the oldest one's age: the dashboard's
    outbox figures."""
    from fairqueue.models import OutboxJob

    rows = OutboxJob.objects.using(using)
    if job_type is not None:
        rows = rows.filter(job_type=job_type)
    found = rows.aggregate(pending=Count("id"), oldest=Min("created_at"))
    oldest = found["oldest"]
    age_ms = None
    if oldest is not None:
        age_ms = max(0, int((timezone.now() - oldest).total_seconds() * 1000))
    return {"pending": found["pending"], "oldest_age_ms": age_ms}


def record_outbox_pending(*, using: str | None = None) -> dict[str, int]:
    """Set ``queue_fair_outbox_pending`` per job type from the table; the counts."""
    from fairqueue.models import OutboxJob

    counts = {
        row["job_type"]: row["n"]
        for row in OutboxJob.objects.using(using)
        .values("job_type")
        .annotate(n=Count("id"))
        .order_by()
    }
    gauge = get_metrics().outbox_pending
    for job_type in set(get_settings().queues) | set(counts):
        by_job_type(gauge, job_type).set(counts.get(job_type, 0))
    return counts


def relay_after_commit(pks: Sequence[int], *, using: str | None = None) -> None:
    """Try to relay a durable enqueue's own rows right after its commit. Never raises:
    a failure must not break the commit's other hooks, and the rows wait for the relay."""
    try:
        relay_outbox(pks=pks, using=using)
    except Exception as exc:
        logger.warning(
            "durable enqueue: relaying after commit failed (%s); %d row(s) wait for the relay",
            exc.redis_error if isinstance(exc, BrokerRejectedError) else type(exc).__name__,
            len(pks),
        )
