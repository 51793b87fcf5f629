"""Django tasks (``@task``) as BullMQ jobs: the job's payload, finding a task by its path,
and reading a job back as a ``TaskResult``.

Shared by :mod:`fairqueue.tasks.backend` (enqueue, ``get_result``) and
:mod:`fairqueue.worker` (running the jobs). Works with Django 6's ``django.tasks`` and
with the ``django-tasks`` package on Django 5.2 (the same API): whichever is importable,
``django.tasks`` first.

A task job's data is a plain JSON object (:class:`TaskCall` under ``djangoTask``), so
any worker, Python or Node, can read it. Only a function decorated with ``@task`` runs:
the path must name a ``Task`` object in a module that is already imported or belongs to
an installed app, so a job written by anyone with access to Redis cannot make a worker
import an arbitrary module.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from django.apps import apps
from django.conf import settings as django_settings
from django.utils import timezone

from fairqueue.broker import MAX_JOB_ID_LENGTH, RESERVED_JOB_IDS, StoredJob
from fairqueue.conf import get_settings
from fairqueue.exceptions import TaskFailedError, TaskJobError
from fairqueue.tasks.frameworks import (
    PRIMARY,
    InvalidTaskError,
    TaskResultDoesNotExist,
    asend_signal,
    framework_of,
    is_task,
    send_signal,
)

# Django's own classes where Django has them (the backend subclasses this base; results
# of each task are built in its own framework: ``framework_of``).
if TYPE_CHECKING:
    # Which framework's classes these are is known only at run time: Any to a type
    # checker, which sees neither framework's classes as types.
    BaseTaskBackend: TypeAlias = Any
    Task: TypeAlias = Any
    TaskContext: TypeAlias = Any
    TaskError: TypeAlias = Any
    TaskResult: TypeAlias = Any
    TaskResultStatus: TypeAlias = Any
    task_backends: Any
else:
    BaseTaskBackend = PRIMARY.BaseTaskBackend
    Task = PRIMARY.Task
    TaskContext = PRIMARY.TaskContext
    TaskError = PRIMARY.TaskError
    TaskResult = PRIMARY.TaskResult
    TaskResultStatus = PRIMARY.TaskResultStatus
    task_backends = PRIMARY.task_backends

__all__ = [
    "TASK_KEY",
    "BaseTaskBackend",
    "InvalidTaskError",
    "Task",
    "TaskCall",
    "TaskContext",
    "TaskError",
    "TaskJobError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "asend_signal",
    "error_class_path",
    "finish_task_result",
    "framework_of",
    "json_value",
    "parse_task_call",
    "moment_from_ms",
    "resolve_task",
    "running_task_result",
    "task_arguments",
    "send_signal",
    "task_backends",
    "task_result_from_job",
]

#: The payload key of a task job (fairqueue's own ``tenantId``/``priorityLevel`` sit
#: beside it, as in every fairqueue job).
TASK_KEY: Final = "djangoTask"

#: BullMQ state -> the task's status (anything else reads as READY: BullMQ's
#: ``unknown``, and ``outbox`` for a durable job the relay has not added yet).
STATUS_BY_STATE: Final[Mapping[str, str]] = {
    "waiting": "READY",
    "prioritized": "READY",
    "delayed": "READY",
    "waiting-children": "READY",
    "active": "RUNNING",
    "completed": "SUCCESSFUL",
    "failed": "FAILED",
}

#: What ``worker_ids`` holds for an attempt whose worker BullMQ did not name (Python
#: workers never do; Node workers do when given a ``name``).
UNNAMED_WORKER: Final = "bullmq"

_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
_FAILED_PATH: Final = f"{TaskFailedError.__module__}.{TaskFailedError.__qualname__}"
_CLASS_PATH = re.compile(r"([A-Za-z_][\w.]*): ")


@dataclass(frozen=True, slots=True)
class TaskCall:
    """What a task job asks a worker to run (the ``djangoTask`` part of its data)."""

    path: str
    args: list[Any]
    kwargs: dict[str, Any]
    backend: str
    queue_name: str
    priority: int
    run_after: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "args": self.args,
            "kwargs": self.kwargs,
            "backend": self.backend,
            "queueName": self.queue_name,
            "priority": self.priority,
            "runAfter": self.run_after,
        }


def is_task_job(data: Any) -> bool:
    """Whether a job's data is a task job's (the worker runs it as a task)."""
    return isinstance(data, dict) and TASK_KEY in data


def parse_task_call(data: Any) -> TaskCall:
    """The :class:`TaskCall` of a task job's data.

    Raises:
        TaskJobError: the data is not a well-formed task job (the message names the
            field, never its value: arguments are user data).
    """
    raw = data.get(TASK_KEY) if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise TaskJobError(f"job data[{TASK_KEY!r}] is not allowed: expected a JSON object")
    fields = {
        "path": str,
        "args": list,
        "kwargs": dict,
        "backend": str,
        "queueName": str,
        "priority": int,
    }
    for name, kind in fields.items():
        value = raw.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TaskJobError(
                f"job data[{TASK_KEY!r}][{name!r}] is not allowed: expected a "
                f"{kind.__name__}, got {type(value).__name__}"
            )
    run_after = raw.get("runAfter")
    if run_after is not None and not isinstance(run_after, str):
        raise TaskJobError(
            f"job data[{TASK_KEY!r}]['runAfter'] is not allowed: expected an ISO 8601 "
            f"string or null, got {type(run_after).__name__}"
        )
    return TaskCall(
        path=raw["path"],
        args=raw["args"],
        kwargs=raw["kwargs"],
        backend=raw["backend"],
        queue_name=raw["queueName"],
        priority=raw["priority"],
        run_after=run_after,
    )


def resolve_task(path: str) -> Task:
    """The ``@task`` object at ``path`` (``module.function``).

    The module must already be imported or belong to an installed app: a path read from
    Redis never makes a worker import anything else.

    Raises:
        TaskJobError: the path is malformed, its module may not be imported or does not
            import, or the name there is not a ``Task``.
    """
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise TaskJobError(
            f"task path {path!r} is not allowed: expected 'module.function', the dotted "
            "path of a function decorated with @task"
        )
    module_name, _, name = path.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        if apps.get_containing_app_config(module_name) is None:
            raise TaskJobError(
                f"task path {path!r} is not allowed: module {module_name!r} is not imported "
                "and belongs to no installed app"
            )
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise TaskJobError(
                f"task path {path!r} is not allowed: module {module_name!r} does not import "
                f"({type(exc).__name__})"
            ) from exc
    found = getattr(module, name, None)
    if not is_task(found):
        raise TaskJobError(
            f"task path {path!r} is not allowed: {name!r} in {module_name!r} is not a "
            "function decorated with @task"
        )
    return found


def json_value(value: Any, what: str) -> Any:
    """``value`` as JSON gives it back (tuples become lists), or ``TypeError`` naming
    ``what`` (never the value: it is user data)."""
    try:
        return json.loads(json.dumps(value, separators=(",", ":"), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} is not allowed: it must be JSON-serialisable (dicts with string keys, "
            f"lists, strings, finite numbers, booleans, None); {type(exc).__name__}: {exc}"
        ) from None


#: Where a task argument sits in its job's payload (``{"djangoTask": {"args": [here]}}``),
#: for the payload's depth limit.
ARGUMENT_DEPTH: Final = 4


def task_arguments(args: Any, kwargs: Any, path: str) -> tuple[list[Any], dict[str, Any]]:
    """``args`` and ``kwargs`` as their job stores them, with the checks a payload of
    ``enqueue_job`` gets (string keys at any depth, nesting, valid UTF-8), each error
    naming the argument: JSON would turn ``{1: "a", "1": "b"}`` into one ``"1"`` key and
    lose a value without a word.

    Raises:
        InvalidTaskError: an argument that cannot be stored as given.
    """
    from fairqueue.enqueue.options import check_json_tree
    from fairqueue.exceptions import InvalidPayloadError

    named = [(f"args[{index}]", value) for index, value in enumerate(args)]
    named += [(f"kwargs[{name!r}]", value) for name, value in dict(kwargs).items()]
    for name, value in named:
        what = f"{name} of task {path!r}"
        try:
            check_json_tree(value, text=True, what=what, depth=ARGUMENT_DEPTH)
        except InvalidPayloadError as exc:
            raise InvalidTaskError(str(exc)) from None
    try:
        args_json = json_value(list(args), f"args of task {path!r}")
        kwargs_json = json_value(dict(kwargs), f"kwargs of task {path!r}")
    except TypeError as exc:
        raise InvalidTaskError(str(exc)) from None
    if not isinstance(kwargs_json, dict) or set(kwargs_json) != set(kwargs):
        raise InvalidTaskError(
            f"kwargs of task {path!r} are not allowed: every key must be a string"
        )
    return args_json, kwargs_json


def error_class_path(exc: BaseException) -> str:
    """``module.QualifiedName`` of an exception's class (``builtins.ValueError``)."""
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


