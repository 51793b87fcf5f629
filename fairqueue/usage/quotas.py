"""Quotas per plan: worker seconds per day or month, and what happens over one
(``demote``, read at enqueue and cached per process for :data:`DEMOTED_CHECK_S`, or
``hold``; docs/usage.md). The loop checks after each ledger write, for the tenants
whose rows it changed, ended plus running worker time
(:mod:`fairqueue.usage.quota_watch`), and again between its steps when a watched
tenant's running attempts could take it over. An account's quota
(:mod:`fairqueue.usage.account_quotas`) goes through the same hold, audit and lift.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from django.db import transaction
from django.db.models import Sum

from fairqueue.conf import get_settings
from fairqueue.conf.usage_settings import NO_QUOTA
from fairqueue.scheduling.hierarchy import ACCOUNT_MARK
from fairqueue.scheduling.levels import INTERNAL_TENANT
from fairqueue.usage.holds import (
    account_tenants,
    audit_hold,
    end_hold,
    now,
    pause_in,
    queues_of,
    resume_in,
)
from fairqueue.usage.ledger import Written
from fairqueue.usage.quota_watch import QuotaWatch, Watched

logger = logging.getLogger("fairqueue.quotas")

ACTOR: Final = "fairqueue quotas"
#: How long a process trusts its list of demoted tenants (seconds).
DEMOTED_CHECK_S: Final = 0.25
#: Near quota: at least this share of it used (the dashboard's list).
NEAR_SHARE: Final = 0.8
_DEMOTED_CACHE_KEY: Final = "fairqueue:quota:demoted"
#: The loop process's tenants watched for their running time (one loop per process).
watch = QuotaWatch()


@dataclass(frozen=True, slots=True)
class Quota:
    """A tenant's quota as it applies now."""

    worker_seconds: int
    period: str
    action: str


def quota_of(plan: Any) -> Quota | None:
    """The quota of a ``TenantPlan`` (its own values win over its tier's), or ``None``."""
    rule = get_settings().quotas.get(plan.resolve_plan() or "", NO_QUOTA)
    seconds = plan.quota_worker_seconds or rule.worker_seconds
    if not seconds:
        return None
    return Quota(seconds, plan.quota_period or rule.period, rule.action)


def period_bounds(at: dt.datetime, period: str) -> tuple[dt.date, dt.datetime]:
    """The first day of the period ``at`` falls in, and when it ends (UTC)."""
    day = at.astimezone(dt.UTC).date()
    if period == "month":
        first = day.replace(day=1)
        following = (first + dt.timedelta(days=32)).replace(day=1)
    else:
        first, following = day, day + dt.timedelta(days=1)
    return first, dt.datetime.combine(following, dt.time(), tzinfo=dt.UTC)


def used_ms(tenant_id: str, period: str, at: dt.datetime | None = None) -> int:
    """The tenant's worker time in the period ``at`` falls in, over every job type."""
    from fairqueue.models import TenantUsage

    first, end = period_bounds(at or now(), period)
    found = TenantUsage.objects.filter(
        tenant_id=tenant_id, day__gte=first, day__lt=end.date()
    ).aggregate(ms=Sum("worker_ms"))
    return int(found["ms"] or 0)


def after_write(queue: str, written: Written) -> None:
    """The loop's quota step: end the holds whose period is over, check the tenants
    whose rows this write changed (an attempt started or ended) against their ended
    worker time, and watch those not over it for their running time
    (:mod:`fairqueue.usage.quota_watch`)."""
    expire()
    tenants = changed_tenants(written)
    if tenants:
        _check_changed(tenants)
    watch.check(_act)


def changed_tenants(written: Written) -> dict[str, str]:
    """The tenants whose ledger rows ``written`` changed (an attempt started or ended),
    each with the first such row's job type; internal work has no quota (its reserved
    key is no tenant's)."""
    tenants: dict[str, str] = {}
    for change in written.changes:
        if (change.worker_ms > 0 or change.started > 0) and change.tenant_id != INTERNAL_TENANT:
            tenants.setdefault(change.tenant_id, change.job_type)
    return tenants


def check_running() -> int:
    """The loop's check between its steps: the watched tenants whose predicted crossing
    has come, against ended plus running time. Returns how many went over."""
    return watch.check(_act, due_only=True)


def _act(tenant_id: str, quota: Any, used: int, job_type: str) -> None:
    exceed(tenant_id, quota, used, job_type=job_type)


