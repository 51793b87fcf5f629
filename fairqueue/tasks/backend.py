"""A Django tasks backend that runs ``@task`` functions through fairqueue's fair BullMQ
queues (``django.tasks`` on Django 6, the ``django-tasks`` package on Django 5.2).

Its settings and how a task maps onto fairqueue (queue name, priority, tenant,
``run_after``) are in docs/tasks.md. ``enqueue``/``aenqueue`` call
:func:`fairqueue.enqueue.api.enqueue_job` / ``aenqueue_job``: the same validation,
audit, metrics and placement; ``get_result`` reads the job back from BullMQ
(:func:`fairqueue.tasks.jobs.task_result_from_job`); ``manage.py fairqueue_worker`` runs
the jobs.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from asgiref.sync import sync_to_async
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from fairqueue import conf
from fairqueue.broker import get_sync_broker
from fairqueue.conf import get_settings
from fairqueue.enqueue.admission import check_admission_options
from fairqueue.enqueue.api import aenqueue_job, enqueue_job
from fairqueue.enqueue.calls import warn_implicit_internal
from fairqueue.enqueue.options import MAX_ATTEMPTS, MAX_DELAY_MS, parse_backoff
from fairqueue.enqueue.priority import ABSENT, Absent
from fairqueue.exceptions import InvalidJobOptionError, InvalidPayloadError, UnknownJobTypeError
from fairqueue.tasks.frameworks import (
    FRAMEWORKS,
    asend_signal,
    framework_of,
    send_signal,
)
from fairqueue.tasks.jobs import (
    TASK_KEY,
    BaseTaskBackend,
    InvalidTaskError,
    Task,
    TaskCall,
    TaskResult,
    TaskResultDoesNotExist,
    outbox_task_job,
    plausible_result_id,
    task_arguments,
    task_backends,
    task_result_from_job,
)
from fairqueue.tasks.task_options import id_kwarg, kwarg_name, level_for_task_priority

__all__ = [
    "DEFAULT_TENANT_KWARG",
    "FairQueueBackend",
    "UnknownTaskQueueError",
    "level_for_task_priority",
    "task_job_types",
]

DEFAULT_TENANT_KWARG: Final = "tenant_id"
OPTION_KEYS: Final = frozenset(
    {"TENANT_KWARG", "ACCOUNT_KWARG", "JOB_TYPES", "ATTEMPTS", "BACKOFF", "DURABLE", "MAX_WAIT_MS"}
)
#: Bytes of randomness in the job ids the backend gives its jobs (32 hex characters, as
#: long as django-tasks' own ids).
RESULT_ID_BYTES: Final = 16


class UnknownTaskQueueError(InvalidTaskError, UnknownJobTypeError):
    """A task's ``queue_name`` maps to no job type of ``FAIRQUEUE['QUEUES']``.

    Django's ``InvalidTask``, the backport's ``InvalidTaskError`` (those installed) and
    fairqueue's ``UnknownJobTypeError``, so any of those ``except`` catches it.
    """


@dataclass(frozen=True, slots=True)
class _Enqueue:
    job_type: str
    payload: dict[str, Any]
    options: dict[str, Any]
    args: list[Any]
    kwargs: dict[str, Any]


class FairQueueBackend(BaseTaskBackend):
    """Runs ``@task`` functions as fair BullMQ jobs (see the module docstring).

    Takes either framework's ``Task`` and builds each result in its task's framework
    (:mod:`fairqueue.tasks.frameworks`). Extra ``@task(...)`` arguments, which Django
    6.1 forwards to the backend's task class, are refused (``TypeError``): a task's
    tenant is a call's keyword argument (``TENANT_KWARG``), not a property of the
    function, and so is a cost (the same function costs more for a bigger input).
    ``OPTIONS`` (``TENANT_KWARG``, ``ACCOUNT_KWARG``, ``JOB_TYPES``, ``ATTEMPTS``,
    ``BACKOFF``, ``DURABLE``, ``MAX_WAIT_MS``): docs/tasks.md."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = self.options if isinstance(self.options, Mapping) else None
        where = f"TASKS[{alias!r}]['OPTIONS']"
        if options is None:
            raise ImproperlyConfigured(f"{where}={self.options!r} is not allowed: expected a dict")
        unknown = sorted(set(options) - OPTION_KEYS)
        if unknown:
            raise ImproperlyConfigured(
                f"{where} has unknown keys {unknown}: allowed keys are {sorted(OPTION_KEYS)}"
            )
        tenant_kwarg = kwarg_name(where, "TENANT_KWARG", options, DEFAULT_TENANT_KWARG)
        job_types = options.get("JOB_TYPES", {})
        if not isinstance(job_types, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in job_types.items()
        ):
            raise ImproperlyConfigured(
                f"{where}['JOB_TYPES']={job_types!r} is not allowed: expected a dict of "
                "task queue name -> FAIRQUEUE['QUEUES'] job type"
            )
        attempts = options.get("ATTEMPTS")
        if attempts is not None and (
            isinstance(attempts, bool)
            or not isinstance(attempts, int)
            or not 1 <= attempts <= MAX_ATTEMPTS
        ):
            raise ImproperlyConfigured(
                f"{where}['ATTEMPTS']={attempts!r} is not allowed: expected None or an "
                f"integer in 1..{MAX_ATTEMPTS}"
            )
        try:
            backoff = parse_backoff(options.get("BACKOFF"), argument=f"{where}['BACKOFF']")
        except InvalidJobOptionError as exc:
            raise ImproperlyConfigured(str(exc)) from None
        durable = options.get("DURABLE", False)
        if not isinstance(durable, bool):
            raise ImproperlyConfigured(
                f"{where}['DURABLE']={durable!r} is not allowed: expected True or False"
            )
        self.tenant_kwarg: str = tenant_kwarg  # type: ignore[assignment]
        self.account_kwarg = kwarg_name(where, "ACCOUNT_KWARG", options, None)
        self.job_types: dict[str, str] = dict(job_types)
        self.attempts: int | None = attempts
        self.backoff: dict[str, Any] | None = backoff
        self.durable: bool = durable
        max_wait_ms = options.get("MAX_WAIT_MS")
        try:
            check_admission_options(False, max_wait_ms)
        except InvalidJobOptionError as exc:
            raise ImproperlyConfigured(f"{where}['MAX_WAIT_MS']: {exc}") from None
        #: Refuse a task expected to start later (``ExpectedWaitTooLongError``).
        self.max_wait_ms: int | None = max_wait_ms

    def __repr__(self) -> str:
        return f"FairQueueBackend(alias={self.alias!r})"

    # -- queues -----------------------------------------------------------------------

    def job_type_for(self, queue_name: str) -> str:
        """The ``FAIRQUEUE['QUEUES']`` job type of a task queue name.

        Raises:
            UnknownTaskQueueError: it maps to no configured job type.
        """
        job_type = self.job_types.get(queue_name, queue_name)
        configured = get_settings().queues
        if job_type not in configured:
            via = (
                f" (through OPTIONS['JOB_TYPES'] to {job_type!r})" if job_type != queue_name else ""
            )
            raise UnknownTaskQueueError(
                f"queue_name={queue_name!r}{via} is not allowed: expected a job type of "
                f"FAIRQUEUE['QUEUES'] ({', '.join(repr(t) for t in sorted(configured))}), "
                f"or a queue name mapped to one in TASKS[{self.alias!r}]['OPTIONS']['JOB_TYPES']"
            )
        return job_type

    def _unlisted_queue(self, queue_name: str) -> str:
        """Why a task's queue name is refused at ``@task`` time, naming the setting."""
        defaults = {framework.default_queue_name for framework in FRAMEWORKS}
        without = " (the queue of a @task without queue_name=)" if queue_name in defaults else ""
        return (
            f"queue_name={queue_name!r}{without} is not allowed: expected one of "
            f"TASKS[{self.alias!r}]['QUEUES'] ({', '.join(repr(q) for q in sorted(self.queues))});"
            f" add it there, or give the task a queue_name= from that list"
        )

    def served_job_types(self) -> list[str]:
        """The job types this backend's queue names map to (those configured), sorted.

        With ``QUEUES`` empty (any queue name allowed): every configured job type.
        """
        configured = get_settings().queues
        if not self.queues:
            return sorted(configured)
        mapped = {self.job_types.get(name, name) for name in self.queues}
        return sorted(job_type for job_type in mapped if job_type in configured)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """fairqueue.E010: a task queue name that maps to no configured job type.

        Silent while fairqueue's settings themselves are wrong: their own checks
        (``fairqueue.E001``...) report that, once, under its own id."""
        messages = list(super().check(**kwargs))
        try:
            if conf.setting_errors():
                return messages
        except Exception:  # fairqueue.E019 reports it; a check never crashes `check`
            return messages
        for name in sorted(self.queues):
            try:
                self.job_type_for(name)
            except (UnknownTaskQueueError, ImproperlyConfigured) as exc:
                messages.append(
                    checks.Error(
                        str(exc),
                        hint="Add the job type to FAIRQUEUE['QUEUES'] or map the queue name.",
                        obj=self,
                        id="fairqueue.E010",
                    )
                )
        messages.extend(self._check_default_queue())
        return messages

    def _check_default_queue(self) -> list[checks.CheckMessage]:
        """fairqueue.W025: a ``@task`` without ``queue_name=`` would fail: at import when
        ``QUEUES`` leaves its queue out, at enqueue when ``QUEUES`` allows any name and
        that queue maps to no job type. (Listed and unmapped is E010's.)"""
        messages: list[checks.CheckMessage] = []
        setting = f"TASKS[{self.alias!r}]['QUEUES']"
        for default in sorted({framework.default_queue_name for framework in FRAMEWORKS}):
            if self.queues and default not in self.queues:
                messages.append(
                    checks.Warning(
                        f"{setting}={sorted(self.queues)!r} leaves out {default!r}, the queue "
                        "of a @task without queue_name=: importing such a task fails",
                        hint=(
                            f"Add {default!r} to {setting} (with a job type for it in "
                            "FAIRQUEUE['QUEUES'] or OPTIONS['JOB_TYPES']), or give every "
                            "@task a queue_name= from that list and silence fairqueue.W025."
                        ),
                        obj=self,
                        id="fairqueue.W025",
                    )
                )
            elif not self.queues:
                try:
                    self.job_type_for(default)
                except UnknownTaskQueueError as exc:
                    messages.append(
                        checks.Warning(
                            f"{setting} allows any queue, but a @task without queue_name= "
                            f"would fail when enqueued: {exc}",
                            hint=(
                                f"Add a {default!r} job type to FAIRQUEUE['QUEUES'] or map "
                                f"{default!r} to one in OPTIONS['JOB_TYPES'], or give every "
                                "@task a queue_name= and silence fairqueue.W025."
                            ),
                            obj=self,
                            id="fairqueue.W025",
                        )
                    )
        return messages

    # -- enqueue ----------------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        """The framework's own checks, for either framework's ``Task``, raising an
        exception both frameworks' ``except`` catch.

        Raises:
            InvalidTaskError: the task is not allowed (the message says why).
        """
        framework_of(task)
        if self.queues and task.queue_name not in self.queues:
            # The frameworks' own message ("Queue 'default' is not valid for backend")
            # names neither the setting nor the way out.
            raise InvalidTaskError(self._unlisted_queue(task.queue_name))
        invalid = tuple(f.invalid_task for f in FRAMEWORKS)
        try:
            super().validate_task(task)
        except InvalidTaskError:
            raise
        except invalid as exc:
            raise InvalidTaskError(str(exc)) from None

    def _prepare(self, task: Task, args: Any, kwargs: Any) -> _Enqueue:
        self.validate_task(task)
        job_type = self.job_type_for(task.queue_name)
        args_json, kwargs_json = task_arguments(args, kwargs, task.module_path)
        options: dict[str, Any] = {
            "job_id": _new_job_id(),
            "source": f"django task {task.module_path}"[:200],
        }
        if self.attempts is not None:
            options["attempts"] = self.attempts
        if self.backoff is not None:
            options["backoff"] = self.backoff
        if self.max_wait_ms is not None:
            options["max_wait_ms"] = self.max_wait_ms
        tenant = self._tenant(kwargs)
        if tenant is None:
            # Warned here, in the caller's stack (aenqueue runs the enqueue in a thread).
            warn_implicit_internal()
            options["internal"] = True
        elif not isinstance(tenant, Absent):
            options["tenant_id"] = tenant
        account = self._account(kwargs)
        if account is not None:
            options["account_id"] = account
        level = level_for_task_priority(task.priority)
        if level is not None:
            options["priority_level"] = level
        if task.run_after is not None:
            options["delay_ms"] = self._delay_ms(task.run_after)
        call = TaskCall(
            path=task.module_path,
            args=args_json,
            kwargs=kwargs_json,
            backend=self.alias,
            queue_name=task.queue_name,
            priority=task.priority,
            run_after=task.run_after.isoformat() if task.run_after is not None else None,
        )
        return _Enqueue(
            job_type=job_type,
            payload={TASK_KEY: call.to_json()},
            options=options,
            args=args_json,
            kwargs=kwargs_json,
        )

    def _tenant(self, kwargs: Mapping[str, Any]) -> str | None | Absent:
        if self.tenant_kwarg not in kwargs:
            return ABSENT
        return id_kwarg(kwargs, self.tenant_kwarg, "tenant", "TENANT_KWARG")

    def _account(self, kwargs: Mapping[str, Any]) -> str | None:
        """The call's explicit account (``ACCOUNT_KWARG``); ``None`` or absent: the
        tenant's own."""
        if self.account_kwarg is None or kwargs.get(self.account_kwarg) is None:
            return None
        return id_kwarg(kwargs, self.account_kwarg, "account", "ACCOUNT_KWARG")

    def _delay_ms(self, run_after: datetime) -> int:
        now = timezone.now() if timezone.is_aware(run_after) else datetime.now()
        delay = math.ceil((run_after - now).total_seconds() * 1000)
        if delay > MAX_DELAY_MS:
            raise InvalidTaskError(
                f"run_after={run_after.isoformat()} is not allowed: it is more than "
                f"{MAX_DELAY_MS // 86_400_000} days ahead"
            )
        return max(0, delay)

    def _result(self, task: Task, job_id: str, prepared: _Enqueue) -> TaskResult:
        kind = framework_of(task)
        return kind.TaskResult(
            task=task,
            id=job_id,
            status=kind.TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=prepared.args,
            kwargs=prepared.kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Enqueue ``task(*args, **kwargs)`` as a fair BullMQ job; its result's id is the
        job id.

        Raises:
            InvalidTaskError (also Django's ``InvalidTask``): the task or its arguments
                are not allowed (``UnknownTaskQueueError`` for a queue name).
            fairqueue's input errors (``InvalidTenantError``, ``PayloadTooLargeError``...)
                as ``enqueue_job`` raises them; ``BrokerUnavailableError``. Nothing was
                written then.
        """
        prepared = self._prepare(task, args, kwargs)
        with _arguments_error(task):
            job = enqueue_job(
                prepared.job_type, prepared.payload, durable=self.durable, **prepared.options
            )
        result = self._result(task, job.job_id, prepared)
        send_signal("task_enqueued", type(self), result)
        return result

    async def aenqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Async :meth:`enqueue`: the Redis call is awaited on the caller's loop."""
        prepared = self._prepare(task, args, kwargs)
        with _arguments_error(task):
            if self.durable:  # the outbox row goes through the ORM, in a thread
                job = await sync_to_async(enqueue_job)(
                    prepared.job_type, prepared.payload, durable=True, **prepared.options
                )
            else:
                job = await aenqueue_job(prepared.job_type, prepared.payload, **prepared.options)
        result = self._result(task, job.job_id, prepared)
        await asend_signal("task_enqueued", type(self), result)
        return result

    # -- results ----------------------------------------------------------------------

    def _queues(self) -> list[str]:
        queues = get_settings().queues
        return [queues[job_type] for job_type in self.served_job_types()]

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as BullMQ has it now (see ``task_result_from_job``).

        Raises:
            TaskResultDoesNotExist: no task job with that id in this backend's queues
                (BullMQ removed it, or it never was).
        """
        if not plausible_result_id(result_id):
            raise TaskResultDoesNotExist(result_id)
        sync = get_sync_broker()
        stored = sync.run(sync.broker.results.find_job, self._queues(), result_id)
        if stored is None and self.durable:
            stored = outbox_task_job(result_id)
        if stored is None:
            raise TaskResultDoesNotExist(result_id)
        return task_result_from_job(stored, self.alias)

    async def aget_result(self, result_id: str) -> TaskResult:
        """Async :meth:`get_result`."""
        from fairqueue.broker import get_broker

        if not plausible_result_id(result_id):
            raise TaskResultDoesNotExist(result_id)
        stored = await get_broker().results.find_job(self._queues(), result_id)
        if stored is None and self.durable:
            stored = await sync_to_async(outbox_task_job)(result_id)
        if stored is None:
            raise TaskResultDoesNotExist(result_id)
        return task_result_from_job(stored, self.alias)


@contextmanager
def _arguments_error(task: Task) -> Iterator[None]:
    """The payload's own errors (its size, above all) as the task framework's: the
    arguments are the only part of a task's payload its caller chose."""
    try:
        yield
    except InvalidPayloadError as exc:
        raise InvalidTaskError(
            f"the arguments of task {task.module_path!r} are not allowed: {exc}"
        ) from None


def _new_job_id() -> str:
    """A random job id (the task result's id). Unique across queues, so ``get_result``
    finds a job by id alone; never all digits (BullMQ keeps those for its own ids)."""
    while True:
        job_id = secrets.token_hex(RESULT_ID_BYTES)
        if not job_id.isdigit():
            return job_id


def task_job_types() -> list[str]:
    """Job types that configured ``FairQueueBackend`` s enqueue to (for the worker)."""
    found: set[str] = set()
    for alias in task_backends.settings:
        backend = task_backends[alias]
        if isinstance(backend, FairQueueBackend):
            found.update(backend.served_job_types())
    return sorted(found)
