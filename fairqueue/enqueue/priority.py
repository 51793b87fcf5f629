"""Plan-based priority: which level a new job gets, and why; its tenant weight and account
beside it.

The resolution order is docs/design.md's "Levels and priorities" (in full with
its rules' names in docs/enqueueing.md, "Priority resolution"): an explicit level, an
audited override, an internal job, the tenant's plan, else normal; a quota-demoted
tenant gets low. The lookups are pluggable so that workers need not import the web
project: ``wire_tenant_plan_lookup()``, ``wire_tenant_weight_lookup()`` and
``set_subscription_to_plan_tier(fn)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from fairqueue.conf import get_settings
from fairqueue.exceptions import (
    ConflictingPriorityError,
    InvalidAccountError,
    UnknownAccountError,
)
from fairqueue.plans import priority_from_plan
from fairqueue.scheduling.levels import (
    DEFAULT_TENANT,
    DEFAULT_TENANT_WEIGHT,
    INTERNAL_TENANT,
    MAX_TENANT_WEIGHT,
    MIN_TENANT_WEIGHT,
    NUMERIC_PRIORITY_BY_LEVEL,
    PriorityLevel,
    normalize_priority,
    parse_level,
    validate_account_id,
    validate_tenant_id,
    validate_tenant_weight,
)
from fairqueue.scheduling.limits import NO_LIMITS, TenantLimits

__all__ = [
    "ABSENT",
    "MAX_TENANT_WEIGHT",
    "MIN_TENANT_WEIGHT",
    "Absent",
    "PriorityRule",
    "ResolvedPriority",
    "TenantPlanLookup",
    "TenantWeightLookup",
    "get_tenant_plan_lookup",
    "get_tenant_weight_lookup",
    "priority_from_override",
    "resolve_priority",
    "resolve_tenant_limits",
    "tenant_limits",
    "unwire_tenant_plan_lookup",
    "unwire_tenant_weight_lookup",
    "validate_tenant_id",
    "validate_tenant_weight",
    "wire_tenant_plan_lookup",
    "wire_tenant_weight_lookup",
]

logger = logging.getLogger("fairqueue.priority")


class Absent:
    """Marks "argument not given", which differs from ``tenant_id=None`` (internal job)."""

    _instance: Absent | None = None

    def __new__(cls) -> Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Final = Absent()


class PriorityRule(StrEnum):
    """Which rule of the resolution order decided a job's level."""

    EXPLICIT_LEVEL = "explicit_level"
    EXPLICIT_PRIORITY = "explicit_priority"
    OVERRIDE = "override"
    INTERNAL = "internal"
    PLAN = "plan"
    #: The lookup is wired and answered "no plan" (no ``TenantPlan`` row): the default
    #: level, told apart from a plan that decided it.
    NO_PLAN = "no_plan"
    PLAN_LOOKUP_FAILED = "plan_lookup_failed"
    NO_LOOKUP = "no_lookup"
    FLAG_DISABLED = "flag_disabled"
    DEFAULT = "default"
    #: a quota demotes the tenant: low, whatever level the call named (rules 1, 4-5)
    QUOTA_DEMOTED = "quota_demoted"


@dataclass(frozen=True, slots=True)
class ResolvedPriority:
    """The outcome of :func:`resolve_priority`.

    ``tenant_id`` is what goes into the payload's ``tenantId`` (``None`` for internal
    jobs); ``tenant_bucket`` is the grouping key the scheduler uses. ``tenant_weight``
    is the bucket's share of turns inside its level (see the module docstring).
    ``account_id`` (the payload's ``accountId``) and ``account_weight``: the tenant's
    account, ``None`` for a job of no account.
    """

    level: PriorityLevel
    numeric: int
    rule: PriorityRule
    tenant_id: str | None
    plan: str | None = None
    tenant_weight: int = DEFAULT_TENANT_WEIGHT
    account_id: str | None = None
    account_weight: int = DEFAULT_TENANT_WEIGHT

    @property
    def tenant_bucket(self) -> str:
        """The payload's tenant, or the reserved key of internal jobs."""
        return self.tenant_id if self.tenant_id is not None else INTERNAL_TENANT


TenantPlanLookup = Callable[[str], str | None]
TenantWeightLookup = Callable[[str], int]

