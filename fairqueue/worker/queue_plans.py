"""Which queues a worker serves and what runs their jobs: the plan a worker (or each
process of a supervised worker) starts from, checked once when it starts.

Also the payload split every job goes through (fairqueue's keys out, the tenant and level
into the handler's :class:`~fairqueue.worker.handlers.JobContext`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from fairqueue.conf import get_settings
from fairqueue.exceptions import UnknownJobTypeError
from fairqueue.scheduling.levels import (
    PAYLOAD_LEVEL_KEY,
    PAYLOAD_TENANT_KEY,
    PriorityLevel,
    parse_level,
)
from fairqueue.worker.handlers import Handler, get_handler, registered_job_types

MIN_CONCURRENCY: Final = 1
MAX_CONCURRENCY: Final = 1_000
#: The levels by the names enqueues write into payloads.
_LEVELS: Final[Mapping[str, PriorityLevel]] = {level.value: level for level in PriorityLevel}


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """One BullMQ queue the worker serves, the handlers of its job types and the job
    types whose Django tasks it runs."""

    queue: str
    handlers: Mapping[str, Handler]
    task_types: frozenset[str] = frozenset()
    #: The job types, sorted: worked out once, as :meth:`job_type_of` runs per job.
    _sorted: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _only: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        job_types = tuple(sorted({*self.handlers, *self.task_types}))
        object.__setattr__(self, "_sorted", job_types)
        object.__setattr__(self, "_only", job_types[0] if len(job_types) == 1 else None)

    @property
    def job_types(self) -> list[str]:
        return list(self._sorted)

    def job_type_of(self, job_name: str) -> str | None:
        """The job type a job of this queue belongs to.

        A queue with one job type takes every job as that type, so jobs a producer
        named differently still run; a shared queue goes by the job's name.
        """
        if self._only is not None:
            return self._only
        return job_name if job_name in self._sorted else None


def task_job_types() -> list[str]:
    """Job types that configured Django tasks backends enqueue to; none when neither
    ``django.tasks`` nor ``django-tasks`` is installed."""
    try:
        from fairqueue.tasks.backend import task_job_types as configured
    except ImportError:
        return []
    return configured()


def runnable_job_types() -> list[str]:
    """Job types a worker can run: those with a handler, and the Django tasks'."""
    return sorted({*registered_job_types(), *task_job_types()})


def names(items: Sequence[str]) -> str:
    return ", ".join(repr(item) for item in items) if items else "(none)"


def validate_concurrency(value: object) -> int:
    """``value`` as a concurrency, or ``ValueError`` naming the value and the range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"concurrency={value!r} is not allowed: expected an integer in "
            f"{MIN_CONCURRENCY}..{MAX_CONCURRENCY}"
        )
    if not MIN_CONCURRENCY <= value <= MAX_CONCURRENCY:
        raise ValueError(
            f"concurrency={value!r} is not allowed: expected an integer in "
            f"{MIN_CONCURRENCY}..{MAX_CONCURRENCY}"
        )
    return value


def plan_queues(
    job_types: Sequence[str], task_types: Sequence[str] | None = None
) -> list[QueuePlan]:
    """Group ``job_types`` by their BullMQ queue, with their handlers.

    Checked here, when a worker starts, rather than when handlers register (settings
    must not be read at import time).

    Args:
        task_types: job types that Django tasks are enqueued to (default: those of the
            configured ``FairQueueBackend`` s); they need no handler.

    Raises:
        UnknownJobTypeError: a job type is not in ``FAIRQUEUE['QUEUES']``.
        NoHandlerError: a job type has neither a handler nor Django tasks.
        ValueError: no job types, or a queue shared with job types left out (a worker
            on that queue would take their jobs and have nothing to run them with).
    """
    if not job_types:
        raise ValueError(
            "no job types to run: register handlers with @fairqueue.handler(job_type) "
            "in an installed app's jobs.py"
        )
    queues = get_settings().queues
    tasks = set(task_job_types() if task_types is None else task_types)
    by_queue: dict[str, dict[str, Handler]] = {}
    tasks_by_queue: dict[str, set[str]] = {}
    for job_type in dict.fromkeys(job_types):
        if job_type not in queues:
            raise UnknownJobTypeError(
                f"job type {job_type!r} is not configured: FAIRQUEUE['QUEUES'] has "
                f"{names(sorted(queues))}"
            )
        queue = queues[job_type]
        by_queue.setdefault(queue, {})
        tasks_by_queue.setdefault(queue, set())
        if job_type in tasks:
            tasks_by_queue[queue].add(job_type)
            if job_type in registered_job_types():
                by_queue[queue][job_type] = get_handler(job_type)
        else:
            by_queue[queue][job_type] = get_handler(job_type)
    for queue, handlers in by_queue.items():
        served = {*handlers, *tasks_by_queue[queue]}
        left_out = sorted(t for t, q in queues.items() if q == queue and t not in served)
        if left_out:
            raise ValueError(
                f"queue {queue!r} also holds job types {names(left_out)}: run them in the "
                f"same worker as {names(sorted(served))}, or give them their own queue"
            )
    return [
        QueuePlan(
            queue=queue,
            handlers=MappingProxyType(handlers),
            task_types=frozenset(tasks_by_queue[queue]),
        )
        for queue, handlers in by_queue.items()
    ]


def split_payload(data: Any) -> tuple[Any, str | None, PriorityLevel | None]:
    """The handler's payload (fairqueue's keys removed), the tenant id and the level.

    Jobs from other producers may lack the keys or carry any JSON value: the tenant id
    and level are then ``None`` and a non-dict payload is passed on as it is.
    """
    if not isinstance(data, dict):
        return data, None, None
    payload = dict(data)  # a copy in C, then fairqueue's keys out: every job comes here
    tenant = payload.pop(PAYLOAD_TENANT_KEY, None)
    raw_level = payload.pop(PAYLOAD_LEVEL_KEY, None)
    # The wire names fairqueue writes, looked up; any other value goes through
    # parse_level's rules.
    level = _LEVELS.get(raw_level) if isinstance(raw_level, str) else None
    if level is None and raw_level is not None:
        try:
            level = parse_level(raw_level)
        except ValueError:
            level = None
    return payload, tenant if isinstance(tenant, str) else None, level
