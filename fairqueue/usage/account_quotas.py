"""Account quotas: worker seconds per day or month over all of an account's tenants
(``Account.quota_worker_seconds`` / ``quota_period``, docs/usage.md#quotas).

An account's use in a period is the sum over the tenants it owns now. After each ledger
write (:func:`after_write`, beside the tenants' step) the accounts of the changed
tenants are checked, and one over its quota gets its tier's action on every one of its
tenants, as a tenant's own quota does, through the same hold, audit and lift
(:mod:`fairqueue.usage.quotas`), under one ``TenantHold`` keyed by the account
(:func:`~fairqueue.usage.holds.account_hold_key`). A tenant's own quota and its
account's both hold: lifting one leaves the tenant held by the other. The attempts
running count too, as for a tenant (:class:`~fairqueue.usage.quota_watch.QuotaWatch`,
the account's tenants as its members).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from django.db.models import Sum

from fairqueue.conf import get_settings
from fairqueue.conf.usage_settings import NO_QUOTA
from fairqueue.scheduling.hierarchy import ACCOUNT_MARK
from fairqueue.usage.holds import (
    account_hold_key,
    account_tenants,
    now,
)
from fairqueue.usage.ledger import Written
from fairqueue.usage.quota_watch import QuotaWatch, Watched
from fairqueue.usage.quotas import (
    Quota,
    changed_tenants,
    expire,
    hold_over,
    lift_quota,
    period_bounds,
    status_row,
    usage_by_owner,
)

logger = logging.getLogger("fairqueue.quotas")

ACTOR: Final = "fairqueue quotas"
#: The loop process's accounts watched for their tenants' running time.
watch = QuotaWatch()


def after_write(queue: str, written: Written) -> None:
    """The loop's account quota step: end the account holds whose period is over, and
    check the accounts of the tenants whose rows this write changed."""
    expire_accounts()
    tenants = changed_tenants(written)
    if tenants:
        check_accounts(tenants)
    watch.check(_act)


def check_running() -> int:
    """The loop's check between its steps: the watched accounts whose predicted crossing
    has come, against ended plus running time. Returns how many went over."""
    return watch.check(_act, due_only=True)


def _act(key: str, quota: Any, used: int, job_type: str) -> None:
    from fairqueue.models import Account

    account = Account.objects.filter(account_id=key[len(ACCOUNT_MARK) :]).first()
    if account is not None:
        exceed_account(account, quota, used, job_type=job_type)


def expire_accounts() -> int:
    """End the account quota holds and demotions whose period is over. Returns how many."""
    return expire(accounts=True)


def account_quota_of(account: Any) -> Quota | None:
    """The quota of an ``Account`` or ``None``:
    its own worker seconds and period (a day when empty), its tier's action."""
    if not account.quota_worker_seconds:
        return None
    rule = get_settings().quotas.get(account.plan_tier or "", NO_QUOTA)
    return Quota(account.quota_worker_seconds, account.quota_period or "day", rule.action)


def account_used_ms(account_id: str, period: str, at: Any = None) -> int:
    """The worker time of ``account_id``'s tenants (those it owns now) in the period
    ``at`` falls in, over every job type: one query."""
    from fairqueue.models import TenantPlan, TenantUsage

    first, end = period_bounds(at or now(), period)
    tenants = TenantPlan.objects.filter(account__account_id=account_id).values("tenant_id")
    found = TenantUsage.objects.filter(
        tenant_id__in=tenants, day__gte=first, day__lt=end.date()
    ).aggregate(ms=Sum("worker_ms"))
    return int(found["ms"] or 0)


def check_accounts(tenants: Mapping[str, str]) -> int:
    """The quota step for accounts: the accounts with a quota of ``tenants`` (tenant ->
    the job type whose ledger row changed) not over it yet, against their tenants' worker
    time; :func:`exceed_account` for those over. Returns how many went over. Three
    queries and one per account with a quota among them."""
    from fairqueue.models import TenantHold, TenantPlan

    plans = TenantPlan.objects.filter(
        tenant_id__in=list(tenants), account__quota_worker_seconds__isnull=False
    ).select_related("account")
    accounts: dict[str, tuple[Any, str]] = {}
    for plan in plans:
        accounts.setdefault(plan.account.account_id, (plan.account, tenants[plan.tenant_id]))
    if not accounts:
        return 0
    active = set(
        TenantHold.objects.filter(
            tenant_id__in=[account_hold_key(a) for a in accounts],
            reason=TenantHold.QUOTA,
            lifted_at__isnull=True,
        ).values_list("tenant_id", flat=True)
    )
    watch.drop(active)
    over = 0
    for account_id, (account, job_type) in sorted(accounts.items()):
        quota, key = account_quota_of(account), account_hold_key(account_id)
        if quota is None or key in active:
            continue
        used = account_used_ms(account_id, quota.period)
        if used >= quota.worker_seconds * 1000:
            watch.drop([key])
            exceed_account(account, quota, used, job_type=job_type)
            over += 1
            continue
        _, until = period_bounds(now(), quota.period)
        members = tuple(account_tenants([key])[key])
        ms = quota.worker_seconds * 1000
        watch.note(key, Watched(quota, ms, used, until, job_type, members=members))
    return over


