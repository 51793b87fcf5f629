"""How one job runs in a worker process, apart from the loop that takes it
(:class:`JobRuns`): the job type's handler or Django task, a sync one in the job thread
pool with Django's connections looked after, the payload split and the handler's
:class:`~fairqueue.worker.handlers.JobContext`, the job counted (metrics, recycling), and
the log lines of a failure (class names only: messages and tracebacks may quote payload
data).

Every job of the process goes through :meth:`JobRuns.process`, so it is kept short: one
coroutine from BullMQ's call to the handler's, and what a job needs looked up once per
handler rather than once per job.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from functools import partial
from typing import Any

from asgiref.sync import SyncToAsync, iscoroutinefunction
from django.db import close_old_connections

from fairqueue.broker import ActiveJob
from fairqueue.exceptions import TaskFailedError
from fairqueue.worker.handlers import JobContext, NoHandlerError
from fairqueue.worker.process_metrics import record_job
from fairqueue.worker.queue_plans import QueuePlan, names, split_payload
from fairqueue.worker.recycling import Recycling

logger = logging.getLogger("fairqueue.worker")
_monotonic = time.monotonic
_INFO = logging.INFO


class JobRuns:
    """Run the jobs BullMQ's workers hand this process (:meth:`process`), between
    :meth:`start` and :meth:`shutdown`.

    Args:
        recycling: counts each finished job (done or failed) against the process's
            bounds.
        on_recycle: called once, with the reason, when a bound is reached.
    """

    def __init__(self, recycling: Recycling, on_recycle: Callable[[str], None]) -> None:
        self.recycling = recycling
        self._on_recycle = on_recycle
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        #: Per handler or task function, looked up once: is it ``async def``?
        self._async_funcs: dict[Callable[..., Any], bool] = {}

    def start(self, threads: int) -> None:
        """Bind to the running event loop, with a job thread pool of ``threads``."""
        loop = self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(
            max_workers=threads,
            thread_name_prefix="fairqueue-job",
            initializer=_enter_job_thread,
            initargs=(loop,),
        )

    def shutdown(self) -> None:
        """Wait for the threads of the job thread pool (their jobs are done or given up)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def process(self, plan: QueuePlan, job: ActiveJob) -> Any:
        """Run one job of ``plan``'s queue, then count it (metrics, recycling).

        An exception fails the job (BullMQ applies its attempts and backoff); what it
        returns (a Django task's JSON result) is stored as the job's return value.
        """
        job_type = plan.job_type_of(job.name)
        handler = plan.handlers.get(job_type)  # type: ignore[arg-type]  # None: no handler
        outcome = "failed"
        try:
            # Django tasks' jobs, and jobs without a handler, take the longer way.
            if handler is None or (job_type in plan.task_types and is_task_job(job.data)):
                result = await self._run_other(plan, job, job_type)
            else:
                result = None
                payload, tenant_id, level = split_payload(job.data)
                context = JobContext(
                    job.job_id,
                    job_type,  # type: ignore[arg-type]  # not None: it has a handler
                    tenant_id,
                    level,
                    job.attempts_made,
                    job.timestamp_ms,
                    job.processed_on_ms,
                )
                started = _monotonic()
                # Both lines at once: at -v 0 (the usual production level) a job pays
                # one check.
                verbose = logger.isEnabledFor(_INFO)
                if verbose:
                    logger.debug(
                        "job %s (%s) started, attempt %d",
                        job.job_id,
                        job_type,
                        job.attempts_made + 1,
                    )
                try:
                    if self.is_async(handler):
                        await handler(payload, context)
                    else:
                        await self.in_thread(handler, payload, context)
                except Exception as exc:
                    log_failure(job, job_type or "", started, exc)
                    raise  # BullMQ fails the job and applies its attempts and backoff
                if verbose:
                    logger.info(
                        "job %s (%s) done in %d ms", job.job_id, job_type, elapsed_ms(started)
                    )
            outcome = "done"
            return result
        finally:
            record_job(plan.queue, job_type or "", outcome)
            reason = self.recycling.job_finished()
            if reason is not None:
                self._on_recycle(reason)

    async def _run_other(self, plan: QueuePlan, job: ActiveJob, job_type: str | None) -> Any:
        """A job that is not for a handler: a Django task's, or one this queue cannot run."""
        if job_type is None:
            logger.warning("job %s (queue %s) failed: NoHandlerError", job.job_id, plan.queue)
            raise NoHandlerError(
                f"job {job.job_id} of queue {plan.queue!r} is named {job.name!r}, which is "
                f"not a job type of this queue: {names(plan.job_types)}"
            )
        if is_task_job(job.data) and job_type in plan.task_types:
            return await run_task(self.call, job_type, job)
        logger.warning("job %s (%s) failed: NoHandlerError", job.job_id, job_type)
        raise NoHandlerError(
            f"job {job.job_id} of job type {job_type!r} is not a Django task job and the "
            "job type has no handler"
        )

    def is_async(self, func: Callable[..., Any]) -> bool:
        """Whether ``func`` is ``async def`` (looked up once per function)."""
        try:
            return self._async_funcs[func]
        except KeyError:
            is_async = self._async_funcs[func] = iscoroutinefunction(func)
            return is_async
        except TypeError:  # an unhashable callable
            return iscoroutinefunction(func)

    async def call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Await an async handler or task on this loop; run a sync one in the job
        thread pool (:meth:`in_thread`)."""
        if self.is_async(func):
            return await func(*args, **kwargs)
        if kwargs:
            func = partial(func, **kwargs)
        return await self.in_thread(func, *args)

    def in_thread(self, func: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        """Run a sync handler or task in the job thread pool (:func:`call_sync`), in a
        copy of the caller's context variables, as asgiref's ``sync_to_async`` does: a
        thread handoff and nothing more (its per-call bookkeeping cost the sync no-op job
        a tenth of its time)."""
        if self._loop is None or self._executor is None:
            raise RuntimeError("JobRuns.in_thread called before start()")
        return self._loop.run_in_executor(
            self._executor, copy_context().run, call_sync, func, *args
        )


def _enter_job_thread(loop: asyncio.AbstractEventLoop) -> None:
    """A job thread's start: mark it as asgiref marks the threads of ``sync_to_async``
    (once per thread: the pool serves one loop), so ``async_to_sync`` in a sync handler
    runs its coroutine on the worker's event loop, as it did under ``sync_to_async``."""
    threadlocal = getattr(SyncToAsync, "threadlocal", None)
    if threadlocal is not None:
        threadlocal.main_event_loop = loop
        threadlocal.main_event_loop_pid = os.getpid()


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
