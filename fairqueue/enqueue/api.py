"""Enqueue jobs into BullMQ with a fair placement, a resolved priority and an audit trail.

All input is validated before anything is written, so a bad call leaves no job, no
audit row and no metric increment behind.

Placement rule. Every job gets its fair place when it is added, in the same script as
BullMQ's own add (one round trip per batch of up to 250 jobs), never priority 0
(priority-0 jobs sit in BullMQ's ``wait`` list, which workers drain before any
prioritized job; docs/design.md, "The score layout"). The place is a finish tag of its flow,
its (level, tenant) pair: levels share by weight 4:3:2:1, the tenants of a level share its
slice round-robin, weighted by ``tenant_weight`` (see :mod:`fairqueue.scheduling.order`). A job
can go ahead of jobs already waiting when its tag says so, so a stock worker takes the
fair order with no rebalance pass at all. Delayed jobs wait at the back of the line and
the pass places them once BullMQ promotes them (their wait starts then).

Two ways in, and what each guarantees:

* **Direct** (``enqueue_job``, ``enqueue_jobs``, ``aenqueue_job``): the job is in Redis
  when the call returns. An audited job's audit row is validated and inserted first, in
  a transaction, and the job is added only if that worked; a failed add rolls the row
  back. Inside an outer transaction that later rolls back, the job stays in Redis (use
  the durable way for jobs that belong to a transaction). A timeout is ambiguous: the
  job may have been added; pass ``job_id`` and retry with the same id, which adds
  nothing if the first attempt got through (the id is the idempotency key).
* **Durable** (``enqueue_on_commit``, ``durable=True``): an outbox row (and the audit
  row) is written in the caller's transaction; the relay (:mod:`fairqueue.enqueue.outbox`) adds
  the job with the same placement after commit. Nothing is lost or duplicated whatever
  Redis does; the job reaches Redis when Redis and a relay are up.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypedDict, Unpack

from asgiref.sync import sync_to_async
from django.db import transaction

from fairqueue.broker import (
    ADD_BATCH_SIZE,
    BACK_OF_LINE,
    MAX_JOB_ID_LENGTH,
    RESERVED_JOB_IDS,
    AddBatch,
    AddedJob,
    NewJob,
    get_broker,
    get_sync_broker,
)
from fairqueue.conf import get_settings
from fairqueue.enqueue.priority import (
    ABSENT,
    Absent,
    PriorityRule,
    ResolvedPriority,
    resolve_priority,
    resolve_tenant_limits,
)
from fairqueue.exceptions import (
    ConflictingPayloadError,
    ImplicitInternalJobWarning,
    InvalidJobOptionError,
    InvalidPayloadError,
    InvalidPriorityError,
    InvalidTenantError,
    PartialEnqueueError,
    PayloadTooLargeError,
    TenantBacklogFullError,
)
from fairqueue.metrics import record_enqueue, record_limited
from fairqueue.scheduling.levels import (
    DEFAULT_TENANT_WEIGHT,
    MAX_PAYLOAD_DEPTH,
    PAYLOAD_LEVEL_KEY,
    PAYLOAD_TENANT_KEY,
    PriorityLevel,
    is_strict_utf8,
    parse_level,
)
from fairqueue.scheduling.limits import NO_LIMITS, REASON_MAX_WAITING, TenantLimits

logger = logging.getLogger("fairqueue.services")

MAX_ATTEMPTS: Final = 1_000
MAX_DELAY_MS: Final = 365 * 24 * 3600 * 1000
#: The audit row's integer columns are 32-bit on PostgreSQL.
MAX_AUDITED_PRIORITY: Final = 2**31 - 1
MAX_AUDIT_TEXT_LENGTH: Final = 200


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """What an enqueue did.

    ``bullmq_priority`` is ``None`` when a job with the given ``job_id`` already existed:
    BullMQ keeps the existing job and adds nothing (``created`` is then ``False``).
    ``tenant_weight`` is the tenant's resolved weight inside its level. ``durable`` jobs
    are in the outbox, not yet in Redis (``created`` is ``False``): the relay adds them
    under ``job_id`` after commit.
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
    durable: bool = False

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
    limits: TenantLimits | None = None


_JSON_SCALARS: Final = frozenset({int, float, bool, type(None)})


