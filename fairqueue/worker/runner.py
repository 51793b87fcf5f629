"""Run registered job handlers with stock BullMQ workers.

One ``bullmq.Worker`` per BullMQ queue (built by :meth:`WorkerSupport.make_worker`, so BullMQ's
own locking, stalled-job recovery, attempts and backoff apply unchanged, and Python and
Node workers can share a queue). This module adds what BullMQ does not know about:

* which handler runs a job (the job type's registered handler; a queue shared by
  several job types dispatches on the job's name, which fairqueue sets to the job type);
* Django tasks (``@task`` functions enqueued through
  :class:`fairqueue.tasks.backend.FairQueueBackend`): a job whose data carries
  ``djangoTask`` runs the ``@task`` function its path names (only such functions, see
  :mod:`fairqueue.tasks.jobs`), and its JSON return value becomes the job's return
  value; a task that raises fails the job with :class:`TaskFailedError`; each run sends
  the task frameworks' ``task_started`` and ``task_finished`` signals;
* the payload the handler sees (fairqueue's ``tenantId`` and ``priorityLevel`` removed)
  and a :class:`~fairqueue.worker.handlers.JobContext`;
* sync handlers in a thread pool with Django's database connections checked before and
  after each job in that thread, as Django does around a request;
* logs that name job ids, job types and exception classes only: payloads and tenant
  ids never reach them;
* a graceful stop on SIGTERM/SIGINT, a forced one on the second signal, and a burst
  mode that stops once every queue is empty.

The ``fairqueue_worker`` management command parses arguments; this class runs the loop
(django-tasks' ``db_worker`` split).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any, Final

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.db import close_old_connections

from fairqueue.broker import ActiveJob, Broker, get_broker, permission_error
from fairqueue.conf import get_settings
from fairqueue.exceptions import (
    BrokerRejectedError,
    BrokerUnavailableError,
    TaskFailedError,
    UnknownJobTypeError,
    WorkerStoppedError,
)
from fairqueue.loop import Backoff, GracefulStop
from fairqueue.scheduling.levels import (
    FAIRQUEUE_PAYLOAD_KEYS,
    PAYLOAD_LEVEL_KEY,
    PAYLOAD_TENANT_KEY,
    PriorityLevel,
    parse_level,
)
from fairqueue.worker.handlers import (
    Handler,
    JobContext,
    NoHandlerError,
    get_handler,
    registered_job_types,
)

logger = logging.getLogger("fairqueue.worker")

MIN_CONCURRENCY: Final = 1
MAX_CONCURRENCY: Final = 1_000
#: How often burst mode checks whether every queue is empty.
BURST_POLL_INTERVAL_S: Final = 0.05
#: Redis unreachable at start: the base interval of :func:`fairqueue.loop.backoff_ms`
#: (tries 1 s, 2 s, 4 s... apart, up to its cap).
REDIS_RETRY_MS: Final = 500


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """One BullMQ queue the worker serves, the handlers of its job types and the job
    types whose Django tasks it runs."""

    queue: str
    handlers: Mapping[str, Handler]
    task_types: frozenset[str] = frozenset()

    @property
    def job_types(self) -> list[str]:
        return sorted({*self.handlers, *self.task_types})

    def job_type_of(self, job_name: str) -> str | None:
        """The job type a job of this queue belongs to.

        A queue with one job type takes every job as that type, so jobs a producer
        named differently still run; a shared queue goes by the job's name.
        """
        job_types = self.job_types
        if len(job_types) == 1:
            return job_types[0]
        return job_name if job_name in job_types else None


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


def _names(items: Sequence[str]) -> str:
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
                f"{_names(sorted(queues))}"
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
                f"queue {queue!r} also holds job types {_names(left_out)}: run them in the "
                f"same worker as {_names(sorted(served))}, or give them their own queue"
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
    tenant = data.get(PAYLOAD_TENANT_KEY)
    try:
        level: PriorityLevel | None = parse_level(data.get(PAYLOAD_LEVEL_KEY))
    except ValueError:
        level = None
    payload = {key: value for key, value in data.items() if key not in FAIRQUEUE_PAYLOAD_KEYS}
    return payload, tenant if isinstance(tenant, str) else None, level


def _call_sync(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a sync handler or task in its worker thread the way Django runs a view: drop
    database connections that are broken or past ``CONN_MAX_AGE`` before and after, so
    a long-lived worker never hands a job a dead connection nor keeps one forever."""
    close_old_connections()
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