def _check_changed(tenants: dict[str, str]) -> None:
    from fairqueue.models import TenantHold, TenantPlan

    active = set(
        TenantHold.objects.filter(
            tenant_id__in=tenants, reason=TenantHold.QUOTA, lifted_at__isnull=True
        ).values_list("tenant_id", flat=True)
    )
    watch.drop(active)
    plans = {
        plan.tenant_id: plan
        for plan in TenantPlan.objects.filter(tenant_id__in=tenants).select_related("account")
    }
    watch.drop(set(tenants) - set(plans))
    for tenant_id in set(plans) - active:
        quota = quota_of(plans[tenant_id])
        if quota is None:
            watch.drop([tenant_id])
            continue
        used = used_ms(tenant_id, quota.period)
        if used >= quota.worker_seconds * 1000:
            watch.drop([tenant_id])
            exceed(tenant_id, quota, used, job_type=tenants[tenant_id])
            continue
        _, until = period_bounds(now(), quota.period)
        watch.note(
            tenant_id, Watched(quota, quota.worker_seconds * 1000, used, until, tenants[tenant_id])
        )


def exceed(tenant_id: str, quota: Quota, used: int, *, job_type: str) -> None:
    """Apply ``quota``'s action to a tenant over it (:func:`hold_over`)."""
    _, until = period_bounds(now(), quota.period)
    why = (
        f"used {used / 1000:.1f} s of worker time, quota {quota.worker_seconds} s "
        f"a {quota.period}; until {until:%Y-%m-%d %H:%M} UTC"
    )
    hold_over(tenant_id, [tenant_id], quota, job_type=job_type, why=why)


def hold_over(
    key: str, tenants: list[str], quota: Quota, *, job_type: str, why: str, on: Sequence[str] = ()
) -> Any:
    """Apply ``quota``'s action to ``tenants``, over it under the hold key ``key`` (a
    tenant's id, or an account's): Redis first for a hold (as ``pause_tenant`` does),
    undone if the database write fails. Audited on ``on`` (default: ``key``, with the
    job type that made it). Returns the ``TenantHold``."""
    from fairqueue.metrics import by_job_type, get_metrics
    from fairqueue.models import TenantHold

    _, until = period_bounds(now(), quota.period)
    queues = queues_of("")
    holding = quota.action == TenantHold.HOLD
    for tenant_id in tenants if holding else ():
        pause_in(queues, tenant_id)
    try:
        with transaction.atomic():
            hold = TenantHold.objects.create(
                tenant_id=key,
                reason=TenantHold.QUOTA,
                action=quota.action,
                created_at=now(),
                until=until,
            )
            audited = {"on": on} if on else {"job_type": job_type}
            audit_hold(hold, event="exceeded", actor=ACTOR, why=why, **audited)
    except Exception:
        for tenant_id in tenants if holding else ():
            resume_in(queues, tenant_id)
        raise
    by_job_type(get_metrics().quota_exceeded, job_type, quota.action).inc()
    forget_demoted()
    logger.info("a quota was exceeded: %s until the period ends", quota.action)
    return hold


def expire(*, accounts: bool = False) -> int:
    """End the quota holds and demotions whose period is over, the tenants' (or with
    ``accounts``, the accounts'). Returns how many."""
    from fairqueue.models import TenantHold

    due = TenantHold.objects.filter(
        reason=TenantHold.QUOTA, lifted_at__isnull=True, until__lte=now()
    )
    marked = {"tenant_id__startswith": ACCOUNT_MARK}
    due = due.filter(**marked) if accounts else due.exclude(**marked)
    ended = 0
    for hold in due:
        lift_hold(hold, event="period_ended", actor=ACTOR, why="the quota's period ended")
        ended += 1
    return ended


def lift_quota(tenant_id: str, *, actor: object = None, source: str = "") -> bool:
    """Lift a tenant's quota hold or demotion by hand (or an account's, by its hold
    key), until it goes over its quota again (its usage is not reset: the next ledger
    write that adds worker time applies the quota again). Returns whether one was in
    force."""
    from fairqueue.models import TenantHold

    hold = TenantHold.objects.filter(
        tenant_id=tenant_id, reason=TenantHold.QUOTA, lifted_at__isnull=True
    ).first()
    if hold is None:
        return False
    lift_hold(hold, event="lifted", actor=actor, why=source or "lifted by an operator")
    return True


def lift_hold(hold: Any, *, event: str, actor: object, why: str) -> None:
    """End a quota hold (an account's audited on the account and each of its tenants),
    then resume each tenant it held where nothing else holds it."""
    from fairqueue.models import TenantHold

    members = account_tenants([hold.tenant_id]).get(hold.tenant_id)  # None: a tenant's
    with transaction.atomic():
        end_hold(hold, event=event, actor=actor, why=why)
        if members:
            audit_hold(hold, event=event, actor=actor, why=why, on=members)
    if hold.action == TenantHold.HOLD:
        # After the commit: a failure here leaves tenants held (never the reverse); the
        # operator or the next period end lifts again.
        for tenant_id in [hold.tenant_id] if members is None else members:
            resume_in(queues_of(""), tenant_id, excluding=hold.pk)
    forget_demoted()


# -- demotion at enqueue ------------------------------------------------------------------

