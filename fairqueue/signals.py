"""Keep cached tenant plans and weights honest: any change to a tenant's row, an account
or a rule invalidates them, in this process at once and in every other one within
``fairqueue.enqueue.lookups.VERSION_CHECK_S``.

A tenant's plan and weight share one cache entry, so forgetting it on a ``TenantPlan``
save or delete covers both. Inside a transaction the entries are forgotten again once it
commits: a process that read the row between the save and the commit cached the old
value. ``QuerySet.update()`` and ``bulk_create`` send no signals: call
``forget_tenant_plan`` (or ``forget_all_tenant_plans``) after them.

A save that may change a tenant's limits also brings them to Redis once it commits, so
its held jobs are released under the new limits without waiting for its next enqueue;
one that may change its weight brings the weight to Redis too, where its flows with work
and their levels' totals count it at once, and its waiting jobs are placed again by it.
A tenant joining or leaving an account takes on or sheds the account's pause in Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver

from fairqueue.enqueue.lookups import forget_all_tenant_plans, forget_tenant_plan
from fairqueue.models import (
    Account,
    ClassifierRule,
    SubscriptionClassifier,
    TenantPlan,
)
from fairqueue.scheduling.limits import LIMIT_FIELDS, NO_LIMITS
from fairqueue.tenants import (
    sync_account_limits,
    sync_tenant_limits,
    sync_tenant_pause,
    sync_tenant_weight,
)

#: A save touching these may change a tenant's limits (the tier brings its defaults).
LIMIT_SYNC_FIELDS: Final = frozenset({*LIMIT_FIELDS, "plan_tier", "account"})


def _forget_now_and_on_commit(forget: Callable[[], None], using: str | None) -> None:
    forget()
    if transaction.get_connection(using).in_atomic_block:
        transaction.on_commit(forget, using=using)


@receiver(pre_save, sender=TenantPlan)
def _tenant_plan_saving(
    sender: type, instance: TenantPlan, using: str | None = None, **kwargs: Any
) -> None:
    """Note the account the row had, so its save can tell it joined or left one."""
    update_fields = kwargs.get("update_fields")
    if update_fields is not None and "account" not in update_fields:
        return
    before = None
    if instance.pk is not None:
        rows = TenantPlan.objects.using(using).filter(pk=instance.pk)
        before = rows.values_list("account_id", flat=True).first()
    instance._fq_account_before = before


@receiver([post_save, post_delete], sender=TenantPlan)
def _tenant_plan_changed(
    sender: type, instance: TenantPlan, using: str | None = None, **kwargs: Any
) -> None:
    tenant_id = instance.tenant_id
    _forget_now_and_on_commit(lambda: forget_tenant_plan(tenant_id), using)
    before = getattr(instance, "_fq_account_before", None)
    now = instance.account_id if kwargs.get("signal") is post_save else None
    if before != now:  # joined or left an account: its pause, if any, follows
        transaction.on_commit(lambda: sync_tenant_pause(tenant_id), using=using)
    update_fields = kwargs.get("update_fields")
    if update_fields is None or set(update_fields) & LIMIT_SYNC_FIELDS:
        transaction.on_commit(lambda: sync_tenant_limits(tenant_id), using=using)
    if update_fields is None or "weight" in update_fields:
        transaction.on_commit(lambda: sync_tenant_weight(tenant_id), using=using)


@receiver([post_save, post_delete], sender=Account)
def _account_changed(
    sender: type, instance: Account, using: str | None = None, **kwargs: Any
) -> None:
    """Every cached entry goes (any number of tenants inherit the account's tier, and an
    absent account's entry must not outlive its creation); the tenants that inherit its
    tier get their tier's limits in Redis once it commits."""
    _forget_now_and_on_commit(forget_all_tenant_plans, using)
    if kwargs.get("signal") is post_save and kwargs.get("created"):
        return  # no tenant belongs to it yet
    account_id = instance.account_id
    update_fields = kwargs.get("update_fields")
    if update_fields is None or set(update_fields) & set(LIMIT_FIELDS):
        deleted = kwargs.get("signal") is post_delete
        transaction.on_commit(
            lambda: sync_account_limits(account_id, NO_LIMITS if deleted else None), using=using
        )
    if update_fields is None or "plan_tier" in update_fields:

        def sync() -> None:
            inheriting = TenantPlan.objects.using(using).filter(account_id=account_id, plan_tier="")
            for tenant_id in inheriting.values_list("tenant_id", flat=True).iterator():
                sync_tenant_limits(tenant_id)

        transaction.on_commit(sync, using=using)


@receiver([post_save, post_delete], sender=SubscriptionClassifier)
@receiver([post_save, post_delete], sender=ClassifierRule)
def _classifier_changed(sender: type, using: str | None = None, **kwargs: Any) -> None:
    _forget_now_and_on_commit(forget_all_tenant_plans, using)
