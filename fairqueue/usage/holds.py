"""Holding a tenant's jobs for a quota or an open breaker, with the pause machinery of
:mod:`fairqueue.tenants` (the tenant is paused in a queue's limits in Redis), and every
transition audited (``HoldAudit``: who or what, when, why).

One tenant may be held in a queue for several reasons at once (an operator's pause, a
quota, a breaker of one of the queue's job types): a hold is lifted in Redis only when
no other reason holds the tenant in that queue, so lifting one never turns another off.
An account's quota holds each of its tenants: one ``TenantHold`` keyed by
:func:`account_hold_key`, a reason for each tenant of the account. The reasons live in
the database (``TenantHold``, ``TenantPlan.paused``), and
:func:`fairqueue.tenants.rebuild_tenant_limits` brings them back after Redis lost them.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from typing import Any

from fairqueue.broker import get_sync_broker
from fairqueue.conf import get_settings
from fairqueue.scheduling.hierarchy import ACCOUNT_MARK

logger = logging.getLogger("fairqueue.holds")

#: What "now" is for quotas and the breaker (tests set it: :func:`set_clock`).
_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)  # noqa: E731


def now() -> dt.datetime:
    return _clock()


def set_clock(clock: Callable[[], dt.datetime] | None) -> None:
    """Make quotas and the breaker read ``clock`` for now (``None``: the real clock)."""
    global _clock
    _clock = clock or (lambda: dt.datetime.now(dt.UTC))


def actor_text(actor: object) -> str:
    get_username = getattr(actor, "get_username", None)
    name = get_username() if callable(get_username) else ("" if actor is None else str(actor))
    return name[:200]


def queues_of(job_type: str) -> list[str]:
    """The queues a hold of ``job_type`` applies to (every queue for ``""``)."""
    settings = get_settings()
    if job_type:
        return [settings.queue_for(job_type)]
    return sorted(set(settings.queues.values()))


def account_hold_key(account_id: str) -> str:
    """The ``TenantHold.tenant_id`` of an account's quota hold: ``ACCOUNT_MARK`` and its
    id, which no tenant id is (none holds a line feed)."""
    return ACCOUNT_MARK + account_id


def held_queues(tenant_id: str, *, excluding: int | None = None) -> set[str]:
    """The queues in which a quota or breaker (other than the hold ``excluding``) holds
    ``tenant_id`` now, its account's quota among them."""
    from fairqueue.models import TenantHold, TenantPlan

    keys = [tenant_id]
    account = TenantPlan.objects.filter(tenant_id=tenant_id, account__isnull=False)
    keys += [account_hold_key(a) for a in account.values_list("account__account_id", flat=True)]
    holds = TenantHold.objects.filter(
        tenant_id__in=keys, lifted_at__isnull=True, action=TenantHold.HOLD
    )
    if excluding is not None:
        holds = holds.exclude(pk=excluding)
    queues: set[str] = set()
    for job_type in holds.values_list("job_type", flat=True):
        try:
            queues.update(queues_of(job_type))
        except Exception:  # noqa: S112 - a job type no longer configured holds nothing
            continue
    return queues


def paused_by_operator(tenant_id: str) -> bool:
    """Whether an operator's pause (``pause_tenant``, or ``pause_account`` of its
    account) is in force for ``tenant_id``."""
    from fairqueue.models import TenantPauseAudit, TenantPlan

    plan = TenantPlan.objects.filter(tenant_id=tenant_id).select_related("account").first()
    if plan is not None:
        return plan.paused or plan.account_paused
    last = TenantPauseAudit.objects.filter(tenant_id=tenant_id).order_by("-id").first()
    return last is not None and last.action == TenantPauseAudit.PAUSED


def account_tenants(hold_keys: Iterable[str]) -> dict[str, list[str]]:
    """Each account quota hold key among ``hold_keys`` -> its account's tenants now."""
    from fairqueue.models import TenantPlan

    accounts = [key[len(ACCOUNT_MARK) :] for key in hold_keys if key.startswith(ACCOUNT_MARK)]
    out: dict[str, list[str]] = {account_hold_key(a): [] for a in accounts}
    rows = TenantPlan.objects.filter(account__account_id__in=accounts).order_by("tenant_id")
    for tenant_id, account_id in rows.values_list("tenant_id", "account__account_id"):
        out[account_hold_key(account_id)].append(tenant_id)
    return out


def holds_by_queue() -> dict[str, set[str]]:
    """Queue -> tenants a quota or breaker holds there (for rebuilding Redis's copy), an
    account's quota holding each of its tenants."""
    from fairqueue.models import TenantHold

    out: dict[str, set[str]] = {}
    rows = list(
        TenantHold.objects.filter(lifted_at__isnull=True, action=TenantHold.HOLD).values_list(
            "tenant_id", "job_type"
        )
    )
    members = account_tenants(tenant_id for tenant_id, _ in rows)
    for tenant_id, job_type in rows:
        try:
            queues = queues_of(job_type)
        except Exception:  # noqa: S112 - a job type no longer configured holds nothing
            continue
        for queue in queues:
            out.setdefault(queue, set()).update(members.get(tenant_id, [tenant_id]))
    return out


def pause_in(queues: Iterable[str], tenant_id: str) -> None:
    """Hold ``tenant_id``'s jobs in ``queues`` (pausing twice is harmless)."""
    sync_broker = get_sync_broker()
    for queue in queues:
        sync_broker.run(sync_broker.broker.limits.set_paused, queue, tenant_id, True)


def resume_in(queues: Iterable[str], tenant_id: str, *, excluding: int | None = None) -> list[str]:
    """Lift the hold in those of ``queues`` where nothing else holds ``tenant_id`` (an
    operator's pause, another quota or breaker). Returns the queues resumed."""
    if paused_by_operator(tenant_id):
        return []
    still = held_queues(tenant_id, excluding=excluding)
    resumed = [queue for queue in queues if queue not in still]
    sync_broker = get_sync_broker()
    for queue in resumed:
        sync_broker.run(sync_broker.broker.limits.set_paused, queue, tenant_id, False)
    return resumed


def audit_hold(
    hold: Any,
    *,
    event: str,
    actor: object,
    why: str,
    job_type: str | None = None,
    on: Iterable[str] = (),
) -> None:
    """An audit row of ``hold``'s ``event`` (its reason and action; its job type unless
    ``job_type`` names the one that made it, as a quota's, which holds them all) on its
    tenant, or on each of ``on`` (an account's key and its tenants)."""
    from fairqueue.models import HoldAudit

    at, who = now(), actor_text(actor)
    HoldAudit.objects.bulk_create(
        HoldAudit(
            created_at=at,
            tenant_id=tenant_id,
            job_type=hold.job_type if job_type is None else job_type,
            reason=hold.reason,
            event=event,
            action=hold.action,
            actor=who,
            why=why[:500],
        )
        for tenant_id in (on or [hold.tenant_id])
    )


def end_hold(hold: Any, *, event: str, actor: object, why: str) -> None:
    """Mark a quota's or a breaker's hold lifted and audit it, in one transaction (what
    happens in Redis after the commit is the caller's: a failure there leaves the tenant
    held, never the reverse)."""
    from django.db import transaction

    with transaction.atomic():
        hold.lifted_at = now()
        hold.save(update_fields=["lifted_at"])
        audit_hold(hold, event=event, actor=actor, why=why)