_lookup: TenantPlanLookup | None = None
_weight_lookup: TenantWeightLookup | None = None
#: Wired with the database weight lookup: limits live on the same ``TenantPlan`` row.
_limits_lookup: Callable[[str, str | None], TenantLimits] | None = None
#: Wired with it too: a tenant's account is on that row (``(account_id, weight)``).
_account_lookup: Callable[[str], tuple[str, int] | None] | None = None


def priority_from_override(override: object) -> PriorityLevel:
    """Map ``priority_override`` ('critical' | 'high' | 'normal' | 'low') to a level."""
    return parse_level(override, argument="priority_override")


def wire_tenant_plan_lookup(lookup: TenantPlanLookup | None = None) -> None:
    """Make rule 4 apply: tenants' plans now decide their jobs' level.

    Args:
        lookup: ``tenant_id -> plan slug or None``. Defaults to the database lookup of
            ``fairqueue.models`` (cached through the Django cache); the default also
            wires the database weight lookup, since plan and weight live on the same
            ``TenantPlan`` row. A custom lookup leaves the weight lookup as it is.
    """
    global _lookup
    if lookup is None:
        from fairqueue.enqueue.lookups import lookup_tenant_plan

        lookup = lookup_tenant_plan
        wire_tenant_weight_lookup()
    _lookup = lookup


def unwire_tenant_plan_lookup() -> None:
    """Back to "no lookup": tenant jobs get normal (rule 5). Used by tests and rollback."""
    global _lookup
    _lookup = None


def get_tenant_plan_lookup() -> TenantPlanLookup | None:
    return _lookup


def wire_tenant_weight_lookup(lookup: TenantWeightLookup | None = None) -> None:
    """Give tenant jobs the weight of their tenant instead of 1.

    Args:
        lookup: ``tenant_id -> weight``. Defaults to the database lookup of
            ``fairqueue.models`` (the same cache entry as the plan). A lookup that raises
            or answers anything but an integer in the allowed range gives weight 1.
    """
    global _weight_lookup, _limits_lookup, _account_lookup
    _limits_lookup = _account_lookup = None
    if lookup is None:
        from fairqueue.enqueue.lookups import (
            lookup_tenant_account,
            lookup_tenant_limits,
            lookup_tenant_weight,
        )

        lookup = lookup_tenant_weight
        _limits_lookup = lookup_tenant_limits
        _account_lookup = lookup_tenant_account
    _weight_lookup = lookup


def unwire_tenant_weight_lookup() -> None:
    """Back to "no weight lookup": every tenant weighs 1 unless a weight is passed.

    Independent of :func:`unwire_tenant_plan_lookup`, which leaves weights wired.
    """
    global _weight_lookup, _limits_lookup, _account_lookup
    _weight_lookup = None
    _limits_lookup = _account_lookup = None


def resolve_tenant_limits(resolved: ResolvedPriority) -> TenantLimits:
    """The limits of ``resolved``'s tenant: from its ``TenantPlan`` row and its plan
    tier's defaults when the database lookups are wired (the same cache entry as its
    plan and weight), else none. Internal jobs and the ``default`` bucket have none."""
    if _limits_lookup is None or resolved.tenant_id is None:
        return NO_LIMITS
    return _looked_up_limits(resolved.tenant_id, resolved.plan)


def _looked_up_limits(tenant_id: str, plan: str | None) -> TenantLimits:
    lookup = _limits_lookup
    if lookup is None:
        return NO_LIMITS
    try:
        return lookup(tenant_id, plan)
    except Exception as exc:  # a broken lookup must not stop enqueues, like the weight's
        # The add script still holds a paused tenant's jobs (it checks Redis's flags).
        logger.warning("tenant limits lookup failed (%s); none applied", type(exc).__name__)
        return NO_LIMITS


def resolve_account_limits(account_id: str | None) -> TenantLimits | None:
    """The limits of account ``account_id`` when it has any (``None``: no account, none
    set, or the database lookups are not wired), via the same cache layers as its
    weight."""
    if account_id is None or _account_lookup is None:
        return None
    from fairqueue.enqueue.lookups import lookup_account_limits

    try:
        limits = lookup_account_limits(account_id)
    except Exception as exc:  # a broken lookup must not stop enqueues, like the tenant's
        logger.warning("account limits lookup failed (%s); none applied", type(exc).__name__)
        return None
    return limits if limits.holds else None