_demoted_lock = threading.Lock()
_demoted: tuple[float, frozenset[str]] = (0.0, frozenset())


def forget_demoted() -> None:
    """Drop the demoted tenants' list here and in the Django cache (a transition)."""
    global _demoted
    from django.core.cache import caches

    with _demoted_lock:
        _demoted = (0.0, frozenset())
    try:
        caches[get_settings().cache_alias].delete(_DEMOTED_CACHE_KEY)
    except Exception as exc:  # the entry expires within DEMOTED_CHECK_S * 10 anyway
        logger.warning("demoted tenants not refreshed in the cache (%s)", type(exc).__name__)


def demoted_tenants() -> frozenset[str]:
    """The tenants a quota demotes now: one Django-cache read per process per
    :data:`DEMOTED_CHECK_S`, the database on a cache miss."""
    global _demoted
    checked, tenants = _demoted
    if time.monotonic() - checked < DEMOTED_CHECK_S:
        return tenants
    from django.core.cache import caches

    cache = caches[get_settings().cache_alias]
    found = cache.get(_DEMOTED_CACHE_KEY)
    if not isinstance(found, frozenset):
        from fairqueue.models import TenantHold

        keys = TenantHold.objects.filter(
            reason=TenantHold.QUOTA, action=TenantHold.DEMOTE, lifted_at__isnull=True
        ).values_list("tenant_id", flat=True)
        # an account's demotion demotes each of its tenants
        members = account_tenants(keys)
        found = frozenset(t for key in keys for t in members.get(key, [key]))
        cache.set(_DEMOTED_CACHE_KEY, found, int(DEMOTED_CHECK_S * 10))
    with _demoted_lock:
        _demoted = (time.monotonic(), found)
    return found


def is_demoted(tenant_id: str) -> bool:
    """Whether a quota demotes ``tenant_id``'s new jobs to ``low`` now. Never raises: a
    failure to read counts as not demoted (logged by class)."""
    try:
        return tenant_id in demoted_tenants()
    except Exception as exc:
        logger.warning("demoted tenants not read (%s)", type(exc).__name__)
        return False


# -- the dashboard ------------------------------------------------------------------------


def usage_by_owner(
    rows: Any, owner: Callable[[str], str], at: dt.datetime
) -> dict[str, dict[str, int]]:
    """Worker ms today and this month (UTC) per owner of ``rows`` (``TenantUsage`` rows
    of this month, ``tenant_id``/``day``/``ms``): a tenant, or its account."""
    today = at.astimezone(dt.UTC).date()
    usage: dict[str, dict[str, int]] = {}
    for row in rows.values("tenant_id", "day").annotate(ms=Sum("worker_ms")):
        got = usage.setdefault(owner(row["tenant_id"]), {"day": 0, "month": 0})
        got["month"] += int(row["ms"] or 0)
        if row["day"] == today:
            got["day"] += int(row["ms"] or 0)
    return usage


def status_row(
    key: tuple[str, str], plan: str, quota: Quota, used: int, hold: Any, near: float
) -> dict[str, Any] | None:
    """A quota list's row (``key``: its id's name and value), or ``None`` when neither
    near (``near`` of its quota or more) nor over."""
    share = used / (quota.worker_seconds * 1000)
    if share < near and hold is None:
        return None
    return {
        key[0]: key[1],
        "plan": plan,
        "used_s": used / 1000,
        "quota_s": quota.worker_seconds,
        "period": quota.period,
        "share": share,
        "state": "over" if hold is not None else "near",
        "action": quota.action,
        "until": hold.until if hold is not None else None,
    }


def quota_status(*, limit: int = 50, near: float = NEAR_SHARE) -> list[dict[str, Any]]:
    """Tenants near (``near`` of their quota or more) or over quota in the current
    period, most used share first, at most ``limit``: what the dashboard lists."""
    from fairqueue.models import TenantHold, TenantPlan, TenantUsage

    at = now()
    month_first, _ = period_bounds(at, "month")
    rows = TenantUsage.objects.filter(day__gte=month_first)
    usage = usage_by_owner(rows, lambda tenant_id: tenant_id, at)
    holds = {
        hold.tenant_id: hold
        for hold in TenantHold.objects.filter(reason=TenantHold.QUOTA, lifted_at__isnull=True)
    }
    out = []
    plans = TenantPlan.objects.filter(tenant_id__in=set(usage) | set(holds))
    for plan in plans.select_related("account"):
        quota = quota_of(plan)
        if quota is None:
            continue
        used = usage.get(plan.tenant_id, {}).get(quota.period, 0)
        key, hold = ("tenant_id", plan.tenant_id), holds.get(plan.tenant_id)
        row = status_row(key, plan.resolve_plan(), quota, used, hold, near)
        if row is not None:
            out.append(row)
    out.sort(key=lambda row: (-row["share"], row["tenant_id"]))
    return out[:limit]
