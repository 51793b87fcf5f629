"""``@task`` functions of Django's task framework for the tasks backend's tests (their
paths, ``tests.helpers.tasks.<name>``, are what the jobs carry), and fairqueue's worker
run in burst mode over them."""

from __future__ import annotations

import asyncio
import threading
import warnings

try:  # Django 6: its own django.tasks (`make test-django6` has no backport)
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

from fairqueue.broker import Broker
from fairqueue.worker.runner import Worker

#: What the tasks below ran, in the order they ran (the worker runs in this process).
RAN: list[str] = []
_ran_lock = threading.Lock()


RAN: list[str] = []


_ran_lock = threading.Lock()


class BoomError(Exception):
    """What ``explode`` raises."""


@task()
def record(label: str, tenant_id: str | None = None) -> str:
    with _ran_lock:
        RAN.append(label)
    return label


@task(priority=75)
def record_critical(label: str, tenant_id: str | None = None) -> str:
    with _ran_lock:
        RAN.append(label)
    return label


@task(priority=-75)
def record_low(label: str, tenant_id: str | None = None) -> str:
    with _ran_lock:
        RAN.append(label)
    return label


@task()
def add(a: int, b: int) -> dict:
    return {"sum": a + b, "parts": (a, b)}


@task()
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task()
def explode(message: str) -> None:
    raise BoomError(message)


FLAKY_CALLS: list[int] = []


@task()
def flaky() -> str:
    FLAKY_CALLS.append(1)
    if len(FLAKY_CALLS) == 1:
        raise BoomError("first attempt")
    return "second attempt"


@task()
def unserialisable() -> object:
    return object()


@task(takes_context=True)
def with_context(context, x: int) -> dict:
    return {"attempt": context.attempt, "id": context.task_result.id, "x": x}


@task()
def for_org(label: str, org: str) -> str:
    return f"{label}@{org}"


def plain_function() -> str:
    return "not a task"


def run_worker(broker: Broker, *job_types: str, timeout_s: float = 60.0) -> None:
    """fairqueue_worker's Worker in burst mode: runs until every queue is empty.

    In a thread, joined with a timeout: on a loaded machine BullMQ's ``Worker.close()``
    now and then never returns (the cancelled BZPOPMIN of its blocking connection stays
    "cancelling"; seen in tests/redis/test_worker.py too). The jobs are done by then, and the
    assertions after this call check them; the stuck thread (a daemon) is left behind
    with a warning instead of hanging the suite until pytest-timeout, whose interrupt
    turns BullMQ's close loop into a busy loop.
    """
    worker = Worker(
        list(job_types) or None, burst=True, broker=broker, install_signal_handlers=False
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="burst-worker", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if errors:
        raise errors[0]
    if thread.is_alive():
        warnings.warn(
            f"the burst worker did not stop within {timeout_s:.0f} s (BullMQ's close hang); "
            "left behind",
            stacklevel=2,
        )