def tenant_limits(tenant_id: str) -> TenantLimits:
    """The limits of the tenant ``tenant_id`` (the outbox relay: its rows keep the tenant,
    and its limits are the ones in force when the job reaches Redis)."""
    return _looked_up_limits(tenant_id, None)


def get_tenant_weight_lookup() -> TenantWeightLookup | None:
    return _weight_lookup


def resolve_priority(
    *,
    tenant_id: str | None | Absent = ABSENT,
    priority: int | None = None,
    priority_level: str | PriorityLevel | None = None,
    priority_override: str | PriorityLevel | None = None,
    enabled: bool | None = None,
    tenant_weight: int | None = None,
    account_id: str | None = None,
) -> ResolvedPriority:
    """Resolve a job's level by the resolution order, say which rule decided, and resolve the
    tenant's weight inside that level.

    Args:
        enabled: the ``JOB_PRIORITY_ENABLED`` flag; read from settings when ``None``.
            It does not affect the weight.
        tenant_weight: an explicit weight, which wins over the weight lookup (also for
            internal jobs and the ``default`` bucket, which otherwise weigh 1).
            Server-side only, like ``priority_override``.
        account_id: the tenant's account, instead of the one its ``TenantPlan`` names
            (which it may only repeat); it must exist. Server-side only.

    Raises:
        ConflictingPriorityError: both ``priority`` and ``priority_level`` given.
        InvalidPriorityError, InvalidPriorityLevelError, InvalidTenantError,
        InvalidTenantWeightError, InvalidAccountError: bad values.
        UnknownAccountError: ``account_id`` names no ``Account``.
    """
    if tenant_id is not ABSENT and tenant_id is not None:
        tenant_id = validate_tenant_id(tenant_id)
    if tenant_weight is not None:
        tenant_weight = validate_tenant_weight(tenant_weight)
    if account_id is not None:
        account_id = validate_account_id(account_id)
        if not isinstance(tenant_id, str):
            raise InvalidAccountError(
                f"account_id=<{len(account_id)} characters> is not allowed without a "
                "tenant_id: an account groups tenants, and an internal job or one of no "
                "tenant belongs to none"
            )
    resolved = _resolve_level(
        tenant_id=tenant_id,
        priority=priority,
        priority_level=priority_level,
        priority_override=priority_override,
        enabled=enabled,
    )
    if (
        isinstance(tenant_id, str)
        and resolved.level is not PriorityLevel.LOW
        and resolved.rule is not PriorityRule.OVERRIDE
        and _demoted(tenant_id)
    ):
        # A quota's demotion holds whatever level the call named: otherwise any call
        # naming one (priority_level=, priority=, @task(priority=)) skips it. Only an
        # operator's audited priority_override is above it (docs/usage.md#quotas).
        resolved = _resolved(
            PriorityLevel.LOW, PriorityRule.QUOTA_DEMOTED, tenant_id, plan=resolved.plan
        )
    if not isinstance(tenant_id, str):  # internal job, or no tenant at all
        if tenant_weight is None:
            return resolved
        account = None
    else:
        account = _resolved_account(tenant_id, account_id)
    if tenant_weight is None:
        tenant_weight = _looked_up_weight(tenant_id)  # type: ignore[arg-type]
    # Built directly, not with dataclasses.replace (a few us per call).
    return ResolvedPriority(
        resolved.level,
        resolved.numeric,
        resolved.rule,
        resolved.tenant_id,
        resolved.plan,
        tenant_weight,
        *(account or (None, DEFAULT_TENANT_WEIGHT)),
    )


def _resolved_account(tenant_id: str, account_id: str | None) -> tuple[str, int] | None:
    """The account of ``tenant_id``'s job: ``account_id`` when given (it must exist, and
    may only repeat the account the tenant's row names), else the tenant's row's."""
    lookup = _account_lookup
    own: tuple[str, int] | None = None
    if lookup is not None:
        try:
            own = lookup(tenant_id)
        except Exception as exc:  # a broken lookup must not stop enqueues, like the weight's
            logger.warning("tenant account lookup failed (%s); none applied", type(exc).__name__)
    if account_id is None:
        return own
    if own is not None and own[0] != account_id:
        raise InvalidAccountError(
            f"account_id=<{len(account_id)} characters> is not allowed for this tenant: it "
            "belongs to another account (its TenantPlan's); a tenant belongs to at most one"
        )
    if own is not None:
        return own
    from fairqueue.enqueue.lookups import lookup_account_weight

    weight = lookup_account_weight(account_id)
    if weight is None:
        raise UnknownAccountError(
            f"account_id={account_id!r} is not allowed: no Account has that id (create it "
            "in the admin first, or leave account_id out)"
        )
    return account_id, weight


