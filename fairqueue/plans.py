"""The plan vocabulary: tiers, their levels, and the code-level subscription
classifier hook.

No Django model here: the models, the admin and the priority resolution all speak this
vocabulary, and none of them has to import another to do so.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, Final

from fairqueue.exceptions import InvalidPlanError
from fairqueue.scheduling.levels import PriorityLevel

SubscriptionClassifier = Callable[[Any], str | None]

_classifier: SubscriptionClassifier | None = None


class PlanTier(StrEnum):
    ENTERPRISE = "enterprise"
    PRO = "pro"
    FREE = "free"


PLAN_PRIORITY: Final = {
    PlanTier.ENTERPRISE: PriorityLevel.CRITICAL,
    PlanTier.PRO: PriorityLevel.NORMAL,
    PlanTier.FREE: PriorityLevel.LOW,
}


def parse_plan(plan: object, *, argument: str = "plan") -> PlanTier:
    """Strictly parse a plan tier (for models, admin actions and classifiers)."""
    if isinstance(plan, str):
        try:
            return PlanTier(plan.strip().lower())
        except ValueError:
            pass
    allowed = ", ".join(repr(tier.value) for tier in PlanTier)
    raise InvalidPlanError(f"{argument}={plan!r} is not allowed: expected one of {allowed}")


def priority_from_plan(plan: str | None) -> PriorityLevel:
    """The plan mapping: enterprise -> critical, pro -> normal, free -> low.

    Unknown or missing plans get normal: a tenant whose billing data is odd must not be
    demoted (nor promoted) by accident.
    """
    try:
        return PLAN_PRIORITY[parse_plan(plan)]
    except InvalidPlanError:
        return PriorityLevel.NORMAL


def set_subscription_to_plan_tier(classifier: SubscriptionClassifier | None) -> None:
    """Install a code-level classifier ``subscription -> plan slug`` (``None`` removes it).

    It takes precedence over the classifier rules kept in the database.
    """
    global _classifier
    _classifier = classifier


def get_subscription_classifier() -> SubscriptionClassifier | None:
    return _classifier
