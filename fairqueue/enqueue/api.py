"""Enqueue jobs into BullMQ with a fair placement, a resolved priority and an audit trail.

All input is validated before anything is written, so a bad call leaves no job, no
audit row and no metric increment behind. Every job gets its fair place when it is
added, in the same script as BullMQ's own add, never priority 0 (docs/design.md,
"Where it runs: the add-time tags"). Two ways in (docs/enqueueing.md): **direct**
(``enqueue_job``, ``enqueue_jobs``, ``aenqueue_job``: in Redis when the call returns,
an audited job's row inserted first and rolled back if the add fails; ``job_id`` is
the idempotency key for a retry after a timeout) and **durable** (``enqueue_on_commit``,
``durable=True``: an outbox row in the caller's transaction, added after commit by
:mod:`fairqueue.enqueue.outbox`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from asgiref.sync import sync_to_async
from django.db import transaction

from fairqueue.broker import (
    ADD_BATCH_SIZE,
    BACK_OF_LINE,
    AddBatch,
    AddedJob,
    get_broker,
    get_sync_broker,
)
from fairqueue.enqueue.admission import aadmit, admit, attach, check_admission_options
from fairqueue.enqueue.audit import insert_audits, settle_audits
from fairqueue.enqueue.calls import (
    EnqueuedJob,
    Prepared,
    prepare,
    prepare_job,
    resolve_call,
    result,
    warn_implicit_internal,
)
from fairqueue.enqueue.durable import enqueue_durable
from fairqueue.enqueue.options import (
    MAX_ATTEMPTS,
    MAX_DELAY_MS,
    EnqueueOptions,
    check_json_tree,
    check_keywords,
    parse_backoff,
    parse_cost,
)
from fairqueue.enqueue.priority import ABSENT
from fairqueue.exceptions import (
    InvalidJobOptionError,
    InvalidPayloadError,
    PartialEnqueueError,
    TenantBacklogFullError,
)
from fairqueue.metrics import record_enqueue, record_limited
from fairqueue.scheduling.limits import REASON_MAX_WAITING

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_DELAY_MS",
    "EnqueueOptions",
    "EnqueuedJob",
    "aenqueue_job",
    "check_json_tree",
    "enqueue_job",
    "enqueue_jobs",
    "enqueue_on_commit",
    "parse_backoff",
    "parse_cost",
    "warn_implicit_internal",
]


def _record(
    prepared: Sequence[Prepared], added: Sequence[AddedJob], audited: set[int]
) -> list[EnqueuedJob]:
    """Count the jobs added in the metrics and say what each enqueue did."""
    results = []
    for index, (item, job) in enumerate(zip(prepared, added, strict=True)):
        if job.priority is not None:
            record_enqueue(
                item.queue,
                item.job_type,
                item.resolved.level,
                placed=job.priority < BACK_OF_LINE,
            )
            if job.held is not None:
                record_limited(item.job_type, job.held)
        results.append(result(item, job.job_id, job.priority, index in audited))
    return results


def _needs_audit(prepared: Sequence[Prepared]) -> bool:
    return any(item.audit is not None for item in prepared)


def _enqueue_chunk(
    prepared: Sequence[Prepared], batch: AddBatch | None = None
) -> list[EnqueuedJob]:
    """Add one chunk (one atomic add-script call). With audit rows: insert them first,
    in a transaction, add the jobs, then settle the rows; a failed add rolls them back.
    ``batch``: the chunk is part of a batch of several (the first chunk checks
    ``max_waiting`` for the later ones too and reserves their room)."""
    queue = prepared[0].queue
    jobs = [item.new_job for item in prepared]
    try:
        if not _needs_audit(prepared):
            added = get_sync_broker().add_jobs(queue, jobs, batch=batch)
            return _record(prepared, added, set())
        with transaction.atomic():
            rows = insert_audits([(item.new_job.job_id, item.audit) for item in prepared])
            added = get_sync_broker().add_jobs(queue, jobs, batch=batch)
            audited = settle_audits(rows, added)
    except TenantBacklogFullError:
        record_limited(prepared[0].job_type, REASON_MAX_WAITING)  # the refusal, nothing else
        raise
    return _record(prepared, added, audited)


def _enqueue_prepared(prepared: Sequence[Prepared]) -> list[EnqueuedJob]:
    """Add the jobs chunk by chunk; a failure after the first chunk raises
    PartialEnqueueError with what was added."""
    # A batch of several chunks is checked against max_waiting whole, atomically, by its
    # first chunk's add, which reserves room for the later ones: refused whole or added
    # whole (a producer that dies mid-batch frees its reservation after a minute).
    token = uuid.uuid4().hex if len(prepared) > ADD_BATCH_SIZE else None
    remaining: dict[str, int] = {}
    for item in prepared[ADD_BATCH_SIZE:]:
        remaining[item.new_job.tenant] = remaining.get(item.new_job.tenant, 0) + 1
    results: list[EnqueuedJob] = []
    for start in range(0, len(prepared), ADD_BATCH_SIZE):
        chunk = prepared[start : start + ADD_BATCH_SIZE]
        if start:
            for item in chunk:
                remaining[item.new_job.tenant] -= 1
        batch = None if token is None else AddBatch(token, dict(remaining))
        try:
            results += _enqueue_chunk(chunk, batch)
        except Exception as exc:
            if not results:
                raise
            not_sent = len(prepared) - start - len(chunk)
            raise PartialEnqueueError(
                f"enqueue_jobs added {len(results)} of {len(prepared)} jobs, then failed "
                f"({type(exc).__name__}): the next {len(chunk)} may or may not have been "
                f"added and {not_sent} were not sent; the added ids are in .job_ids",
                added=results,
                uncertain=len(chunk),
                not_sent=not_sent,
            ) from exc
    return results


def enqueue_job(
    job_type: str,
    payload: Mapping[str, Any],
    *,
    durable: bool = False,
    using: str | None = None,
    estimate: bool = False,
    max_wait_ms: int | None = None,
    **options: Unpack[EnqueueOptions],
) -> EnqueuedJob:
    """Enqueue one job of ``job_type`` now (or, ``durable``, through the outbox).

    Args:
        payload: a JSON object; fairqueue adds ``tenantId`` and ``priorityLevel``. Its
            JSON may be at most ``FAIRQUEUE['MAX_PAYLOAD_BYTES']`` bytes (1 MiB).
        tenant_id: the tenant's id; leave it out for jobs that belong to no tenant.
            ``None`` still marks an internal job (critical) but warns
            (:class:`~fairqueue.ImplicitInternalJobWarning`): a missing id must not
            promote a tenant's job by accident.
        internal: ``True`` for internal work (critical, no tenant), by intent; not with
            a ``tenant_id``.
        priority, priority_level: an explicit priority (one of them): a code decision,
            not audited (unless ``FAIRQUEUE['AUDIT_EXPLICIT_PRIORITY']``, then for tenant
            jobs).
        priority_override: ``'critical' | 'high' | 'normal' | 'low'``, always audited.
            Server-side only: never take it from request input.
        tenant_weight: the tenant's weight inside its level (1..100), instead of the
            wired weight lookup's answer (default 1). Server-side only; not audited.
        job_id: a custom BullMQ job id (not all digits): the idempotency key. An existing
            id adds nothing, so retrying a call that failed with a timeout under the same
            ``job_id`` never enqueues the job twice.
        delay_ms, attempts: BullMQ's ``delay`` and ``attempts``.
        backoff: BullMQ's ``backoff`` between attempts: a delay in ms (fixed) or
            ``{"type": "fixed" | "exponential", "delay": ms}``; ``None`` retries at once.
            A retry, with or without backoff, waits for its flow's next fair turn.
        cost: the job's expected worker time in seconds, for a flow with nothing
            measured yet (``FAIRNESS_BY = "time"``): the job takes that share of its
            flow's turns. Once the flow's runs are measured, those place its jobs and
            ``cost`` is not used: a declared cost cannot buy share.
        source, actor: recorded in the audit row (e.g. ``"signup view"``, ``request.user``).
        durable: write the job to the outbox in the current transaction (on database
            ``using``) instead of Redis; the relay adds it after commit (see
            :func:`enqueue_on_commit`). Redis is not contacted before commit (unless
            ``estimate`` or ``max_wait_ms`` asks it for an estimate).
        estimate: also estimate when the job will start (``EnqueuedJob.estimate``; one
            read-only script call before the add; docs/design.md, "When a job will start").
        max_wait_ms: refuse the job (:class:`~fairqueue.ExpectedWaitTooLongError`,
            nothing written) when it is expected to start later than this: admission
            control that refuses the flows over their fair share.

    Raises:
        UnknownJobTypeError, InvalidPayloadError, PayloadTooLargeError,
        ConflictingPayloadError, InvalidTenantError, InvalidTenantWeightError,
        InvalidPriorityError, InvalidPriorityLevelError, ConflictingPriorityError,
        InvalidJobOptionError: bad input; nothing was written.
        BrokerUnavailableError: Redis could not be reached, or did not answer in time.
            No audit row was written; the job was not added if Redis could not be
            reached, but after a timeout it may have been: retry with the same
            ``job_id`` (or use ``durable=True``).
        BrokerRejectedError: Redis answered with an error (``OutOfMemoryError`` under
            ``maxmemory``, ``ReadOnlyError``...); ``redis_error`` names it. Nothing of
            that call was added. Both are ``BrokerError``.
    """
    check_keywords("enqueue_job", options, ("durable", "using", "estimate", "max_wait_ms"))
    check_admission_options(estimate, max_wait_ms)
    prepared = [prepare(job_type, payload, **options)]
    prepared, estimates = admit(
        prepared, estimate=estimate, max_wait_ms=max_wait_ms, durable=durable, using=using
    )
    if durable:
        return attach(enqueue_durable(prepared, using), estimates)[0]
    return attach(_enqueue_prepared(prepared), estimates)[0]


def enqueue_jobs(
    job_type: str,
    payloads: Sequence[Mapping[str, Any]],
    *,
    durable: bool = False,
    using: str | None = None,
    estimate: bool = False,
    max_wait_ms: int | None = None,
    **options: Unpack[EnqueueOptions],
) -> list[EnqueuedJob]:
    """Enqueue many jobs of one type with the same options, all validated before any is
    sent, in one Redis round trip per 250 jobs (each chunk atomic: all its jobs or
    none). ``job_id`` and ``delay_ms`` are not batch options; ``durable`` as in
    :func:`enqueue_job` (one transaction for the whole batch); ``estimate`` and
    ``max_wait_ms`` as there, for the batch's last job (refused whole).

    Raises:
        PartialEnqueueError: a chunk after the first failed: ``.added`` / ``.job_ids``
            are the jobs added (and audited), ``.uncertain`` the failed chunk's size,
            ``.not_sent`` the rest; retry ``payloads[len(exc.added):]``.
        BrokerUnavailableError: the first chunk failed; nothing else was sent.
    """
    check_keywords("enqueue_jobs", options, ("durable", "using", "estimate", "max_wait_ms"))
    check_admission_options(estimate, max_wait_ms)
    for option in ("job_id", "delay_ms"):
        if options.get(option) is not None:
            raise InvalidJobOptionError(
                f"{option}={options[option]!r} is not allowed in enqueue_jobs: "
                "use enqueue_job for jobs with their own id or delay"
            )
    if isinstance(payloads, Mapping) or not isinstance(payloads, Sequence):
        raise InvalidPayloadError(
            f"payloads of type {type(payloads).__name__} is not allowed: expected a list of "
            "JSON objects"
        )
    if not payloads:
        return []
    call = resolve_call(job_type, **options)
    prepared = [prepare_job(call, payload, **options) for payload in payloads]
    prepared, estimates = admit(
        prepared, estimate=estimate, max_wait_ms=max_wait_ms, durable=durable, using=using
    )
    if durable:
        return attach(enqueue_durable(prepared, using), estimates)
    return attach(_enqueue_prepared(prepared), estimates)


async def aenqueue_job(
    job_type: str,
    payload: Mapping[str, Any],
    *,
    estimate: bool = False,
    max_wait_ms: int | None = None,
    **options: Unpack[EnqueueOptions],
) -> EnqueuedJob:
    """Async twin of :func:`enqueue_job`, for async views: the Redis call is awaited on
    the caller's event loop and the plan lookup goes through the ORM in a thread. An
    audited job runs the sync path in a thread instead, so its audit row and its add
    share one transaction. ``estimate`` and ``max_wait_ms`` as in :func:`enqueue_job`."""
    check_keywords("aenqueue_job", options, ("estimate", "max_wait_ms"))
    check_admission_options(estimate, max_wait_ms)
    if options.get("tenant_id", ABSENT) is None and options.get("internal", False) is False:
        warn_implicit_internal()  # here, in the caller's stack, not in the thread below
        options = {**options, "internal": True}
    prepared = await sync_to_async(prepare)(job_type, payload, **options)
    estimates = None
    if estimate or max_wait_ms is not None:
        (prepared,), estimates = await aadmit(
            [prepared], estimate=estimate, max_wait_ms=max_wait_ms
        )
    if prepared.audit is not None:
        return attach(await sync_to_async(_enqueue_prepared)([prepared]), estimates)[0]
    added = await get_broker().adding.add_jobs(prepared.queue, [prepared.new_job])
    return attach(_record([prepared], added, set()), estimates)[0]


def enqueue_on_commit(
    job_type: str,
    payload: Mapping[str, Any],
    *,
    using: str | None = None,
    max_wait_ms: int | None = None,
    **options: Unpack[EnqueueOptions],
) -> EnqueuedJob:
    """Enqueue durably: the job exists if and only if the surrounding transaction
    commits (``enqueue_job(..., durable=True)``).

    Input is validated immediately, so a bad call raises in the view, not after commit.
    An outbox row (and the audit row, if any) is written in the caller's transaction on
    database ``using``, so a rolled-back transaction leaves no job and no audit row.
    After commit the rows are relayed to Redis at once if Redis answers; if it does not,
    they wait for the relay (``rebalance_fair`` or ``fairqueue_relay``), nothing is
    raised from the commit and the transaction's other ``on_commit`` hooks still run.
    The returned job has ``durable=True`` and the ``job_id`` the relay will use.
    ``max_wait_ms`` refuses the job as in :func:`enqueue_job` when Redis answers the
    estimate's read; when it does not, the job is admitted (the outbox's promise first).
    """
    check_keywords("enqueue_on_commit", options, ("using", "max_wait_ms"))
    return enqueue_job(
        job_type, payload, durable=True, using=using, max_wait_ms=max_wait_ms, **options
    )