def _looked_up_weight(tenant_id: str) -> int:
    lookup = _weight_lookup
    if lookup is None:
        return DEFAULT_TENANT_WEIGHT
    try:
        return validate_tenant_weight(lookup(tenant_id))
    except Exception as exc:  # a broken lookup must not stop enqueues
        # The exception's type only: its message may name the tenant (or echo the value).
        logger.warning("tenant weight lookup failed (%s); using 1", type(exc).__name__)
        return DEFAULT_TENANT_WEIGHT


def _resolve_level(
    *,
    tenant_id: str | None | Absent,
    priority: int | None,
    priority_level: str | PriorityLevel | None,
    priority_override: str | PriorityLevel | None,
    enabled: bool | None,
) -> ResolvedPriority:
    payload_tenant: str | None = DEFAULT_TENANT if isinstance(tenant_id, Absent) else tenant_id

    if priority is not None and priority_level is not None:
        raise ConflictingPriorityError(
            f"priority={priority!r} and priority_level={priority_level!r} are not allowed "
            "together: give one of them"
        )
    override_level = (
        priority_from_override(priority_override) if priority_override is not None else None
    )
    if priority_level is not None:
        level = parse_level(priority_level)
        return _resolved(level, PriorityRule.EXPLICIT_LEVEL, payload_tenant)
    if priority is not None:
        level = normalize_priority(priority)
        return ResolvedPriority(
            level=level,
            numeric=priority if priority > 0 else NUMERIC_PRIORITY_BY_LEVEL[level],
            rule=PriorityRule.EXPLICIT_PRIORITY,
            tenant_id=payload_tenant,
        )
    if override_level is not None:
        return _resolved(override_level, PriorityRule.OVERRIDE, payload_tenant)
    if tenant_id is None:
        return _resolved(PriorityLevel.CRITICAL, PriorityRule.INTERNAL, None)
    if isinstance(tenant_id, Absent):
        return _resolved(PriorityLevel.NORMAL, PriorityRule.DEFAULT, DEFAULT_TENANT)

    if enabled is None:
        enabled = get_settings().priority_enabled
    if not enabled:
        return _resolved(PriorityLevel.NORMAL, PriorityRule.FLAG_DISABLED, tenant_id)
    lookup = _lookup
    if lookup is None:
        return _resolved(PriorityLevel.NORMAL, PriorityRule.NO_LOOKUP, tenant_id)
    try:
        plan = lookup(tenant_id)
    except Exception as exc:  # a broken lookup must not stop enqueues
        logger.warning("tenant plan lookup failed (%s); using normal", type(exc).__name__)
        return _resolved(PriorityLevel.NORMAL, PriorityRule.PLAN_LOOKUP_FAILED, tenant_id)
    if plan is None:
        return _resolved(PriorityLevel.NORMAL, PriorityRule.NO_PLAN, tenant_id)
    # over its quota: resolve_priority makes it low until the period ends
    return _resolved(priority_from_plan(plan), PriorityRule.PLAN, tenant_id, plan=plan)


def _demoted(tenant_id: str) -> bool:
    if not get_settings().quotas and _lookup is not _default_lookup():
        return False
    from fairqueue.usage.quotas import is_demoted

    return is_demoted(tenant_id)


def _default_lookup() -> TenantPlanLookup:
    from fairqueue.enqueue.lookups import lookup_tenant_plan

    return lookup_tenant_plan


def _resolved(
    level: PriorityLevel, rule: PriorityRule, tenant_id: str | None, plan: str | None = None
) -> ResolvedPriority:
    return ResolvedPriority(
        level=level,
        numeric=NUMERIC_PRIORITY_BY_LEVEL[level],
        rule=rule,
        tenant_id=tenant_id,
        plan=plan,
    )
