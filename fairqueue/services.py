"""Enqueue jobs into BullMQ with a fair placement, a resolved priority and an audit trail.

All input is validated before anything is written, so a bad call leaves no job, no
audit row and no metric increment behind.

Placement rule. Every job gets its fair place when it is added, in the same script as
BullMQ's own add (one round trip per batch of up to 250 jobs), never priority 0
(priority-0 jobs sit in BullMQ's ``wait`` list, which workers drain before any
prioritized job: SPEC decision 6). The place is a virtual finish tag of the job's flow,
its (level, tenant) pair: levels share by weight 4:3:2:1, the tenants of a level share its
slice round-robin, weighted by ``tenant_weight`` (see :mod:`fairqueue.scheduler`). A job
can go ahead of jobs already waiting when its tag says so, so a stock worker takes the
fair order with no rebalance pass at all. Delayed jobs wait at the back of the line and
the pass places them once BullMQ promotes them (their wait starts then).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypedDict, Unpack

from asgiref.sync import sync_to_async
from django.db import transaction

from .broker import BACK_OF_LINE, AddedJob, NewJob, get_broker, get_sync_broker
from .conf import get_settings
from .exceptions import (
    ConflictingPayloadError,
    InvalidJobOptionError,
    InvalidPayloadError,
    PayloadTooLargeError,
    UnknownJobTypeError,
)
from .levels import (
    DEFAULT_TENANT_WEIGHT,
    PAYLOAD_LEVEL_KEY,
    PAYLOAD_TENANT_KEY,
    PriorityLevel,
    parse_level,
)
from .metrics import record_enqueue
from .priority import ABSENT, PriorityRule, ResolvedPriority, _Absent, resolve_priority

logger = logging.getLogger("fairqueue.services")

MAX_JOB_ID_LENGTH: Final = 255
MAX_ATTEMPTS: Final = 1_000
MAX_DELAY_MS: Final = 365 * 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """What an enqueue did.

    ``bullmq_priority`` is ``None`` when a job with the given ``job_id`` already existed:
    BullMQ keeps the existing job and adds nothing (``created`` is then ``False``).
    ``tenant_weight`` is the tenant's resolved weight inside its level.
    """

    job_id: str
    job_type: str
    queue: str
    level: PriorityLevel
    numeric_priority: int
    rule: PriorityRule
    tenant_id: str | None
    bullmq_priority: int | None
    audited: bool
    tenant_weight: int = DEFAULT_TENANT_WEIGHT

    @property
    def created(self) -> bool:
        return self.bullmq_priority is not None


@dataclass(frozen=True, slots=True)
class _Prepared:
    job_type: str
    queue: str
    new_job: NewJob
    resolved: ResolvedPriority
    audit: dict[str, Any] | None


def _queue_for(job_type: object) -> tuple[str, str]:
    queues = get_settings().queues
    if not isinstance(job_type, str) or job_type not in queues:
        raise UnknownJobTypeError(
            f"job_type={job_type!r} is not allowed: expected one of {sorted(queues)} "
            "(register job types in FAIRQUEUE['QUEUES'])"
        )
    return job_type, queues[job_type]


def _merged_payload(payload: object, resolved: ResolvedPriority) -> dict[str, Any]:
    if not isinstance(payload, Mapping):
        raise InvalidPayloadError(
            f"payload of type {type(payload).__name__} is not allowed: expected a JSON object "
            "(a dict with string keys)"
        )
    data = dict(payload)
    for key, value in (
        (PAYLOAD_TENANT_KEY, resolved.tenant_id),
        (PAYLOAD_LEVEL_KEY, resolved.level),
    ):
        if key in data and data[key] != value:
            # Never echo the payload's value: it may be a tenant id.
            raise ConflictingPayloadError(
                f"payload[{key!r}] is not allowed: it differs from the value fairqueue "
                f"resolved; drop the key or pass the same value as the {key} argument"
            )
        data[key] = value.value if isinstance(value, PriorityLevel) else value
    try:
        # Serialised as bullmq does when it stores the job, so the size below is the
        # size of the job's ``data`` field in Redis.
        serialized = json.dumps(data, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayloadError(
            f"payload is not allowed: it must be JSON-serialisable ({type(exc).__name__}: "
            "only dicts with string keys, lists, strings, finite numbers, booleans and None)"
        ) from None
    if any(not isinstance(key, str) for key in data):
        raise InvalidPayloadError("payload is not allowed: every key must be a string")
    size = len(serialized.encode("utf-8"))
    limit = get_settings().max_payload_bytes
    if size > limit:
        # Never echo the payload: it is user data.
        raise PayloadTooLargeError(
            f"payload of {size} bytes is not allowed: its JSON (with tenantId and "
            f"priorityLevel) may be at most {limit} bytes "
            "(FAIRQUEUE['MAX_PAYLOAD_BYTES'] or FAIRQUEUE_MAX_PAYLOAD_BYTES)"
        )
    return data


def _check_options(job_id: object, delay_ms: object, attempts: object) -> None:
    if job_id is not None and (
        not isinstance(job_id, str)
        or not job_id
        or len(job_id) > MAX_JOB_ID_LENGTH
        or job_id.isdigit()
        or ":" in job_id
    ):
        raise InvalidJobOptionError(
            f"job_id={job_id!r} is not allowed: expected None or a non-empty string of at "
            f"most {MAX_JOB_ID_LENGTH} characters, not all digits and without ':' "
            "(BullMQ reserves integer ids for its own)"
        )
    for name, value, low, high in (
        ("delay_ms", delay_ms, 0, MAX_DELAY_MS),
        ("attempts", attempts, 1, MAX_ATTEMPTS),
    ):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
        ):
            raise InvalidJobOptionError(
                f"{name}={value!r} is not allowed: expected None or an integer in {low}..{high}"
            )


def _actor_name(actor: object) -> str:
    if actor is None:
        return ""
    get_username = getattr(actor, "get_username", None)
    return str(get_username() if callable(get_username) else actor)[:200]


class EnqueueOptions(TypedDict, total=False):
    """Keyword options of every enqueue function (see :func:`enqueue_job`)."""

    tenant_id: str | None
    priority: int | None
    priority_level: str | PriorityLevel | None
    priority_override: str | PriorityLevel | None
    tenant_weight: int | None
    job_id: str | None
    delay_ms: int | None
    attempts: int | None
    source: str | None
    actor: object


def _prepare(
    job_type: str,
    payload: Mapping[str, Any],
    *,
    tenant_id: str | None | _Absent = ABSENT,
    priority: int | None = None,
    priority_level: str | PriorityLevel | None = None,
    priority_override: str | PriorityLevel | None = None,
    tenant_weight: int | None = None,
    job_id: str | None = None,
    delay_ms: int | None = None,
    attempts: int | None = None,
    source: str | None = None,
    actor: object = None,
) -> _Prepared:
    job_type, queue = _queue_for(job_type)
    resolved = resolve_priority(
        tenant_id=tenant_id,
        priority=priority,
        priority_level=priority_level,
        priority_override=priority_override,
        tenant_weight=tenant_weight,
    )
    data = _merged_payload(payload, resolved)
    _check_options(job_id, delay_ms, attempts)
    explicit = resolved.rule in (PriorityRule.EXPLICIT_LEVEL, PriorityRule.EXPLICIT_PRIORITY)
    tenant_job = not isinstance(tenant_id, _Absent) and tenant_id is not None
    audit = None
    if priority_override is not None or (explicit and tenant_job):
        audit = {
            "job_type": job_type,
            "queue": queue,
            "tenant_id": resolved.tenant_id or "",
            "requested_override": (
                parse_level(priority_override).value if priority_override is not None else ""
            ),
            "requested_level": (
                parse_level(priority_level).value if priority_level is not None else ""
            ),
            "requested_priority": priority,
            "resolved_level": resolved.level.value,
            "numeric_priority": resolved.numeric,
            "rule": resolved.rule.value,
            "source": (source or "")[:200],
            "actor": _actor_name(actor),
        }
    return _Prepared(
        job_type=job_type,
        queue=queue,
        new_job=NewJob(
            name=job_type,
            data=data,
            level=resolved.level,
            job_id=job_id,
            delay_ms=delay_ms,
            attempts=attempts,
            tenant=resolved.tenant_bucket,
            tenant_weight=resolved.tenant_weight,
        ),
        resolved=resolved,
        audit=audit,
    )


def _write_audits(prepared: Sequence[_Prepared], added: Sequence[AddedJob]) -> set[int]:
    from .models import PriorityOverrideAudit

    rows = [
        PriorityOverrideAudit(job_id=job.job_id, **item.audit)
        for item, job in zip(prepared, added, strict=True)
        if item.audit is not None and job.priority is not None
    ]
    if rows:
        PriorityOverrideAudit.objects.bulk_create(rows)
    return {index for index, item in enumerate(prepared) if item.audit is not None}


def _record(prepared: Sequence[_Prepared], added: Sequence[AddedJob], audited: set[int]):
    results = []
    for index, (item, job) in enumerate(zip(prepared, added, strict=True)):
        if job.priority is not None:
            record_enqueue(
                item.queue,
                item.job_type,
                item.resolved.level,
                placed=job.priority < BACK_OF_LINE,
            )
        results.append(
            EnqueuedJob(
                job_id=job.job_id,
                job_type=item.job_type,
                queue=item.queue,
                level=item.resolved.level,
                numeric_priority=item.resolved.numeric,
                rule=item.resolved.rule,
                tenant_id=item.resolved.tenant_id,
                bullmq_priority=job.priority,
                audited=index in audited and job.priority is not None,
                tenant_weight=item.resolved.tenant_weight,
            )
        )
    return results


def _needs_audit(prepared: Sequence[_Prepared]) -> bool:
    return any(item.audit is not None for item in prepared)


def _enqueue_prepared(prepared: Sequence[_Prepared]) -> list[EnqueuedJob]:
    """Add the jobs, then write their audit rows, inside one database transaction.

    If Redis refuses, nothing is written and the error propagates. The audit rows are
    written only for jobs Redis accepted (a duplicate ``job_id`` adds nothing, so it is
    not audited).
    """
    queue = prepared[0].queue
    jobs = [item.new_job for item in prepared]
    if not _needs_audit(prepared):
        added = get_sync_broker().add_jobs(queue, jobs)
        return _record(prepared, added, set())
    with transaction.atomic():
        added = get_sync_broker().add_jobs(queue, jobs)
        audited = _write_audits(prepared, added)
    return _record(prepared, added, audited)


def enqueue_job(
    job_type: str, payload: Mapping[str, Any], **options: Unpack[EnqueueOptions]
) -> EnqueuedJob:
    """Enqueue one job of ``job_type`` now.

    Args:
        payload: a JSON object; fairqueue adds ``tenantId`` and ``priorityLevel``. Its
            JSON may be at most ``FAIRQUEUE['MAX_PAYLOAD_BYTES']`` bytes (1 MiB).
        tenant_id: the tenant's id; ``None`` marks an internal job (critical); leave it
            out for jobs that belong to no tenant.
        priority, priority_level: an explicit priority (one of them), audited for tenant
            jobs.
        priority_override: ``'critical' | 'high' | 'normal' | 'low'``, always audited.
            Server-side only: never take it from request input.
        tenant_weight: the tenant's weight inside its level (1..100), instead of the
            wired weight lookup's answer (default 1). Server-side only; not audited.
        job_id: a custom BullMQ job id (not all digits); an existing id adds nothing.
        delay_ms, attempts: BullMQ's ``delay`` and ``attempts``.
        source, actor: recorded in the audit row (e.g. ``"signup view"``, ``request.user``).

    Raises:
        UnknownJobTypeError, InvalidPayloadError, PayloadTooLargeError,
        ConflictingPayloadError, InvalidTenantError, InvalidTenantWeightError,
        InvalidPriorityError, InvalidPriorityLevelError, ConflictingPriorityError,
        InvalidJobOptionError: bad input; nothing was written.
        BrokerUnavailableError: Redis could not be reached; nothing was written.
    """
    return _enqueue_prepared([_prepare(job_type, payload, **options)])[0]


def enqueue_jobs(
    job_type: str, payloads: Sequence[Mapping[str, Any]], **options: Unpack[EnqueueOptions]
) -> list[EnqueuedJob]:
    """Enqueue many jobs of one type with the same options, all validated before any is
    sent, in one Redis round trip per 1,000 jobs. ``job_id`` and ``delay_ms`` are not
    batch options."""
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
    return _enqueue_prepared([_prepare(job_type, payload, **options) for payload in payloads])


async def aenqueue_job(
    job_type: str, payload: Mapping[str, Any], **options: Unpack[EnqueueOptions]
) -> EnqueuedJob:
    """Async twin of :func:`enqueue_job`, for async views: the Redis call is awaited on
    the caller's event loop; the plan lookup and audit row go through the ORM in a
    thread."""
    prepared = await sync_to_async(_prepare)(job_type, payload, **options)
    added = await get_broker().add_jobs(prepared.queue, [prepared.new_job])
    audited: set[int] = set()
    if prepared.audit is not None:
        audited = await sync_to_async(_write_audits)([prepared], added)
    return _record([prepared], added, audited)[0]


def enqueue_on_commit(
    job_type: str,
    payload: Mapping[str, Any],
    *,
    using: str | None = None,
    **options: Unpack[EnqueueOptions],
) -> None:
    """Enqueue once the surrounding database transaction commits (now, if none is open).

    Input is validated immediately, so a bad call raises in the view, not after commit.
    A rolled-back transaction leaves no job and no audit row. If Redis is unreachable at
    commit time the error propagates from the commit (the data is committed, the job is
    not): callers that must never lose the job should enqueue inside the request and
    handle ``BrokerUnavailableError``.
    """
    prepared = _prepare(job_type, payload, **options)
    transaction.on_commit(lambda: _enqueue_prepared([prepared]), using=using)
