"""Exceptions users of fairqueue catch.

Every input error is also a ``ValueError`` (or ``LookupError``) so code that already
handles those keeps working; every message names the argument, the value given and what
is allowed.

The task backend's errors (``InvalidTaskError`` and ``TaskResultDoesNotExist`` in
``fairqueue.tasks.frameworks``, ``UnknownTaskQueueError`` in ``fairqueue.tasks.backend``)
live beside it: their base classes are the installed task framework's own, so they exist
only where one is installed.
"""

from __future__ import annotations

from enum import StrEnum

from django.core.exceptions import ImproperlyConfigured


class FairqueueError(Exception):
    """Base class of every error fairqueue raises on purpose."""


class InvalidPriorityError(FairqueueError, ValueError):
    """A numeric ``priority`` that is not a non-negative integer."""


class InvalidPriorityLevelError(FairqueueError, ValueError):
    """A ``priority_level`` or ``priority_override`` that names no level."""


class ConflictingPriorityError(FairqueueError, ValueError):
    """Both ``priority`` and ``priority_level`` were given."""


class InvalidPlanError(FairqueueError, ValueError):
    """A plan tier that is not ``enterprise``, ``pro`` or ``free``."""


class InvalidTenantError(FairqueueError, ValueError):
    """A ``tenant_id`` that is not a non-empty string of at most 255 characters."""


class ReservedTenantIdError(InvalidTenantError):
    """A ``tenant_id`` equal to the reserved key internal jobs are counted under
    (``fairqueue.scheduling.levels.INTERNAL_TENANT``): no tenant may take it, so no tenant
    shares the internal jobs' ledger rows, flows or holds (docs/usage.md)."""


class InvalidAccountError(FairqueueError, ValueError):
    """An ``account_id`` that is not a non-empty string of at most 255 characters, or
    one given where a job can have no account (an internal job, no tenant), or one that
    differs from the account the tenant belongs to."""


class UnknownAccountError(InvalidAccountError, LookupError):
    """An ``account_id`` with no ``Account`` row: a typo must not make a new customer
    that shares nothing with the real one."""


class InvalidTenantWeightError(FairqueueError, ValueError):
    """A ``tenant_weight`` that is not an integer in ``MIN_TENANT_WEIGHT..MAX_TENANT_WEIGHT``."""


class InvalidPayloadError(FairqueueError, ValueError):
    """A payload that is not a JSON object, or cannot be serialised as JSON."""


class PayloadTooLargeError(InvalidPayloadError):
    """A payload whose serialised JSON is larger than ``FAIRQUEUE['MAX_PAYLOAD_BYTES']``."""


class ConflictingPayloadError(InvalidPayloadError):
    """The payload already carries a different ``tenantId`` or ``priorityLevel``."""


class InvalidJobOptionError(FairqueueError, ValueError):
    """A job option (``job_id``, ``delay_ms``, ``attempts``) out of its allowed range."""


class UnknownJobTypeError(FairqueueError, LookupError):
    """A ``job_type`` that is not registered in ``FAIRQUEUE['QUEUES']``."""


class BrokerError(FairqueueError):
    """Talking to Redis/BullMQ failed. Messages name the Redis error class, never the
    Redis URL, a password or job data; the original error is ``__cause__``."""


class BrokerUnavailableError(BrokerError, ConnectionError):
    """Redis could not be reached or did not answer in time."""


class BrokerRejectedError(BrokerError):
    """Redis answered a command with an error reply (``OutOfMemoryError`` under
    ``maxmemory``, ``ReadOnlyError`` on a replica, a script error, ``WRONGTYPE``...).

    ``redis_error`` is the Redis error class name (e.g. ``"OutOfMemoryError"``).
    """

    def __init__(self, message: str, *, redis_error: str = "ResponseError") -> None:
        super().__init__(message)
        self.redis_error = redis_error


