"""The Django task frameworks fairqueue's backend serves: ``django.tasks`` (Django 6) and
the ``django-tasks`` backport (``django_tasks``), whichever are installed, Django's own
first.

Both have the same API under different names, and a project may have both (a Django 6
project that still lists the backport): a ``@task`` may be either framework's ``Task``,
and code catches either framework's exceptions and connects to either framework's
signals. So the backend takes both frameworks' tasks, builds each result in its task's
own framework, raises exceptions that are both frameworks' classes at once, and sends
both frameworks' signals.

Raises ``ImportError`` on import when neither is installed (``fairqueue.tasks`` itself
imports nothing, so only a project that uses the backend needs one).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any, Final

logger = logging.getLogger("fairqueue.tasks")

__all__ = [
    "FRAMEWORKS",
    "PRIMARY",
    "Framework",
    "InvalidTaskError",
    "TaskResultDoesNotExist",
    "framework_of",
    "is_task",
    "send_signal",
]

#: (module, the name of its invalid-task exception), Django's own first.
_CANDIDATES: Final = (
    ("django.tasks", "InvalidTask"),
    ("django_tasks", "InvalidTaskError"),
)
SIGNALS: Final = ("task_enqueued", "task_started", "task_finished")


@dataclass(frozen=True, slots=True)
class Framework:
    """One installed task framework: the classes and signals the backend uses."""

    name: str
    Task: type
    TaskResult: type
    TaskResultStatus: Any
    TaskError: type
    TaskContext: type
    BaseTaskBackend: type
    task_backends: Any
    invalid_task: type[Exception]
    result_does_not_exist: type[Exception]
    signals: dict[str, Any]
    #: The queue of a ``@task`` without ``queue_name=`` ("default" in both frameworks).
    default_queue_name: str


def _load(module_name: str, invalid_name: str) -> Framework | None:
    try:
        root = importlib.import_module(module_name)
    except ImportError:
        return None
    base = importlib.import_module(f"{module_name}.base")
    backends = importlib.import_module(f"{module_name}.backends.base")
    exceptions = importlib.import_module(f"{module_name}.exceptions")
    signals = importlib.import_module(f"{module_name}.signals")
    return Framework(
        name=module_name,
        Task=base.Task,
        TaskResult=base.TaskResult,
        TaskResultStatus=base.TaskResultStatus,
        TaskError=base.TaskError,
        TaskContext=base.TaskContext,
        BaseTaskBackend=backends.BaseTaskBackend,
        task_backends=root.task_backends,
        invalid_task=getattr(exceptions, invalid_name),
        result_does_not_exist=exceptions.TaskResultDoesNotExist,
        signals={name: getattr(signals, name) for name in SIGNALS},
        default_queue_name=base.DEFAULT_TASK_QUEUE_NAME,
    )


FRAMEWORKS: Final[tuple[Framework, ...]] = tuple(
    found for found in (_load(*candidate) for candidate in _CANDIDATES) if found is not None
)
if not FRAMEWORKS:
    raise ImportError(
        "fairqueue.tasks needs a Django task framework: Django 6's django.tasks, or the "
        "django-tasks package on Django 5.2 (pip install 'django-fairqueue[tasks]')"
    )
#: The framework whose ``BaseTaskBackend`` the backend subclasses and whose classes a
#: result of a task of unknown origin uses: ``django.tasks`` when Django has it.
PRIMARY: Final = FRAMEWORKS[0]


class InvalidTaskError(*(f.invalid_task for f in FRAMEWORKS)):  # type: ignore[misc]
    """A task or its arguments are not allowed: Django's ``InvalidTask`` and the
    backport's ``InvalidTaskError`` at once (those installed), so either ``except``
    catches it."""


class TaskResultDoesNotExist(*(f.result_does_not_exist for f in FRAMEWORKS)):  # type: ignore[misc]
    """No task result with that id: each installed framework's
    ``TaskResultDoesNotExist`` at once."""


def is_task(value: object) -> bool:
    """Whether ``value`` is a ``Task`` of an installed framework."""
    return any(isinstance(value, f.Task) for f in FRAMEWORKS)


def framework_of(task: object) -> Framework:
    """The framework a ``Task`` belongs to (its results are built in it).

    Raises:
        InvalidTaskError: ``task`` is no installed framework's ``Task``.
    """
    for framework in FRAMEWORKS:
        if isinstance(task, framework.Task):
            return framework
    raise InvalidTaskError(
        f"task={type(task).__name__} is not allowed: expected a Task of "
        f"{' or '.join(f.name for f in FRAMEWORKS)} (a function decorated with @task)"
    )


def send_signal(name: str, sender: type, task_result: Any) -> None:
    """Send signal ``name`` (``task_enqueued``, ``task_started``, ``task_finished``) of
    every installed framework, so receivers of either (and Django's own task logging)
    see fairqueue's jobs.

    A receiver that raises is logged by class name and the rest still run: the job is
    enqueued (or has run) whatever a receiver does, so its error must neither make the
    caller believe otherwise nor stop a worker.
    """
    for framework in FRAMEWORKS:
        replies = framework.signals[name].send_robust(sender, task_result=task_result)
        _warn_of_raised(name, task_result, replies)


async def asend_signal(name: str, sender: type, task_result: Any) -> None:
    """:func:`send_signal` from async code (async receivers awaited on this loop)."""
    for framework in FRAMEWORKS:
        replies = await framework.signals[name].asend_robust(sender, task_result=task_result)
        _warn_of_raised(name, task_result, replies)


def _warn_of_raised(name: str, task_result: Any, replies: list[tuple[Any, Any]]) -> None:
    """A warning for each receiver of signal ``name`` that raised: its name and the
    exception's class, never the message (it may carry a payload)."""
    for receiver, outcome in replies:
        if isinstance(outcome, Exception):
            logger.warning(
                "%s receiver %s of task %s raised %s",
                name,
                getattr(receiver, "__qualname__", type(receiver).__name__),
                task_result.id,
                type(outcome).__name__,
            )