class Worker:
    """Serve the queues of ``job_types`` until stopped.

    Args:
        job_types: job types to run; each needs a queue in ``FAIRQUEUE['QUEUES']`` and a
            handler, unless a ``FairQueueBackend`` enqueues Django tasks to it. Default:
            every job type that has a handler or Django tasks.
        concurrency: jobs run at once per queue (1..1000); sync handlers get a thread
            pool of ``concurrency`` threads per queue.
        burst: stop once every queue has nothing waiting, delayed (retries serving
            their backoff included) or active, instead of waiting for new jobs.
        broker: the broker to use (default: the configured one).
        install_signal_handlers: take over SIGTERM/SIGINT while running (main thread
            only): the first stops gracefully, the second exits at once.

    Raises:
        ValueError, UnknownJobTypeError, NoHandlerError: see :func:`plan_queues` and
            :func:`validate_concurrency`.
    """

    def __init__(
        self,
        job_types: Sequence[str] | None = None,
        *,
        concurrency: int = 1,
        burst: bool = False,
        broker: Broker | None = None,
        install_signal_handlers: bool = True,
    ) -> None:
        self.concurrency = validate_concurrency(concurrency)
        self.plans = plan_queues(list(job_types) if job_types else runnable_job_types())
        self.burst = burst
        self._broker = broker or get_broker()
        self._install_signals = install_signal_handlers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._graceful = self._graceful_stop()
        self._executor: ThreadPoolExecutor | None = None
        #: A burst worker's reason to stop with an error (an ACL refusal: no retry helps).
        self._fatal: BrokerRejectedError | None = None
        #: Releases in flight (kept so the event loop does not drop them half-way).
        self._releases: set[asyncio.Future[None]] = set()

    def __repr__(self) -> str:
        return f"Worker(queues={self.queues!r}, concurrency={self.concurrency})"

    @property
    def queues(self) -> list[str]:
        return [plan.queue for plan in self.plans]

    @property
    def job_types(self) -> list[str]:
        return [job_type for plan in self.plans for job_type in plan.job_types]

    # -- running ----------------------------------------------------------------------

    def run(self) -> None:
        """Run on a new event loop until stopped (blocking); then close connections.

        Raises:
            BrokerUnavailableError: Redis did not answer at start in burst mode (else
                the worker waits for it, retrying with backoff).
            WorkerStoppedError: a BullMQ worker loop ended on its own.
        """
        asyncio.run(self._run_and_disconnect())

    async def _run_and_disconnect(self) -> None:
        try:
            await self.arun()
        finally:
            await self._broker.close()  # this loop's client; the loop ends with us

    async def arun(self) -> None:
        """Run on the current event loop until stopped (see :meth:`run`)."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._graceful = self._graceful_stop()
        restore_signals = self._take_signals()
        try:
            reached = await self._reach_redis()
        except BaseException:
            restore_signals()
            raise
        if not reached:  # stopped while waiting for Redis
            restore_signals()
            logger.info("worker stopped")
            return
        self._executor = ThreadPoolExecutor(
            max_workers=self.concurrency * len(self.plans), thread_name_prefix="fairqueue-job"
        )
        bull_workers = [
            self._broker.workers.make_worker(
                plan.queue,
                partial(self._process, plan),
                concurrency=self.concurrency,
                on_error=partial(self._on_bullmq_error, plan.queue),
                on_finished=partial(self._release_next, plan.queue),
            )
            for plan in self.plans
        ]
        runs = {
            asyncio.ensure_future(bull_worker.run()): plan.queue
            for bull_worker, plan in zip(bull_workers, self.plans, strict=True)
        }
        logger.info(
            "worker started: job types %s on queues %s, concurrency %d%s",
            _names(self.job_types),
            _names(self.queues),
            self.concurrency,
            ", burst" if self.burst else "",
        )
        stopped_queue: str | None = None
        try:
            stopped_queue = await self._wait_for_stop(runs)
        finally:
            # close() stops taking jobs and waits for the active ones to finish.
            await asyncio.gather(*(w.close() for w in bull_workers), return_exceptions=True)
            await asyncio.gather(*runs, return_exceptions=True)
            self._executor.shutdown(wait=True)
            restore_signals()
        if self._fatal is not None:
            raise self._fatal
        if stopped_queue is not None:
            raise WorkerStoppedError(
                f"the BullMQ worker of queue {stopped_queue!r} stopped unexpectedly"
            )
        logger.info("worker stopped")

    async def _wait_for_stop(self, runs: Mapping[asyncio.Future[Any], str]) -> str | None:
        """Wait for a stop request or, in burst mode, for every queue to be empty.

        Returns the queue whose BullMQ loop ended on its own, if one did.
        """
        if self._stop is None:
            raise RuntimeError("Worker._wait_for_stop called outside arun()")
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            while True:
                done, _ = await asyncio.wait(
                    {stop, *runs},
                    timeout=BURST_POLL_INTERVAL_S if self.burst else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if stop in done:
                    return None
                if done:
                    return runs[next(iter(done))]
                if self.burst and await self._all_queues_empty():
                    logger.info("burst: every queue is empty")
                    return None
        finally:
            stop.cancel()

    async def _all_queues_empty(self) -> bool:
        for queue in self.queues:
            if await self._broker.workers.count_unfinished(queue):
                return False
        return True

    def request_stop(self) -> None:
        """Stop taking jobs, let active ones finish, then return from :meth:`run`.

        Safe to call from any thread and from signal handlers.
        """
        self._graceful.request()

    def _wake(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)

    # -- jobs -------------------------------------------------------------------------

    async def _process(self, plan: QueuePlan, job: ActiveJob) -> Any:
        job_type = plan.job_type_of(job.name)
        if job_type is None:
            logger.warning("job %s (queue %s) failed: NoHandlerError", job.job_id, plan.queue)
            raise NoHandlerError(
                f"job {job.job_id} of queue {plan.queue!r} is named {job.name!r}, which is "
                f"not a job type of this queue: {_names(plan.job_types)}"
            )
        if job_type in plan.task_types and _is_task_job(job.data):
            return await self._run_task(job_type, job)
        handler = plan.handlers.get(job_type)
        if handler is None:
            logger.warning("job %s (%s) failed: NoHandlerError", job.job_id, job_type)
            raise NoHandlerError(
                f"job {job.job_id} of job type {job_type!r} is not a Django task job and the "
                "job type has no handler"
            )
        payload, tenant_id, level = split_payload(job.data)
        context = JobContext(
            job_id=job.job_id,
            job_type=job_type,
            tenant_id=tenant_id,
            priority_level=level,
            attempts_made=job.attempts_made,
        )
        started = time.monotonic()
        logger.debug("job %s (%s) started, attempt %d", job.job_id, job_type, job.attempts_made + 1)
        try:
            await self._call(handler, payload, context)
        except Exception as exc:
            _log_failure(job, job_type, started, exc)
            raise  # BullMQ fails the job and applies its attempts and backoff
        logger.info("job %s (%s) done in %d ms", job.job_id, job_type, _elapsed_ms(started))

    async def _call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Await an async handler or task on this loop; run a sync one in the job
        thread pool (:func:`_call_sync`)."""
        if iscoroutinefunction(func):
            return await func(*args, **kwargs)
        return await sync_to_async(_call_sync, thread_sensitive=False, executor=self._executor)(
            func, *args, **kwargs
        )

    async def _run_task(self, job_type: str, job: ActiveJob) -> Any:
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
            value = await self._call(task.func, *args, **call.kwargs)
            value = task_jobs.json_value(value, f"the return value of task {call.path!r}")
        except Exception as exc:
            _log_failure(job, job_type, started, exc)
            task_jobs.finish_task_result(running, error=exc)
            await task_jobs.asend_signal("task_finished", FairQueueBackend, running)
            raise TaskFailedError(f"{task_jobs.error_class_path(exc)}: {exc}") from exc
        task_jobs.finish_task_result(running, value=value)
        await task_jobs.asend_signal("task_finished", FairQueueBackend, running)
        logger.info("job %s (%s) done in %d ms", job.job_id, job_type, _elapsed_ms(started))
        return value

    def _release_next(self, queue: str, tenant: str) -> None:
        """A job its tenant's limits held has finished: release that tenant's next held
        job now (the loop would within its release step; this saves that latency)."""
        task = asyncio.ensure_future(self._release(queue, tenant))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, queue: str, tenant: str) -> None:
        try:
            await self._broker.limits.release(queue, [tenant])
        except Exception as exc:  # the loop releases it instead; never fail the worker
            logger.debug("release after a job failed (%s)", type(exc).__name__)

    def _on_bullmq_error(self, queue: str, error: BaseException) -> None:
        refused = permission_error(error)
        if refused is not None and self.burst:
            # BullMQ would retry forever; a burst run (CI, a cron job) must fail instead.
            if self._fatal is None:
                logger.error("BullMQ worker error on queue %s: %s", queue, refused)
                self._fatal = refused
                self._wake()
            return
        logger.error(
            "BullMQ worker error on queue %s: %s",
            queue,
            refused if refused is not None else type(error).__name__,
        )

    # -- stopping and starting ----------------------------------------------------------

    def _graceful_stop(self) -> GracefulStop:
        """The loops' stop rule (:class:`fairqueue.loop.GracefulStop`): the first signal
        stops taking jobs and lets the active ones finish, a second exits at once."""
        return GracefulStop(
            logger,
            finishing="once the active jobs finish",
            forced="; BullMQ's stalled-job check takes back the active jobs once their "
            "locks expire",
            on_request=self._wake,
        )

    def _take_signals(self) -> Callable[[], None]:
        """Handle SIGTERM/SIGINT on the event loop (:meth:`GracefulStop.install_on`, so
        the loop wakes at once even while every job runs in the thread pool); return a
        function that puts back the previous handlers."""
        if not self._install_signals or self._loop is None:
            return lambda: None
        return self._graceful.install_on(self._loop)

    async def _reach_redis(self) -> bool:
        """Ping Redis until it answers, rather than letting BullMQ retry quietly: an
        outage is logged once and retried with the loops' backoff, and once more when
        Redis answers. In burst mode (the worker's ``--once``) the first failure raises.
        False if a stop came first."""
        if self._stop is None:
            raise RuntimeError("Worker._reach_redis called outside arun()")
        backoff = Backoff(logger, interval_ms=REDIS_RETRY_MS, resumed="worker starting")
        while True:
            try:
                await self._broker.ping()
            except BrokerUnavailableError as exc:
                if self.burst:
                    raise
                pause_s = backoff.unreachable(exc) / 1000
                try:
                    await asyncio.wait_for(self._stop.wait(), pause_s)
                except TimeoutError:
                    continue
                return False
            backoff.succeeded()
            return True


def _is_task_job(data: Any) -> bool:
    # task_jobs.TASK_KEY, spelled out: task_jobs needs django-tasks, this module does not.
    return isinstance(data, dict) and "djangoTask" in data


def _log_failure(job: ActiveJob, job_type: str, started: float, exc: Exception) -> None:
    # The class name only: messages and tracebacks may quote payload data.
    logger.warning(
        "job %s (%s) failed after %d ms: %s",
        job.job_id,
        job_type,
        _elapsed_ms(started),
        type(exc).__name__,
    )


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