def exceed_account(account: Any, quota: Any, used: int, *, job_type: str) -> Any:
    """Apply ``quota``'s action to every tenant of ``account`` (over it), audited on the
    account and each tenant (:func:`~fairqueue.usage.quotas.hold_over`). Returns the
    ``TenantHold``."""
    _, until = period_bounds(now(), quota.period)
    key = account_hold_key(account.account_id)
    tenants = account_tenants([key])[key]
    why = (
        f"account {account.account_id}: its tenants used {used / 1000:.1f} s of "
        f"worker time, quota {quota.worker_seconds} s a {quota.period}; until "
        f"{until:%Y-%m-%d %H:%M} UTC"
    )
    return hold_over(key, tenants, quota, job_type=job_type, why=why, on=[key, *tenants])


def lift_account_quota(account_id: str, *, actor: object = None, source: str = "") -> bool:
    """Lift an account's quota hold or demotion by hand, until it goes over its quota
    again (its usage is not reset). Returns whether one was in force."""
    return lift_quota(account_hold_key(account_id), actor=actor, source=source)


def account_usage(account: Any) -> dict[str, Any]:
    """The account page's usage line: its tenants' worker seconds today and this month
    (UTC), and its quota (``None``: none) with the share used and the hold in force."""
    from fairqueue.models import TenantHold

    found: dict[str, Any] = {
        "day_s": account_used_ms(account.account_id, "day") / 1000,
        "month_s": account_used_ms(account.account_id, "month") / 1000,
        "quota": None,
    }
    quota = account_quota_of(account)
    if quota is None:
        return found
    hold = TenantHold.objects.filter(
        tenant_id=account_hold_key(account.account_id),
        reason=TenantHold.QUOTA,
        lifted_at__isnull=True,
    ).first()
    used_s = found[f"{quota.period}_s"]
    found["quota"] = {
        "quota_s": quota.worker_seconds,
        "period": quota.period,
        "action": quota.action,
        "share_pct": f"{100 * used_s / quota.worker_seconds:.0f}%",
        "state": "over" if hold is not None else "within",
        "until": None if hold is None else f"{hold.until:%Y-%m-%d %H:%M} UTC",
    }
    return found


def account_quota_status(*, limit: int = 50, near: float = 0.8) -> list[dict[str, Any]]:
    """Accounts near (``near`` of their quota or more) or over quota in the current
    period, most used share first, at most ``limit``, as
    :func:`fairqueue.usage.quotas.quota_status` lists tenants (``account_id`` in place of
    ``tenant_id``). Three queries, whatever the number of accounts."""
    from fairqueue.models import Account, TenantHold, TenantPlan, TenantUsage

    at = now()
    month_first, _ = period_bounds(at, "month")
    owners = dict(
        TenantPlan.objects.filter(account__quota_worker_seconds__isnull=False).values_list(
            "tenant_id", "account__account_id"
        )
    )
    rows = TenantUsage.objects.filter(day__gte=month_first, tenant_id__in=list(owners))
    used = usage_by_owner(rows, owners.__getitem__, at)
    holds = {
        hold.tenant_id[len(ACCOUNT_MARK) :]: hold
        for hold in TenantHold.objects.filter(
            tenant_id__startswith=ACCOUNT_MARK, reason=TenantHold.QUOTA, lifted_at__isnull=True
        )
    }
    out = []
    for account in Account.objects.filter(account_id__in=set(used) | set(holds)):
        quota = account_quota_of(account)
        if quota is None:
            continue
        spent = used.get(account.account_id, {}).get(quota.period, 0)
        key, hold = ("account_id", account.account_id), holds.get(account.account_id)
        row = status_row(key, account.plan_tier, quota, spent, hold, near)
        if row is not None:
            out.append(row)
    out.sort(key=lambda row: (-row["share"], row["account_id"]))
    return out[:limit]
