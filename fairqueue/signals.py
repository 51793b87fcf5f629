"""Keep cached tenant plans and weights honest: any change to a tenant's row or to a rule
invalidates them.

A tenant's plan and weight share one cache entry, so forgetting it on a ``TenantPlan``
save or delete covers both. ``QuerySet.update()`` and ``bulk_create`` send no signals:
call ``forget_tenant_plan`` (or ``forget_all_tenant_plans``) after them.
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from fairqueue.enqueue.lookups import forget_all_tenant_plans, forget_tenant_plan
from fairqueue.models import (
    ClassifierRule,
    SubscriptionClassifier,
    TenantPlan,
)


@receiver([post_save, post_delete], sender=TenantPlan)
def _tenant_plan_changed(sender: type, instance: TenantPlan, **kwargs: Any) -> None:
    forget_tenant_plan(instance.tenant_id)


@receiver([post_save, post_delete], sender=SubscriptionClassifier)
@receiver([post_save, post_delete], sender=ClassifierRule)
def _classifier_changed(sender: type, **kwargs: Any) -> None:
    forget_all_tenant_plans()
