"""Run registered job handlers with BullMQ workers.

One ``bullmq.Worker`` per BullMQ queue (built by :meth:`WorkerSupport.make_worker`), so
BullMQ's own locking, stalled-job recovery, attempts and backoff apply unchanged and
Python and Node workers can share a queue. What BullMQ does not know about (which
handler or ``@task`` runs a job, its payload and context, the thread pool, the logs)
is :mod:`fairqueue.worker.job_runs`'; this module runs the loop: a graceful stop on
SIGTERM/SIGINT, a forced one on the second signal, and a burst mode that stops once
every queue is empty. The ``fairqueue_worker`` command parses arguments (django-tasks'
``db_worker`` split).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final

from fairqueue.broker import Broker, get_broker, permission_error
from fairqueue.exceptions import (
    BrokerRejectedError,
    BrokerUnavailableError,
    WorkerStoppedError,
)
from fairqueue.loop import Backoff, GracefulStop
from fairqueue.worker.job_runs import JobRuns
from fairqueue.worker.liveness import Liveness
from fairqueue.worker.queue_plans import (
    MAX_CONCURRENCY,
    MIN_CONCURRENCY,
    QueuePlan,
    names,
    plan_queues,
    runnable_job_types,
    split_payload,
    task_job_types,
    validate_concurrency,
)
from fairqueue.worker.recycling import GRACE_EXPIRED_EXIT, Recycling

__all__ = [
    "MAX_CONCURRENCY",
    "MIN_CONCURRENCY",
    "QueuePlan",
    "Worker",
    "WorkerStoppedError",
    "plan_queues",
    "runnable_job_types",
    "split_payload",
    "task_job_types",
    "validate_concurrency",
]

logger = logging.getLogger("fairqueue.worker")

#: How often burst mode checks whether every queue is empty.
BURST_POLL_INTERVAL_S: Final = 0.05
#: Redis unreachable at start: the base interval of :func:`fairqueue.loop.backoff_ms`
#: (tries 1 s, 2 s, 4 s... apart, up to its cap).
REDIS_RETRY_MS: Final = 500
#: A stop that waits this long on BullMQ with no job running closes it by force.
CLOSE_IDLE_S: Final = 10.0
_DRAIN_TICK_S: Final = 0.25


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
        grace_s: how long a stop waits for the active jobs (``None``: as long as they
            take). When it runs out the process exits at once with
            :data:`~fairqueue.worker.recycling.GRACE_EXPIRED_EXIT`: the jobs still
            running die with it, keep their BullMQ locks until those expire, and
            BullMQ's stalled check then hands them to another worker, so none is lost
            and none runs twice at once. Only for a process of its own (the
            ``fairqueue_worker`` command and its children).
        recycling: the bounds after which this process stops taking jobs and returns
            once its active ones finish (:attr:`recycled` then says why).
        supervisor_pid, slot: set in a supervised child (liveness record, and a stop
            when the supervisor is gone).

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
        grace_s: float | None = None,
        recycling: Recycling | None = None,
        supervisor_pid: int | None = None,
        slot: int | None = None,
    ) -> None:
        self.concurrency = validate_concurrency(concurrency)
        self.grace_s = grace_s
        self.recycling = recycling or Recycling()
        self._supervisor_pid = supervisor_pid
        self._slot = slot
        self.plans = plan_queues(list(job_types) if job_types else runnable_job_types())
        self.burst = burst
        self._broker = broker or get_broker()
        self._install_signals = install_signal_handlers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._graceful = self._graceful_stop()
        #: What runs each job (the handlers, the thread pool, the counting).
        self._runs = JobRuns(self.recycling, self._recycle)
        #: A burst worker's reason to stop with an error (an ACL refusal: no retry helps).
        self._fatal: BrokerRejectedError | None = None
        self._bull_workers: list[Any] = []
        #: The BullMQ workers' close(), once started (a recycle starts it at once).
        self._closing: asyncio.Future[Any] | None = None
        #: Releases in flight (kept so the event loop does not drop them half-way).
        self._releases: set[asyncio.Future[None]] = set()

    def __repr__(self) -> str:
        return f"Worker(queues={self.queues!r}, concurrency={self.concurrency})"

    @property
    def recycled(self) -> str | None:
        """Why this process stopped to be replaced (``--max-jobs-per-child`` or
        ``--max-memory-mb``), or ``None``."""
        return self.recycling.reason

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
        self._runs.start(threads=self.concurrency * len(self.plans))
        self._closing = None
        self._bull_workers = bull_workers = [
            self._broker.workers.make_worker(
                plan.queue,
                partial(self._runs.process, plan),
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
            names(self.job_types),
            names(self.queues),
            self.concurrency,
            ", burst" if self.burst else "",
        )
        liveness = Liveness(
            self._broker,
            self.queues,
            concurrency=self.concurrency,
            jobs_done=lambda: self.recycling.jobs_done,
            on_orphaned=self.request_stop,
            supervisor_pid=self._supervisor_pid,
            slot=self._slot,
        )
        liveness.start()
        stopped_queue: str | None = None
        try:
            stopped_queue = await self._wait_for_stop(runs)
        finally:
            await self._drain(bull_workers, runs)
            await liveness.stop()
            self._runs.shutdown()
            restore_signals()
        if self._fatal is not None:
            raise self._fatal
        if stopped_queue is not None:
            raise WorkerStoppedError(
                f"the BullMQ worker of queue {stopped_queue!r} stopped unexpectedly"
            )
        logger.info("worker stopped")

    async def _drain(
        self, bull_workers: Sequence[Any], runs: Mapping[asyncio.Future[Any], str]
    ) -> None:
        """Stop taking jobs and wait for the active ones, up to :attr:`grace_s`; past
        it, exit the process at once (see the class's ``grace_s``).

        BullMQ's ``close()`` can also wait on its own job fetch (seen with Redis gone,
        and now and then on a loaded machine): once no job has run for
        :data:`CLOSE_IDLE_S`, the workers are closed by force, which cancels only
        fetches (a job a fetch had just taken keeps its lock until it expires, and the
        stalled check hands it on: never lost).
        """
        closing = self._start_closing()
        loop = asyncio.get_running_loop()
        started = loop.time()
        idle_since: float | None = None
        while not closing.done():
            now = loop.time()
            running = sum(len(getattr(w, "jobs", ()) or ()) for w in bull_workers)
            if self.grace_s is not None and now - started >= self.grace_s:
                logger.warning(
                    "grace period of %g s over with jobs still running: exiting now; BullMQ's "
                    "stalled-job check takes them back once their locks expire%s",
                    self.grace_s,
                    f" ({running} jobs)" if running else "",
                )
                _exit_now(GRACE_EXPIRED_EXIT)
            idle_since = None if running else (now if idle_since is None else idle_since)
            if idle_since is not None and now - idle_since >= CLOSE_IDLE_S:
                logger.warning(
                    "BullMQ's workers did not close within %g s of their last job: closing "
                    "them by force (no job is running)",
                    CLOSE_IDLE_S,
                )
                await asyncio.wait(
                    [asyncio.ensure_future(w.close(force=True)) for w in bull_workers],
                    timeout=CLOSE_IDLE_S,
                )
                break
            await asyncio.wait({closing}, timeout=_DRAIN_TICK_S)
        finished, _ = await asyncio.wait(list(runs), timeout=CLOSE_IDLE_S)
        for run in finished:  # retrieved, so asyncio does not log them as lost
            if not run.cancelled():
                run.exception()

    def _start_closing(self) -> asyncio.Future[Any]:
        """Close the BullMQ workers (once): each stops taking jobs, keeps renewing its
        active jobs' locks and waits for them to finish."""
        if self._closing is None:
            for worker in self._bull_workers:
                worker.stop_fetching()  # now, before a finish under way asks for a job
            self._closing = asyncio.gather(
                *(w.close() for w in self._bull_workers), return_exceptions=True
            )
        return self._closing

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

    def _recycle(self, reason: str) -> None:
        """A recycling bound is reached (:class:`~fairqueue.worker.job_runs.JobRuns`
        calls this once): take no more jobs, and stop once the active ones finish."""
        logger.info("recycling this process: %s; stopping once its jobs finish", reason)
        # Closing now, before BullMQ's loop frees the finished job's slot, so it takes
        # no job in it; the stop request then waits for the rest.
        self._start_closing()
        self._wake()

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


def _exit_now(status: int) -> None:
    """End the process at once (threads still running handlers die with it): flush the
    log streams first, as :class:`fairqueue.loop.GracefulStop`'s second signal does."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, RuntimeError, ValueError):
            pass
    os._exit(status)
