"""How one job runs in a worker process, apart from the loop that takes it: a sync
handler in its thread with Django's connections looked after, a Django task with its
signals and JSON result, and the log lines of a failure (class names only: messages
and tracebacks may quote payload data)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from django.db import close_old_connections

from fairqueue.broker import ActiveJob
from fairqueue.exceptions import TaskFailedError

logger = logging.getLogger("fairqueue.worker")


def call_sync(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a sync handler or task in its worker thread the way Django runs a view: drop
    database connections that are broken or past ``CONN_MAX_AGE`` before and after, so
    a long-lived worker never hands a job a dead connection nor keeps one forever."""
    close_old_connections()
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


async def run_task(
    call_handler: Callable[..., Awaitable[Any]], job_type: str, job: ActiveJob
) -> Any:
    """Run a Django task job; return its JSON result (BullMQ stores it).

    A task that raises (or returns something JSON cannot hold) fails the job with
    :class:`TaskFailedError`, whose message starts with the original exception's
    class path and whose cause is the original, so BullMQ's stored traceback has it.
    """
    from fairqueue.tasks import jobs as task_jobs
    from fairqueue.tasks.backend import FairQueueBackend

    started = time.monotonic()
    try:
        call = task_jobs.parse_task_call(job.data)
        task = task_jobs.resolve_task(call.path)
    except task_jobs.TaskJobError as exc:
        logger.warning("job %s (%s) failed: %s", job.job_id, job_type, type(exc).__name__)
        raise
    args: list[Any] = list(call.args)
    # The TaskResult receivers of Django's task signals get (and a takes_context
    # task sees in its TaskContext), finished in place once the task returns.
    running = task_jobs.running_task_result(
        task,
        call,
        job_id=job.job_id,
        timestamp_ms=job.timestamp_ms,
        processed_on_ms=job.processed_on_ms,
        attempt=job.attempts_made + 1,
    )
    if task.takes_context:
        args.insert(0, task_jobs.framework_of(task).TaskContext(task_result=running))
    await task_jobs.asend_signal("task_started", FairQueueBackend, running)
    logger.debug("job %s (%s) task started", job.job_id, job_type)
    try:
        value = await call_handler(task.func, *args, **call.kwargs)
        value = task_jobs.json_value(value, f"the return value of task {call.path!r}")
    except Exception as exc:
        log_failure(job, job_type, started, exc)
        task_jobs.finish_task_result(running, error=exc)
        await task_jobs.asend_signal("task_finished", FairQueueBackend, running)
        raise TaskFailedError(f"{task_jobs.error_class_path(exc)}: {exc}") from exc
    task_jobs.finish_task_result(running, value=value)
    await task_jobs.asend_signal("task_finished", FairQueueBackend, running)
    logger.info("job %s (%s) done in %d ms", job.job_id, job_type, elapsed_ms(started))
    return value


def is_task_job(data: Any) -> bool:
    # task_jobs.TASK_KEY, spelled out: task_jobs needs django-tasks, this module does not.
    return isinstance(data, dict) and "djangoTask" in data


def log_failure(job: ActiveJob, job_type: str, started: float, exc: Exception) -> None:
    # The class name only: messages and tracebacks may quote payload data.
    logger.warning(
        "job %s (%s) failed after %d ms: %s",
        job.job_id,
        job_type,
        elapsed_ms(started),
        type(exc).__name__,
    )


def elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
