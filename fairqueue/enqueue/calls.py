"""One enqueue call, resolved once (:class:`Call`: queue, level, options, audit fields,
limits), and each of its jobs prepared from it (:class:`Prepared`), whichever path adds
them: straight to Redis (:mod:`fairqueue.enqueue.api`) or through the outbox
(:mod:`fairqueue.enqueue.durable`).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final

from fairqueue.broker import NewJob
from fairqueue.conf import get_settings
from fairqueue.enqueue.audit import audit_fields, check_audited_priority, is_audited
from fairqueue.enqueue.options import check_options, merged_payload, parse_backoff, parse_cost
from fairqueue.enqueue.priority import (
    ABSENT,
    Absent,
    PriorityRule,
    ResolvedPriority,
    resolve_account_limits,
    resolve_priority,
    resolve_tenant_limits,
)
from fairqueue.enqueue.status_tokens import status_token
from fairqueue.exceptions import (
    ImplicitInternalJobWarning,
    InvalidJobOptionError,
    InvalidTenantError,
)
from fairqueue.scheduling.estimate import StartEstimate
from fairqueue.scheduling.levels import DEFAULT_TENANT_WEIGHT, PriorityLevel
from fairqueue.scheduling.limits import NO_LIMITS, TenantLimits
from fairqueue.scheduling.wire import add_encoded_limits, encoded_limits


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """What an enqueue did.

    ``bullmq_priority`` is ``None`` when a job with the given ``job_id`` already existed:
    BullMQ keeps the existing job and adds nothing (``created`` is then ``False``).
    ``tenant_weight`` is the tenant's resolved weight inside its level; ``account_id``
    its account (``None``: none). ``durable`` jobs
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
    #: When it is expected to start, with ``estimate=True`` (else ``None``: not asked).
    estimate: StartEstimate | None = None
    account_id: str | None = None

    @property
    def created(self) -> bool:
        return self.bullmq_priority is not None

    @property
    def status_token(self) -> str:
        """A signed, expiring token for the status endpoint (``fairqueue.status.urls``):
        it names this job only, and the endpoint shows nothing of its payload or tenant."""
        return status_token(self.job_type, self.job_id)


@dataclass(frozen=True, slots=True)
class Prepared:
    """One job of a call, checked and ready to add (or to write to the outbox)."""

    job_type: str
    queue: str
    new_job: NewJob
    resolved: ResolvedPriority
    audit: dict[str, Any] | None
    limits: TenantLimits | None = None
    #: Its account's limits (``None``: none).
    account_limits: TenantLimits | None = None


@dataclass(frozen=True, slots=True)
class Call:
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
    #: Its account's limits (``None``: no account, or one without limits).
    account_limits: TenantLimits | None = None


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
    frame: FrameType | None = sys._getframe(1)
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


def resolve_call(
    job_type: str,
    *,
    tenant_id: str | None | Absent = ABSENT,
    internal: bool = False,
    priority: int | None = None,
    priority_level: str | PriorityLevel | None = None,
    priority_override: str | PriorityLevel | None = None,
    tenant_weight: int | None = None,
    account_id: str | None = None,
    job_id: str | None = None,
    delay_ms: int | None = None,
    attempts: int | None = None,
    backoff: int | Mapping[str, Any] | None = None,
    cost: float | None = None,
    source: str | None = None,
    actor: object = None,
) -> Call:
    """What every job of a call shares, resolved and checked once: its queue, level,
    tenant weight, account and limits, options and audit fields."""
    queue = get_settings().queue_for(job_type)
    tenant_id = _internal_tenant(tenant_id, internal)
    check_audited_priority(priority)
    resolved = resolve_priority(
        tenant_id=tenant_id,
        priority=priority,
        priority_level=priority_level,
        priority_override=priority_override,
        tenant_weight=tenant_weight,
        account_id=account_id,
    )
    check_options(job_id, delay_ms, attempts)
    parsed_backoff = parse_backoff(backoff)
    cost_ms = parse_cost(cost)
    tenant_job = not isinstance(tenant_id, Absent) and tenant_id is not None
    audit = None
    if is_audited(resolved, tenant_job=tenant_job, override=priority_override is not None):
        audit = audit_fields(
            job_type,
            queue,
            resolved,
            priority=priority,
            priority_level=priority_level,
            priority_override=priority_override,
            source=source,
            actor=actor,
        )
    limits = resolve_tenant_limits(resolved) if tenant_job else NO_LIMITS
    account = resolved.account_id
    of_account = None if account is None else resolve_account_limits(account)
    return Call(
        job_type,
        queue,
        resolved,
        parsed_backoff,
        cost_ms,
        audit,
        # a tenant of an account with limits is held like a limited tenant (maybe with no
        # limits of its own): its account's limits are decided where its holds are
        limits if limits.holds or of_account is not None else None,
        of_account,
    )


def prepare_job(
    call: Call,
    payload: Mapping[str, Any],
    *,
    job_id: str | None = None,
    delay_ms: int | None = None,
    attempts: int | None = None,
    **_call_options: object,
) -> Prepared:
    """One job of ``call``: its payload checked and merged (the per-job work)."""
    resolved = call.resolved
    data, data_json = merged_payload(payload, resolved)
    return Prepared(
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
            limits=None if call.limits is None else add_encoded_limits(call.limits),
            account=resolved.account_id,
            account_weight=resolved.account_weight,
            account_limits=(
                None if call.account_limits is None else encoded_limits(call.account_limits)
            ),
        ),
        resolved=resolved,
        audit=call.audit,
        limits=call.limits,
        account_limits=call.account_limits,
    )


def prepare(job_type: str, payload: Mapping[str, Any], **options: Any) -> Prepared:
    """One job of a single-job call."""
    return prepare_job(resolve_call(job_type, **options), payload, **options)


def result(
    item: Prepared, job_id: str, priority: int | None, audited: bool, durable: bool = False
) -> EnqueuedJob:
    """What the enqueue of ``item`` returns to its caller."""
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
        account_id=item.resolved.account_id,
    )
