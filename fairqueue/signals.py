"""Keep cached tenant plans honest: any change to a plan or a rule invalidates them."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from .models import (
    ClassifierRule,
    SubscriptionClassifier,
    TenantPlan,
    forget_all_tenant_plans,
    forget_tenant_plan,
)


@receiver([post_save, post_delete], sender=TenantPlan)
def _tenant_plan_changed(sender: type, instance: TenantPlan, **kwargs: Any) -> None:
    forget_tenant_plan(instance.tenant_id)


@receiver([post_save, post_delete], sender=SubscriptionClassifier)
@receiver([post_save, post_delete], sender=ClassifierRule)
def _classifier_changed(sender: type, **kwargs: Any) -> None:
    forget_all_tenant_plans()