def _error_path(text: str | None) -> str | None:
    """The class path a failed task's reason or traceback starts with (the worker fails
    task jobs with ``TaskFailedError("module.Class: message")``)."""
    if not text:
        return None
    marker = f"{TaskFailedError.__name__}: "
    tail = text[text.rfind(marker) + len(marker) :] if marker in text else text
    found = _CLASS_PATH.match(tail)
    return found.group(1) if found else None


def moment_from_ms(ms: int | None) -> datetime | None:
    """A BullMQ time (ms since the epoch) as Django's datetimes are (aware under USE_TZ)."""
    if ms is None or ms <= 0:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment if django_settings.USE_TZ else timezone.make_naive(moment)


def _parse_run_after(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def task_result_from_job(stored: StoredJob, backend: str) -> TaskResult:
    """A ``TaskResult`` from a task job as BullMQ stored it.

    Status: waiting, prioritized, delayed → READY; active → RUNNING; completed →
    SUCCESSFUL; failed → FAILED. ``enqueued_at`` is BullMQ's ``timestamp``;
    ``started_at`` and ``last_attempted_at`` its ``processedOn`` (BullMQ keeps the
    latest attempt's start only); ``finished_at`` its ``finishedOn``. ``worker_ids`` has
    one entry per attempt started (BullMQ's ``ats``): the worker's name where BullMQ
    recorded one, else ``"bullmq"``. ``errors`` has one ``TaskError`` per failed
    attempt BullMQ kept a traceback for.

    Raises:
        TaskResultDoesNotExist: the job is not a task job.
        TaskJobError: its task path names no ``@task`` function this process may import.
    """
    if not is_task_job(stored.data):
        raise TaskResultDoesNotExist(stored.job_id)
    call = parse_task_call(stored.data)
    task = resolve_task(call.path).using(
        priority=call.priority,
        queue_name=call.queue_name,
        run_after=_parse_run_after(call.run_after),
    )
    kind = framework_of(task)
    status = kind.TaskResultStatus(STATUS_BY_STATE.get(stored.state, "READY"))
    fallback = (
        _error_path(stored.failed_reason)
        or f"{TaskFailedError.__module__}.{TaskFailedError.__qualname__}"
    )
    errors = [
        kind.TaskError(exception_class_path=_error_path(trace) or fallback, traceback=trace)
        for trace in stored.stacktrace
    ]
    if not errors and stored.failed_reason and status == kind.TaskResultStatus.FAILED:
        errors = [kind.TaskError(exception_class_path=fallback, traceback=stored.failed_reason)]
    finished = status in (kind.TaskResultStatus.SUCCESSFUL, kind.TaskResultStatus.FAILED)
    result = kind.TaskResult(
        task=task,
        id=stored.job_id,
        status=status,
        enqueued_at=moment_from_ms(stored.timestamp_ms),
        started_at=moment_from_ms(stored.processed_on_ms),
        finished_at=moment_from_ms(stored.finished_on_ms) if finished else None,
        last_attempted_at=moment_from_ms(stored.processed_on_ms),
        args=call.args,
        kwargs=call.kwargs,
        backend=backend,
        errors=errors,
        worker_ids=[stored.processed_by or UNNAMED_WORKER] * stored.attempts_started,
    )
    if status == kind.TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", stored.return_value)
    return result


def running_task_result(
    task: Task,
    call: TaskCall,
    *,
    job_id: str,
    timestamp_ms: int | None,
    processed_on_ms: int | None,
    attempt: int,
) -> TaskResult:
    """The ``TaskResult`` a ``takes_context=True`` task sees in its ``TaskContext`` while
    it runs (RUNNING; ``context.attempt`` is this attempt's number, from 1)."""
    kind = framework_of(task)
    return kind.TaskResult(
        task=task,
        id=job_id,
        status=kind.TaskResultStatus.RUNNING,
        enqueued_at=moment_from_ms(timestamp_ms),
        started_at=moment_from_ms(processed_on_ms),
        finished_at=None,
        last_attempted_at=moment_from_ms(processed_on_ms),
        args=call.args,
        kwargs=call.kwargs,
        backend=call.backend,
        errors=[],
        worker_ids=[UNNAMED_WORKER] * attempt,
    )


def finish_task_result(
    result: TaskResult, *, value: Any = None, error: Exception | None = None
) -> None:
    """Mark a running task's ``TaskResult`` finished, in place (the object the worker
    sends with ``task_finished``): SUCCESSFUL with its return value, or FAILED with this
    attempt's error added, as Django's own backends do."""
    kind = framework_of(result.task)
    object.__setattr__(result, "finished_at", timezone.now())
    if error is None:
        object.__setattr__(result, "status", kind.TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", value)
        return
    trace = "".join(traceback.format_exception(error))
    result.errors.append(
        kind.TaskError(exception_class_path=error_class_path(error), traceback=trace)
    )
    object.__setattr__(result, "status", kind.TaskResultStatus.FAILED)


def plausible_result_id(result_id: object) -> bool:
    """Whether ``result_id`` may name one of the backend's jobs. Not a queue's own key
    suffix (``id``, ``events``, ``prioritized``...): ``prefix:queue:<id>`` would read
    BullMQ's counter, stream or set as a job (a WRONGTYPE error, not "no such result")."""
    return (
        isinstance(result_id, str)
        and 0 < len(result_id) <= MAX_JOB_ID_LENGTH
        and ":" not in result_id
        and result_id not in RESERVED_JOB_IDS
    )


def outbox_task_job(job_id: str) -> StoredJob | None:
    """A durable task job the relay has not added to Redis yet, as a job READY to run
    (enqueued when its transaction wrote it)."""
    from fairqueue.models import OutboxJob

    row = OutboxJob.objects.filter(job_id=job_id).first()
    if row is None:
        return None
    try:
        data = json.loads(row.data)
    except ValueError:
        return None
    return StoredJob(
        # Where the relay will add it: its job type's queue now (QUEUES may have moved it).
        queue=get_settings().queues.get(row.job_type, row.queue),
        job_id=job_id,
        name=row.job_type,
        state="outbox",
        data=data,
        timestamp_ms=int(row.created_at.timestamp() * 1000),
        processed_on_ms=None,
        finished_on_ms=None,
        return_value=None,
        failed_reason=None,
        stacktrace=(),
        attempts_made=0,
        attempts_started=0,
        processed_by=None,
    )