def check_json_tree(
    data: object, *, text: bool = False, what: str = "payload", depth: int = 1
) -> None:
    """Refuse what ``json.dumps`` would accept but store wrongly, or fail on deep down.

    Non-string keys at any depth (``{1: "a", "1": "b"}`` becomes two ``"1"`` keys) and
    nesting deeper than ``MAX_PAYLOAD_DEPTH`` (instead of a ``RecursionError`` at ~1,000
    levels); with ``text``, also strings and keys that are not valid UTF-8 (a lone
    surrogate: stored, then every page and reader that decodes it fails). Only
    containers are walked (``type`` checks, no ABC lookups on the common types), so the
    walk costs a fraction of the serialisation. Messages never echo the payload; they
    name ``what`` (a task argument's name), found at ``depth`` of the payload.
    """
    leaves = _JSON_SCALARS if text else _JSON_SCALARS | {str}
    stack: list[tuple[object, int]] = [(data, depth)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)
        if kind is str or isinstance(node, str):
            if not is_strict_utf8(node):  # type: ignore[arg-type]
                raise InvalidPayloadError(
                    f"{what} is not allowed: a string at depth {depth} is not valid UTF-8 "
                    "(it holds a lone surrogate)"
                )
            continue
        is_map = kind is dict or (kind not in (list, tuple) and isinstance(node, Mapping))
        if not is_map and not isinstance(node, list | tuple):
            continue  # a scalar, or something json.dumps refuses with its own error
        if depth > MAX_PAYLOAD_DEPTH:
            raise InvalidPayloadError(
                f"{what} is not allowed: it nests deeper than {MAX_PAYLOAD_DEPTH} levels "
                "of dicts and lists (MAX_PAYLOAD_DEPTH)"
            )
        if is_map:
            for key, value in node.items():  # type: ignore[attr-defined]
                if type(key) is not str and not isinstance(key, str):
                    raise InvalidPayloadError(
                        f"{what} is not allowed: a key of type {type(key).__name__} at depth "
                        f"{depth}; every key must be a string (JSON would turn it into a "
                        "string, possibly a duplicate key)"
                    )
                if text and not is_strict_utf8(key):
                    raise InvalidPayloadError(
                        f"{what} is not allowed: a key at depth {depth} is not valid UTF-8 "
                        "(it holds a lone surrogate)"
                    )
                if type(value) not in leaves:
                    stack.append((value, depth + 1))
        else:
            stack.extend((item, depth + 1) for item in node if type(item) not in leaves)  # type: ignore[attr-defined]


