"""fairqueue: weighted fair scheduling and plan-based priority for BullMQ queues.

The names below are the public API; import them from here. The subpackages show how it
is built (see ``docs/design.md``): ``scheduling`` (the pure math), ``broker`` (the only
code that knows BullMQ's keys and Lua), ``enqueue`` (the producer side and the outbox),
``rebalance`` (the pass), ``worker``, ``dashboard``, ``tasks`` (Django's task framework)
and ``contrib.celery``.

The Django tasks backend is ``"fairqueue.tasks.backend.FairQueueBackend"`` in
``settings.TASKS`` (not imported here: it needs a task framework installed).
"""

from fairqueue.enqueue.api import (
    EnqueuedJob,
    aenqueue_job,
    enqueue_job,
    enqueue_jobs,
    enqueue_on_commit,
)
from fairqueue.enqueue.priority import wire_tenant_plan_lookup, wire_tenant_weight_lookup
from fairqueue.enqueue.start_estimates import aestimate_start, estimate_start
from fairqueue.enqueue.status import JobStatus, ajob_status, job_status
from fairqueue.exceptions import (
    BrokerError,
    BrokerRejectedError,
    BrokerUnavailableError,
    ConflictingPayloadError,
    ConflictingPriorityError,
    ExpectedWaitTooLongError,
    FairqueueError,
    ImplicitInternalJobWarning,
    InvalidAccountError,
    InvalidJobOptionError,
    InvalidPayloadError,
    InvalidPlanError,
    InvalidPriorityError,
    InvalidPriorityLevelError,
    InvalidTenantError,
    InvalidTenantLimitError,
    InvalidTenantWeightError,
    LockLostError,
    NoHandlerError,
    PartialEnqueueError,
    PayloadTooLargeError,
    ReservedTenantIdError,
    SettingError,
    TaskFailedError,
    TaskJobError,
    TenantBacklogFullError,
    UnknownAccountError,
    UnknownJobTypeError,
    WorkerStoppedError,
)
from fairqueue.plans import set_subscription_to_plan_tier
from fairqueue.scheduling.estimate import StartEstimate
from fairqueue.scheduling.levels import PriorityLevel, normalize_priority
from fairqueue.tenants import (
    pause_account,
    pause_tenant,
    resume_account,
    resume_tenant,
    retry_failed,
    retry_failed_job,
)
from fairqueue.usage.breaker import breaker_status, close_breaker
from fairqueue.worker.handlers import JobContext, handler

__version__ = "0.1.0"

__all__ = [
    "BrokerError",
    "BrokerRejectedError",
    "BrokerUnavailableError",
    "ConflictingPayloadError",
    "ConflictingPriorityError",
    "EnqueuedJob",
    "ExpectedWaitTooLongError",
    "FairqueueError",
    "ImplicitInternalJobWarning",
    "InvalidAccountError",
    "InvalidJobOptionError",
    "InvalidPayloadError",
    "InvalidPlanError",
    "InvalidPriorityError",
    "InvalidPriorityLevelError",
    "InvalidTenantError",
    "ReservedTenantIdError",
    "InvalidTenantLimitError",
    "InvalidTenantWeightError",
    "JobContext",
    "JobStatus",
    "LockLostError",
    "NoHandlerError",
    "PartialEnqueueError",
    "PayloadTooLargeError",
    "PriorityLevel",
    "SettingError",
    "StartEstimate",
    "TaskFailedError",
    "TaskJobError",
    "TenantBacklogFullError",
    "UnknownAccountError",
    "UnknownJobTypeError",
    "WorkerStoppedError",
    "aenqueue_job",
    "aestimate_start",
    "ajob_status",
    "breaker_status",
    "close_breaker",
    "enqueue_job",
    "enqueue_jobs",
    "enqueue_on_commit",
    "estimate_start",
    "handler",
    "job_status",
    "normalize_priority",
    "pause_account",
    "pause_tenant",
    "resume_account",
    "resume_tenant",
    "retry_failed",
    "retry_failed_job",
    "set_subscription_to_plan_tier",
    "wire_tenant_plan_lookup",
    "wire_tenant_weight_lookup",
]