class PartialEnqueueError(BrokerError):
    """A batch failed part-way: some chunks were added (and audited), the rest were not.

    ``enqueue_jobs`` adds a batch in chunks (one atomic Redis script call each), so a
    failure after the first chunk leaves the earlier chunks in Redis. ``added`` holds the
    ``EnqueuedJob`` results of the chunks added for certain, ``job_ids`` their ids; the
    next ``uncertain`` jobs (the chunk that failed) may or may not have been added when
    the failure was a timeout; the remaining ones were not sent. The original error is
    ``__cause__``. Retry ``payloads[len(added):]`` (give them ``job_id``s to make the
    retry exact).
    """

    def __init__(self, message: str, *, added: list, uncertain: int, not_sent: int) -> None:
        super().__init__(message)
        self.added = added
        self.job_ids = [job.job_id for job in added]
        self.uncertain = uncertain
        self.not_sent = not_sent

    @property
    def added_count(self) -> int:
        return len(self.added)


class TaskFailedError(FairqueueError, RuntimeError):
    """A Django task (``@task``) run by ``fairqueue_worker`` raised.

    The worker fails the BullMQ job with this error, its message starting with the
    original exception's class path (``myapp.errors.Boom: message``) and the original
    chained as its cause, so BullMQ's ``failedReason`` and stored traceback tell a
    ``TaskResult`` which exception it was.
    """


class InvalidTenantLimitError(FairqueueError, ValueError):
    """A tenant limit (a field of ``scheduling.limits.LIMIT_RANGES``) that is not a
    whole number in its allowed range, or a rate limit with only one of its two halves."""


class TenantBacklogFullError(FairqueueError):
    """An enqueue would put more than ``max_waiting`` of the tenant's jobs waiting in the
    queue. Nothing of the call was written: no job, no audit row, no outbox row, no
    enqueue metric. The tenant's own flood is refused at the door instead of growing a
    backlog its limits would take hours to drain."""

    def __init__(self, *, tenant_id: str, queue: str, limit: int, waiting: int) -> None:
        super().__init__(
            f"tenant {tenant_id!r} already has {waiting} jobs waiting in queue {queue!r}: "
            f"its max_waiting is {limit}, so the enqueue was refused and nothing was added"
        )
        self.tenant_id = tenant_id
        self.queue = queue
        self.limit = limit
        self.waiting = waiting


class AccountBacklogFullError(TenantBacklogFullError):
    """An enqueue would put more than its account's ``max_waiting`` jobs waiting in the
    queue, counted over all the account's tenants. Nothing of the call was written. A
    :class:`TenantBacklogFullError` too (``tenant_id`` is empty), so handlers of a
    tenant's refusal handle an account's."""

    def __init__(self, *, account_id: str, queue: str, limit: int, waiting: int) -> None:
        FairqueueError.__init__(
            self,
            f"account {account_id!r} already has {waiting} jobs of its tenants waiting in "
            f"queue {queue!r}: its max_waiting is {limit}, so the enqueue was refused and "
            "nothing was added",
        )
        self.tenant_id = ""  # no one tenant's
        self.account_id = account_id
        self.queue = queue
        self.limit = limit
        self.waiting = waiting


class ExpectedWaitTooLongError(FairqueueError):
    """An enqueue with ``max_wait_ms`` whose job is expected to start later than that.
    Nothing was written. The estimate follows the fair shares, so it is the flows over
    their share that are refused: ``share`` is the fraction of the workers the flow gets
    while it has a backlog (``None``: not measured), ``expected_wait_ms`` the wait it
    would have had, ``admission_wait_ms`` the wait held to the bound (the expected one
    stretched to how late recent estimates came out: docs/design.md, "When a job will
    start"), ``retry_after_s`` when its backlog will have drained enough (whole seconds,
    at least 1: an HTTP ``Retry-After``)."""

    def __init__(
        self,
        *,
        job_type: str,
        level: str,
        expected_wait_ms: int,
        max_wait_ms: int,
        retry_after_s: int,
        share: float | None,
        admission_wait_ms: int | None = None,
    ) -> None:
        shown = "not measured" if share is None else f"{share:.0%} of the workers"
        held = expected_wait_ms if admission_wait_ms is None else admission_wait_ms
        late = "" if held == expected_wait_ms else f" ({held} ms as late as recent estimates ran)"
        super().__init__(
            f"a {level} job of type {job_type!r} is expected to start in {expected_wait_ms} ms"
            f"{late}, past max_wait_ms={max_wait_ms}: its flow's share is {shown}, so the "
            f"enqueue was refused and nothing was added; retry after {retry_after_s} s"
        )
        self.admission_wait_ms = held
        self.job_type = job_type
        self.level = level
        self.expected_wait_ms = expected_wait_ms
        self.max_wait_ms = max_wait_ms
        self.retry_after_s = retry_after_s
        self.share = share


