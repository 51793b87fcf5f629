"""Job handlers: which function runs a job of a given job type.

Apps register handlers in their ``jobs.py`` (found by :func:`autodiscover`, as Celery
finds ``tasks.py``)::

    import fairqueue

    @fairqueue.handler("email")
    def send_email(payload, job):
        ...

A handler takes the payload as enqueued (without ``tenantId`` and ``priorityLevel``)
and a :class:`JobContext`; sync or ``async def``; raising fails the job
(docs/operations.md, "The worker"). Importing this module does no I/O and reads no
settings (a job type's queue is checked when a worker starts), so ``jobs.py`` modules
can be imported before settings are final.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fairqueue.exceptions import NoHandlerError
from fairqueue.scheduling.levels import PriorityLevel

__all__ = [
    "Handler",
    "JobContext",
    "NoHandlerError",
    "autodiscover",
    "get_handler",
    "handler",
    "registered_job_types",
    "unregister",
]


@dataclass(frozen=True, slots=True)
class JobContext:
    """What a handler may want to know about the job beside its payload.

    Attributes:
        job_id: BullMQ's job id (stable across retries: use it for idempotency).
        job_type: the job type the handler was registered for.
        tenant_id: the payload's ``tenantId``; ``None`` for internal jobs and for jobs
            from producers that set none.
        priority_level: the level fairqueue assigned at enqueue; ``None`` when the
            payload carries no valid ``priorityLevel`` (jobs from other producers).
        attempts_made: attempts that already failed (0 on the first run).
        enqueued_ms: when the job was added (ms since the epoch, BullMQ's
            ``timestamp``), so a handler can tell how long it waited; ``None`` if unknown.
        started_ms: when this attempt started (BullMQ's ``processedOn``), or ``None``.
    """

    job_id: str
    job_type: str
    tenant_id: str | None
    priority_level: PriorityLevel | None
    attempts_made: int
    enqueued_ms: int | None = None
    started_ms: int | None = None

    def __repr__(self) -> str:  # tenant ids stay out of logs and tracebacks
        return (
            f"JobContext(job_id={self.job_id!r}, job_type={self.job_type!r}, "
            f"priority_level={self.priority_level!r}, attempts_made={self.attempts_made})"
        )


#: A handler: ``fn(payload, context)``, sync or ``async def``.
Handler = Callable[[Any, JobContext], Any]
H = TypeVar("H", bound=Callable[..., Any])


_registry: dict[str, Handler] = {}
_lock = threading.Lock()


def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    """The same function, or the same module-level definition imported again (a
    reloaded module). Lambdas and nested functions only match themselves: two of them
    can share a qualified name and still be different code."""
    if a is b:
        return True
    module, qualname = getattr(a, "__module__", None), getattr(a, "__qualname__", None)
    if module is None or qualname is None or "<" in qualname:
        return False
    return (module, qualname) == (getattr(b, "__module__", None), getattr(b, "__qualname__", None))


def _describe(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _check_signature(job_type: str, fn: Callable[..., Any]) -> None:
    """Fail at import time, not on the first job, if ``fn`` cannot take two arguments."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and C callables: nothing to check
    try:
        signature.bind(None, None)
    except TypeError:
        raise TypeError(
            f"handler {_describe(fn)} for job type {job_type!r} is not allowed: it must "
            f"accept two positional arguments (payload, context), its signature is "
            f"{signature}"
        ) from None


def handler(job_type: str) -> Callable[[H], H]:
    """Register the decorated function as the handler of ``job_type``.

    Registering the same function again (a module imported twice) is harmless; a
    different function for a job type that already has one raises, because only one of
    them could ever run and which one would depend on import order.

    Args:
        job_type: a job type of ``FAIRQUEUE['QUEUES']`` (checked when a worker starts).

    Raises:
        ValueError: ``job_type`` is not a non-empty string, or already has another
            handler.
        TypeError: the function cannot be called as ``fn(payload, context)``.
    """
    if not isinstance(job_type, str) or not job_type.strip():
        raise ValueError(f"job_type={job_type!r} is not allowed: expected a non-empty string")

    def register(fn: H) -> H:
        if not callable(fn):
            raise TypeError(f"@handler({job_type!r}) is not allowed on {fn!r}: expected a function")
        _check_signature(job_type, fn)
        with _lock:
            existing = _registry.get(job_type)
            if existing is not None and not _same_function(existing, fn):
                raise ValueError(
                    f"job type {job_type!r} already has the handler {_describe(existing)}; "
                    f"cannot register {_describe(fn)} as well (one handler per job type)"
                )
            _registry[job_type] = fn
        return fn

    return register


def get_handler(job_type: str) -> Handler:
    """The handler registered for ``job_type``.

    Raises:
        NoHandlerError: (a ``LookupError``) naming the job type and the registered ones.
    """
    with _lock:
        fn = _registry.get(job_type)
    if fn is None:
        raise NoHandlerError(
            f"job type {job_type!r} has no handler: registered job types are "
            f"{_names(registered_job_types())}"
        )
    return fn


def registered_job_types() -> list[str]:
    """Job types that have a handler, sorted."""
    with _lock:
        return sorted(_registry)


def unregister(job_type: str) -> None:
    """Forget ``job_type``'s handler, if any (tests, and code that swaps handlers)."""
    with _lock:
        _registry.pop(job_type, None)


def autodiscover() -> None:
    """Import the ``jobs`` module of every installed app, registering its handlers.

    Apps without a ``jobs`` module are skipped; an error inside one propagates, so a
    broken ``jobs.py`` stops the worker instead of silently dropping its job types.
    """
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")


def _names(job_types: list[str]) -> str:
    return ", ".join(repr(t) for t in job_types) if job_types else "(none)"