def _merged_payload(payload: object, resolved: ResolvedPriority) -> tuple[dict[str, Any], str]:
    """The job's data (the payload with its tenant and level) and its JSON as BullMQ stores
    it, checked."""
    if not isinstance(payload, Mapping):
        raise InvalidPayloadError(
            f"payload of type {type(payload).__name__} is not allowed: expected a JSON object "
            "(a dict with string keys)"
        )
    check_json_tree(payload)
    for key, value in (
        (PAYLOAD_TENANT_KEY, resolved.tenant_id),
        (PAYLOAD_LEVEL_KEY, resolved.level),
    ):
        if key in payload and payload[key] != value:
            # Never echo the payload's value: it may be a tenant id.
            raise ConflictingPayloadError(
                f"payload[{key!r}] is not allowed: it differs from the value fairqueue "
                f"resolved; drop the key or pass the same value as the {key} argument"
            )
    level = resolved.level
    # The level and tenant first, so a reader of the stored JSON (bull-board, redis-cli)
    # sees whose job it is at once.
    data = {
        PAYLOAD_LEVEL_KEY: level.value if isinstance(level, PriorityLevel) else level,
        PAYLOAD_TENANT_KEY: resolved.tenant_id,
        **payload,
    }
    try:
        # Serialised as bullmq does when it stores the job, so the size below is the
        # size of the job's ``data`` field in Redis.
        serialized = json.dumps(data, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayloadError(
            f"payload is not allowed: it must be JSON-serialisable ({type(exc).__name__}: "
            "only dicts with string keys, lists, strings, finite numbers, booleans and None)"
        ) from None
    if "\\ud" in serialized:
        # JSON escapes every non-ASCII character; only a surrogate escape can hide a
        # lone surrogate, so the exact (slower) walk over the strings runs only then.
        check_json_tree(data, text=True)
    # json.dumps escapes every non-ASCII character (ensure_ascii), so the text is ASCII
    # and its length is its size in bytes: no encoded copy per job.
    size = len(serialized)
    limit = get_settings().max_payload_bytes
    if size > limit:
        # Never echo the payload: it is user data.
        raise PayloadTooLargeError(
            f"payload of {size} bytes is not allowed: its JSON (with tenantId and "
            f"priorityLevel) may be at most {limit} bytes "
            "(FAIRQUEUE['MAX_PAYLOAD_BYTES'] or FAIRQUEUE_MAX_PAYLOAD_BYTES)"
        )
    return data, serialized


#: BullMQ's built-in backoff strategies (what stock Python and Node workers compute).
BACKOFF_TYPES: Final = ("fixed", "exponential")


def parse_backoff(backoff: object, *, argument: str = "backoff") -> dict[str, Any] | None:
    """BullMQ's ``backoff`` job option, validated: ``None`` (retry at once), a delay in ms
    (a fixed backoff, as BullMQ reads a number) or ``{"type": "fixed" | "exponential",
    "delay": ms}``. Returned in the dict form BullMQ stores, so a Node worker reading the
    job computes the same delays as a Python one."""
    if backoff is None:
        return None
    if isinstance(backoff, int) and not isinstance(backoff, bool):
        backoff = {"type": "fixed", "delay": backoff}
    if isinstance(backoff, Mapping) and set(backoff) == {"type", "delay"}:
        kind, delay = backoff["type"], backoff["delay"]
        if (
            kind in BACKOFF_TYPES
            and isinstance(delay, int)
            and not isinstance(delay, bool)
            and 0 <= delay <= MAX_DELAY_MS
        ):
            return {"type": kind, "delay": delay}
    raise InvalidJobOptionError(
        f"{argument}={backoff!r} is not allowed: expected None, a delay in ms (0.."
        f"{MAX_DELAY_MS}) or {{'type': 'fixed' | 'exponential', 'delay': ms}}"[:400]
    )


#: The largest ``cost=`` (seconds of worker time a job is expected to take): a day.
MAX_COST_S: Final = 86_400


def parse_cost(cost: object) -> int | None:
    """``cost=``, the caller's estimate of a job's worker time in seconds (a positive
    number), as the whole milliseconds the add script takes; ``None``: the flow's
    measured estimate."""
    if cost is None:
        return None
    if (
        isinstance(cost, int | float)
        and not isinstance(cost, bool)
        and math.isfinite(cost)
        and 0 < cost <= MAX_COST_S
    ):
        return max(1, round(cost * 1000))
    raise InvalidJobOptionError(
        f"cost={cost!r} is not allowed: expected None or a number of seconds in (0, {MAX_COST_S}]"[
            :300
        ]
    )


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
    if job_id is not None and not is_strict_utf8(job_id):
        raise InvalidJobOptionError(
            f"job_id of {len(job_id)} characters is not allowed: expected valid UTF-8 text "
            "(it holds a lone surrogate)"
        )
    if job_id in RESERVED_JOB_IDS:
        # A job's hash is ``prefix:queue:<id>``, so these ids would overwrite (or be)
        # BullMQ's own keys of the queue: ``wait`` stops every worker (WRONGTYPE),
        # ``meta`` drops the job, ``completed`` strands later jobs.
        raise InvalidJobOptionError(
            f"job_id={job_id!r} is not allowed: it names one of the queue's own Redis keys; "
            f"reserved ids are {', '.join(sorted(RESERVED_JOB_IDS))}"
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


def _audit_text(argument: str, value: object) -> str:
    """``value`` as the audit row stores it, or a named error for text no database can
    store (PostgreSQL refuses NUL characters and unpaired surrogates)."""
    text = value[:MAX_AUDIT_TEXT_LENGTH]
    if "\x00" in text:
        raise InvalidJobOptionError(
            f"{argument} is not allowed: it contains a NUL character (\\x00), which the "
            "audit log cannot store"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidJobOptionError(
            f"{argument} is not allowed: it is not valid UTF-8 text (an unpaired surrogate)"
        ) from None
    return text


def _audit_source(source: object) -> str:
    if source is None:
        return ""
    if not isinstance(source, str):
        raise InvalidJobOptionError(
            f"source of type {type(source).__name__} is not allowed: expected None or a string"
        )
    return _audit_text("source", source)


def _actor_name(actor: object) -> str:
    if actor is None:
        return ""
    get_username = getattr(actor, "get_username", None)
    return _audit_text("actor", str(get_username() if callable(get_username) else actor))


def _check_audited_priority(priority: object) -> None:
    if (
        isinstance(priority, int)
        and not isinstance(priority, bool)
        and priority > MAX_AUDITED_PRIORITY
    ):
        raise InvalidPriorityError(
            f"priority={priority!r} is not allowed: expected an integer in "
            f"0..{MAX_AUDITED_PRIORITY} (any value from 6 up means low)"
        )


class EnqueueOptions(TypedDict, total=False):
    """Keyword options of every enqueue function (see :func:`enqueue_job`)."""

    tenant_id: str | None
    internal: bool
    priority: int | None
    priority_level: str | PriorityLevel | None
    priority_override: str | PriorityLevel | None
    tenant_weight: int | None
    job_id: str | None
    delay_ms: int | None
    attempts: int | None
    backoff: int | Mapping[str, Any] | None
    cost: float | None
    source: str | None
    actor: object


def _check_keywords(
    function: str, options: Mapping[str, object], extra: Sequence[str] = ()
) -> None:
    """Name an unknown keyword (``delay=`` for ``delay_ms=``) and the allowed ones
    (``extra``: the function's own keyword-only arguments), instead of a bare
    ``TypeError`` from a private function."""
    unknown = sorted(set(options) - set(EnqueueOptions.__annotations__))
    if unknown:
        allowed = sorted([*EnqueueOptions.__annotations__, *extra])
        raise InvalidJobOptionError(
            f"{function}() got unknown keyword {unknown[0]}={options[unknown[0]]!r}"[:300]
            + f": allowed keywords are {', '.join(allowed)}"
        )


@dataclass(frozen=True, slots=True)
class _Call:
    """What every job of one call shares: resolved once per call, so a batch of 1,000
    jobs asks the plan and weight lookups once, not 1,000 times."""

    job_type: str
    queue: str
    resolved: ResolvedPriority
    backoff: dict[str, Any] | None
    cost_ms: int | None
    audit: dict[str, Any] | None
    #: The tenant's limits, resolved once per call (``None``: it has none, the common
    #: case, which costs nothing more).
    limits: TenantLimits | None = None


def _audited(resolved: ResolvedPriority, *, tenant_job: bool, override: bool) -> bool:
    """Which jobs get an audit row: ``priority_override=`` always (it overrides the
    tenant's plan for one request); an explicit ``priority_level=``
    / ``priority=`` on a tenant's job only with ``AUDIT_EXPLICIT_PRIORITY``: it is a code
    decision (the normal way to enqueue), and auditing it cost a database write per
    enqueue."""
    if override:
        return True
    explicit = resolved.rule in (PriorityRule.EXPLICIT_LEVEL, PriorityRule.EXPLICIT_PRIORITY)
    return explicit and tenant_job and get_settings().audit_explicit_priority


#: Modules between a caller and the enqueue: the warning below points past them.
_PLUMBING_MODULES: Final = (
    "fairqueue.",
    "django.tasks",
    "django_tasks",
    "asgiref",
    "asyncio",
    "concurrent.futures",
    "threading",
)


def warn_implicit_internal() -> None:
    """Warn that ``tenant_id=None`` made an internal job without ``internal=True``,
    pointing at the first caller outside fairqueue and the task frameworks (so each call
    site warns once, and ``-W error::fairqueue.ImplicitInternalJobWarning`` finds them)."""
    message = (
        "tenant_id=None enqueued an internal job (critical, no tenant). For internal work "
        "pass internal=True instead; for a tenant's job pass its id, or leave tenant_id out "
        "for work of no tenant"
    )
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != "fairqueue" and not module.startswith(_PLUMBING_MODULES):
            warnings.warn_explicit(
                message,
                ImplicitInternalJobWarning,
                frame.f_code.co_filename,
                frame.f_lineno,
                module=module,
                registry=frame.f_globals.setdefault("__warningregistry__", {}),
                module_globals=frame.f_globals,
            )
            return
        frame = frame.f_back
    warnings.warn(message, ImplicitInternalJobWarning, stacklevel=2)


def _internal_tenant(tenant_id: str | None | Absent, internal: object) -> str | None | Absent:
    """The tenant of a call, given ``internal=``: ``None`` for internal work (by intent,
    or by ``tenant_id=None`` alone, which warns)."""
    if internal is False:
        if tenant_id is None:
            warn_implicit_internal()
        return tenant_id
    if internal is not True:
        raise InvalidJobOptionError(f"internal={internal!r} is not allowed: expected True or False")
    if tenant_id is not ABSENT and tenant_id is not None:
        raise InvalidTenantError(
            f"internal=True with tenant_id={tenant_id!r} is not allowed: an internal job "
            "belongs to no tenant (leave tenant_id out)"
        )
    return None


def _resolve_call(
    job_type: str,
    *,
    tenant_id: str | None | Absent = ABSENT,
    internal: bool = False,
    priority: int | None = None,
    priority_level: str | PriorityLevel | None = None,
    priority_override: str | PriorityLevel | None = None,
    tenant_weight: int | None = None,
    job_id: str | None = None,
    delay_ms: int | None = None,
    attempts: int | None = None,
    backoff: int | Mapping[str, Any] | None = None,
    cost: float | None = None,
    source: str | None = None,
    actor: object = None,
) -> _Call:
    queue = get_settings().queue_for(job_type)
    tenant_id = _internal_tenant(tenant_id, internal)
    _check_audited_priority(priority)
    resolved = resolve_priority(
        tenant_id=tenant_id,
        priority=priority,
        priority_level=priority_level,
        priority_override=priority_override,
        tenant_weight=tenant_weight,
    )
    _check_options(job_id, delay_ms, attempts)
    parsed_backoff = parse_backoff(backoff)
    cost_ms = parse_cost(cost)
    tenant_job = not isinstance(tenant_id, Absent) and tenant_id is not None
    audit = None
    if _audited(resolved, tenant_job=tenant_job, override=priority_override is not None):
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
            "source": _audit_source(source),
            "actor": _actor_name(actor),
        }
    limits = resolve_tenant_limits(resolved) if tenant_job else NO_LIMITS
    return _Call(
        job_type, queue, resolved, parsed_backoff, cost_ms, audit, limits if limits.holds else None
    )


def _prepare_job(
    call: _Call,
    payload: Mapping[str, Any],
    *,
    job_id: str | None = None,
    delay_ms: int | None = None,
    attempts: int | None = None,
    **_call_options: object,
) -> _Prepared:
    """One job of ``call``: its payload checked and merged (the per-job work)."""
    resolved = call.resolved
    data, data_json = _merged_payload(payload, resolved)
    return _Prepared(
        job_type=call.job_type,
        queue=call.queue,
        new_job=NewJob(
            name=call.job_type,
            data=data,
            data_json=data_json,
            level=resolved.level,
            job_id=job_id,
            delay_ms=delay_ms,
            attempts=attempts,
            backoff=call.backoff,
            tenant=resolved.tenant_bucket,
            cost_ms=call.cost_ms,
            tenant_weight=resolved.tenant_weight,
            limits=None if call.limits is None else call.limits.add_encoded(),
        ),
        resolved=resolved,
        audit=call.audit,
        limits=call.limits,
    )


def _prepare(job_type: str, payload: Mapping[str, Any], **options: Any) -> _Prepared:
    """One job of a single-job call."""
    return _prepare_job(_resolve_call(job_type, **options), payload, **options)


def _insert_audits(prepared: Sequence[_Prepared]) -> dict[int, Any]:
    """Insert the audit rows of ``prepared`` (before the add): index -> row. A row of a
    job without a caller's id gets its id once BullMQ has assigned it."""
    from fairqueue.models import PriorityOverrideAudit

    rows = {
        index: PriorityOverrideAudit(job_id=item.new_job.job_id or "", **item.audit)
        for index, item in enumerate(prepared)
        if item.audit is not None
    }
    if rows:
        PriorityOverrideAudit.objects.bulk_create(list(rows.values()))
    return rows


def _settle_audits(rows: Mapping[int, Any], added: Sequence[AddedJob]) -> set[int]:
    """After the add: fill in BullMQ's ids, and drop the row of a job whose id already
    existed if that job has an audit row of its own (then this call added nothing). A
    job that exists without an audit row is the first attempt of a retried call (an
    ambiguous timeout), so its row stays. The indexes whose rows stay."""
    from fairqueue.models import PriorityOverrideAudit

    kept: set[int] = set()
    new_ids: list[Any] = []
    dropped: list[int] = []
    for index, row in rows.items():
        job = added[index]
        if job.priority is None:
            others = PriorityOverrideAudit.objects.filter(queue=row.queue, job_id=row.job_id)
            if others.exclude(pk=row.pk).exists():
                dropped.append(row.pk)
                continue
        elif not row.job_id:
            row.job_id = job.job_id
            new_ids.append(row)
        kept.add(index)
    if new_ids:
        PriorityOverrideAudit.objects.bulk_update(new_ids, ["job_id"])
    if dropped:
        # A queryset delete (the model's delete() refuses): a row of this transaction.
        PriorityOverrideAudit.objects.filter(pk__in=dropped).delete()
    return kept


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
            if job.held is not None:
                record_limited(item.job_type, job.held)
        results.append(_result(item, job.job_id, job.priority, index in audited))
    return results


def _result(
    item: _Prepared, job_id: str, priority: int | None, audited: bool, durable: bool = False
) -> EnqueuedJob:
    return EnqueuedJob(
        job_id=job_id,
        job_type=item.job_type,
        queue=item.queue,
        level=item.resolved.level,
        numeric_priority=item.resolved.numeric,
        rule=item.resolved.rule,
        tenant_id=item.resolved.tenant_id,
        bullmq_priority=priority,
        audited=audited,
        tenant_weight=item.resolved.tenant_weight,
        durable=durable,
    )


def _needs_audit(prepared: Sequence[_Prepared]) -> bool:
    return any(item.audit is not None for item in prepared)


def _enqueue_chunk(
    prepared: Sequence[_Prepared], batch: AddBatch | None = None
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
            rows = _insert_audits(prepared)
            added = get_sync_broker().add_jobs(queue, jobs, batch=batch)
            audited = _settle_audits(rows, added)
    except TenantBacklogFullError:
        record_limited(prepared[0].job_type, REASON_MAX_WAITING)  # the refusal, nothing else
        raise
    return _record(prepared, added, audited)


def _check_backlog(
    prepared: Sequence[_Prepared], using: str | None, *, outbox: bool = True
) -> None:
    """Refuse an enqueue that would put more than its tenant's ``max_waiting`` jobs
    waiting: those in Redis (held or takeable) plus, for a durable one, its outbox rows
    not relayed yet. The add script checks again when the jobs reach Redis (atomically;
    an outbox row it refuses stays in the outbox and is tried again), so this check only
    needs to be close."""
    from fairqueue.models import OutboxJob

    item = prepared[0]
    limits = item.limits
    if limits is None or limits.max_waiting is None:
        return
    tenant = item.new_job.tenant
    sync_broker = get_sync_broker()
    waiting = sync_broker.run(sync_broker.broker.limits.waiting, item.queue, tenant)
    if outbox:
        waiting += OutboxJob.objects.using(using).filter(queue=item.queue, tenant=tenant).count()
    if waiting + len(prepared) > limits.max_waiting:
        record_limited(item.job_type, REASON_MAX_WAITING)
        raise TenantBacklogFullError(
            tenant_id=tenant, queue=item.queue, limit=limits.max_waiting, waiting=waiting
        )


def _enqueue_prepared(prepared: Sequence[_Prepared]) -> list[EnqueuedJob]:
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


def _enqueue_durable(prepared: Sequence[_Prepared], using: str | None) -> list[EnqueuedJob]:
    """Write outbox rows and their audit rows in the caller's transaction (one of our
    own if none is open); after commit, try to relay them at once."""
    from fairqueue.enqueue.outbox import relay_after_commit
    from fairqueue.models import OutboxJob, PriorityOverrideAudit, new_outbox_job_id

    _check_backlog(prepared, using)
    with transaction.atomic(using=using):
        rows = OutboxJob.objects.using(using).bulk_create(
            [
                OutboxJob(
                    job_type=item.job_type,
                    queue=item.queue,
                    job_id=item.new_job.job_id or new_outbox_job_id(),
                    data=item.new_job.data_json,
                    level=item.new_job.level.value,
                    tenant=item.new_job.tenant,
                    tenant_weight=item.new_job.tenant_weight,
                    delay_ms=item.new_job.delay_ms,
                    attempts=item.new_job.attempts,
                    backoff=item.new_job.backoff,
                    cost_ms=item.new_job.cost_ms,
                )
                for item in prepared
            ]
        )
        audits = [
            PriorityOverrideAudit(job_id=row.bullmq_job_id, **item.audit)
            for item, row in zip(prepared, rows, strict=True)
            if item.audit is not None
        ]
        if audits:
            PriorityOverrideAudit.objects.using(using).bulk_create(audits)
    pks = [row.pk for row in rows]
    transaction.on_commit(lambda: relay_after_commit(pks, using=using), using=using)
    return [
        _result(item, row.bullmq_job_id, None, item.audit is not None, durable=True)
        for item, row in zip(prepared, rows, strict=True)
    ]


def enqueue_job(
    job_type: str,
    payload: Mapping[str, Any],
    *,
    durable: bool = False,
    using: str | None = None,
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
            :func:`enqueue_on_commit`). Redis is not contacted before commit.

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
    _check_keywords("enqueue_job", options, ("durable", "using"))
    prepared = [_prepare(job_type, payload, **options)]
    if durable:
        return _enqueue_durable(prepared, using)[0]
    return _enqueue_prepared(prepared)[0]


def enqueue_jobs(
    job_type: str,
    payloads: Sequence[Mapping[str, Any]],
    *,
    durable: bool = False,
    using: str | None = None,
    **options: Unpack[EnqueueOptions],
) -> list[EnqueuedJob]:
    """Enqueue many jobs of one type with the same options, all validated before any is
    sent, in one Redis round trip per 250 jobs (each chunk atomic: all its jobs or
    none). ``job_id`` and ``delay_ms`` are not batch options; ``durable`` as in
    :func:`enqueue_job` (one transaction for the whole batch).

    Raises:
        PartialEnqueueError: a chunk after the first failed: ``.added`` / ``.job_ids``
            are the jobs added (and audited), ``.uncertain`` the failed chunk's size,
            ``.not_sent`` the rest; retry ``payloads[len(exc.added):]``.
        BrokerUnavailableError: the first chunk failed; nothing else was sent.
    """
    _check_keywords("enqueue_jobs", options, ("durable", "using"))
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
    call = _resolve_call(job_type, **options)
    prepared = [_prepare_job(call, payload, **options) for payload in payloads]
    if durable:
        return _enqueue_durable(prepared, using)
    return _enqueue_prepared(prepared)


async def aenqueue_job(
    job_type: str, payload: Mapping[str, Any], **options: Unpack[EnqueueOptions]
) -> EnqueuedJob:
    """Async twin of :func:`enqueue_job`, for async views: the Redis call is awaited on
    the caller's event loop and the plan lookup goes through the ORM in a thread. An
    audited job runs the sync path in a thread instead, so its audit row and its add
    share one transaction."""
    _check_keywords("aenqueue_job", options)
    if options.get("tenant_id", ABSENT) is None and options.get("internal", False) is False:
        warn_implicit_internal()  # here, in the caller's stack, not in the thread below
        options = {**options, "internal": True}
    prepared = await sync_to_async(_prepare)(job_type, payload, **options)
    if prepared.audit is not None:
        return (await sync_to_async(_enqueue_prepared)([prepared]))[0]
    added = await get_broker().adding.add_jobs(prepared.queue, [prepared.new_job])
    return _record([prepared], added, set())[0]


def enqueue_on_commit(
    job_type: str,
    payload: Mapping[str, Any],
    *,
    using: str | None = None,
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
    """
    _check_keywords("enqueue_on_commit", options, ("using",))
    return enqueue_job(job_type, payload, durable=True, using=using, **options)