class Problem(StrEnum):
    """What a :class:`SettingError` is about: one setting (a ``FAIRQUEUE`` key and the
    environment variable that overrides it) or a problem no single key owns. The system
    check gives each its own id, so these names only grow."""

    MAX_WAIT_MS = "MAX_WAIT_MS"
    REBALANCE_INTERVAL_MS = "REBALANCE_INTERVAL_MS"
    PRIORITY_ENABLED = "PRIORITY_ENABLED"
    #: FAIRQUEUE_REDIS_URL, FAIRQUEUE['REDIS'] or FAIRQUEUE['REDIS_URL']: one location.
    REDIS = "REDIS"
    PREFIX = "PREFIX"
    QUEUES = "QUEUES"
    REBALANCE_WINDOW = "REBALANCE_WINDOW"
    CACHE_ALIAS = "CACHE_ALIAS"
    PLAN_CACHE_TIMEOUT = "PLAN_CACHE_TIMEOUT"
    MAX_PAYLOAD_BYTES = "MAX_PAYLOAD_BYTES"
    KEEP_COMPLETED = "KEEP_COMPLETED"
    KEEP_FAILED = "KEEP_FAILED"
    REDIS_AND_REDIS_URL = "REDIS_AND_REDIS_URL"
    CLUSTER_QUEUE_WITHOUT_HASH_TAG = "CLUSTER_QUEUE_WITHOUT_HASH_TAG"
    FAIRQUEUE_NOT_A_DICT = "FAIRQUEUE_NOT_A_DICT"
    UNKNOWN_KEYS = "UNKNOWN_KEYS"
    FAIRNESS_BY = "FAIRNESS_BY"
    AUDIT_EXPLICIT_PRIORITY = "AUDIT_EXPLICIT_PRIORITY"
    PLAN_LOCAL_CACHE_TIMEOUT = "PLAN_LOCAL_CACHE_TIMEOUT"
    TENANT_LIMITS = "TENANT_LIMITS"
    USAGE_LEDGER = "USAGE_LEDGER"
    QUOTAS = "QUOTAS"
    BREAKER = "BREAKER"


class SettingError(FairqueueError, ImproperlyConfigured):
    """A bad setting or environment variable, tagged with its :class:`Problem`
    so the system check can report each problem under its own id with the very message
    that first use raises."""

    def __init__(self, problem: Problem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


class LockLostError(FairqueueError):
    """Another rebalancer holds the queue's leader lock: this pass must stop writing."""


class NoHandlerError(FairqueueError, LookupError):
    """No handler is registered for a job type."""


class WorkerStoppedError(FairqueueError, RuntimeError):
    """A BullMQ worker loop ended on its own, so its queue was no longer served."""


class TaskJobError(FairqueueError, ValueError):
    """A task job that cannot run: a malformed payload, or a path that names no
    ``@task`` function a worker may import."""


class ImplicitInternalJobWarning(UserWarning):
    """A job was enqueued with ``tenant_id=None`` and without ``internal=True``.

    ``tenant_id=None`` makes an internal job (critical, no tenant), which is right for
    system work and wrong for a tenant's job whose id happened to be missing
    (``getattr(request.tenant, "id", None)``). The warning points at the call; run the
    tests with ``-W error::fairqueue.ImplicitInternalJobWarning`` to find every such call,
    and pass ``internal=True`` where internal work is meant."""
