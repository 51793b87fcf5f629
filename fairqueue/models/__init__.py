"""fairqueue's models, the one module Django imports for the app (label ``fairqueue``):
the accounts and plans, their audit and the console's permission holder
(``core_models``), the outbox (``outbox_models``), and the usage ledger's rows and holds
(``usage_models``, docs/usage.md). Import them from here; the parts are separate so that
the usage stack can import the plans without a circle."""

from fairqueue.models.core_models import (
    LEVEL_CHOICES,
    PLAN_CHOICES,
    Account,
    ClassifierRule,
    Dashboard,
    PriorityOverrideAudit,
    SubscriptionClassifier,
    TenantPauseAudit,
    TenantPlan,
)
from fairqueue.models.outbox_models import OUTBOX_JOB_ID_PREFIX, OutboxJob, new_outbox_job_id
from fairqueue.models.usage_models import HoldAudit, TenantHold, TenantUsage

__all__ = [
    "LEVEL_CHOICES",
    "OUTBOX_JOB_ID_PREFIX",
    "PLAN_CHOICES",
    "Account",
    "ClassifierRule",
    "Dashboard",
    "HoldAudit",
    "OutboxJob",
    "PriorityOverrideAudit",
    "SubscriptionClassifier",
    "TenantHold",
    "TenantPauseAudit",
    "TenantPlan",
    "TenantUsage",
    "new_outbox_job_id",
]
