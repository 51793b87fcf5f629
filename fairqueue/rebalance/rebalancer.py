"""The rebalance loop that ``manage.py rebalance_fair`` runs: a pass per configured queue
every interval, as leader only, the outbox relay when it leads, and the dashboard's
history between passes. Stopping, start-up, backoff and database connections are
:class:`fairqueue.loop.Loop`'s.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import TextIO

from fairqueue.broker import get_sync_broker
from fairqueue.conf import get_settings
from fairqueue.enqueue.outbox import relay_outbox
from fairqueue.exceptions import BrokerRejectedError, BrokerUnavailableError
from fairqueue.loop import Loop, RepeatedFailure
from fairqueue.metrics import get_metrics
from fairqueue.rebalance.leadership import LeaderLock, lock_ttl_ms, rebalancer_id
from fairqueue.rebalance.pass_result import PassResult
from fairqueue.rebalance.passes import rebalance_queue, run_tick
from fairqueue.rebalance.usage_step import UsageStep
from fairqueue.tenants import keep_tenant_limits

logger = logging.getLogger("fairqueue.rebalance")

#: Between two passes the loop records the dashboard's history this often: BullMQ keeps
#: about 10,000 events (about 3 per job: 3 s of them at 1,000 jobs/s), and with
#: KEEP_COMPLETED's count of 1,000 a finished job's hash (its level and tenant) lives
#: about 1,000 / throughput seconds.
HISTORY_EVERY_MS = 250
#: At default verbosity, passes that found nothing to do are logged as one line per
#: this many seconds (a loop at 4 passes/s over three queues would otherwise log 12
#: identical lines a second).
QUIET_SUMMARY_S = 60.0
#: How often the loop releases held jobs of tenants that got room (a completion, a rate
#: window opening), while any are held; with none held, RELEASE_IDLE_MS. A stock worker
#: tells fairqueue nothing, so this bounds the release latency (fairqueue_worker
#: releases at once when a job of a limited tenant finishes).
RELEASE_EVERY_MS = 20
RELEASE_IDLE_MS = 50


class Rebalancer(Loop):
    """The rebalance loop: one pass per configured queue every interval, as leader only,
    and a run of the outbox relay (for its job types) when it leads any queue.

    Stopping, backoff and failures are :class:`fairqueue.loop.Loop`'s; a stop also
    releases the locks. At verbosity 1 it logs one line per pass that did something and
    one per :data:`QUIET_SUMMARY_S` for the quiet ones (docs/operations.md); counts
    only, never tenant ids.
    """

    logger = logger
    round_name = "rebalance round"
    resumed = "rebalancing resumed"
    finishing = "after the pass in flight"
    forced = "; its locks expire by themselves within two intervals"

    def __init__(
        self,
        job_types: Sequence[str],
        *,
        interval_ms: int,
        dry_run: bool = False,
        out: TextIO | None = None,
        verbosity: int = 1,
        install_signal_handlers: bool = True,
    ) -> None:
        super().__init__(interval_ms=interval_ms, install_signal_handlers=install_signal_handlers)
        self.job_types = list(job_types)
        self.dry_run = dry_run
        self.out = out
        self.verbosity = verbosity
        self.token = rebalancer_id()
        settings = get_settings()
        self.locks = {
            queue: LeaderLock(queue, self.token, lock_ttl_ms(interval_ms))
            for queue in {settings.queues[job_type] for job_type in self.job_types}
        }
        self._job_types_of: dict[str, list[str]] = {queue: [] for queue in self.locks}
        for job_type in self.job_types:
            self._job_types_of[settings.queues[job_type]].append(job_type)
        self._release_wait_s = RELEASE_EVERY_MS / 1000
        self._limits_kept: set[str] = set()
        self._relay_failure = RepeatedFailure(logger, "outbox relay")
        self._last_overdue: dict[str, int] = {}
        self._quiet_passes = 0
        self._quiet_worst_ms = 0.0
        self._quiet_since = time.monotonic()
        self.usage = UsageStep()
        metrics = get_metrics()
        for queue in self.locks:
            metrics.rebalance_interval.labels(queue).set(interval_ms / 1000)
            metrics.max_wait.labels(queue).set(settings.max_wait_ms / 1000)
        if not dry_run:
            self._publish_leadership()

    # -- a round ----------------------------------------------------------------------

    def run_once(self) -> list[PassResult]:
        """One round over every queue. Raises BrokerUnavailableError if Redis is down."""
        settings = get_settings()
        results = []
        done_queues: set[str] = set()
        pass_errors = get_metrics().pass_errors
        for job_type in self.job_types:
            queue = settings.queues[job_type]
            if not self.dry_run:
                try:
                    acquired = queue in done_queues or self.locks[queue].acquire()
                except Exception:  # the loop backs off; this round ran no pass
                    pass_errors.labels(job_type, queue).inc()
                    self._publish_leadership(reachable=False)
                    raise
                if not acquired:
                    logger.debug("%s: another rebalancer holds the lock", job_type)
                    continue
                if queue not in done_queues:
                    # The database's limits and pauses in Redis: rebuilt when this loop
                    # first leads the queue, and whenever Redis lost them (one EXISTS).
                    if keep_tenant_limits(queue, force=queue not in self._limits_kept):
                        self._limits_kept.add(queue)
                done_queues.add(queue)
            try:
                result = rebalance_queue(
                    job_type,
                    dry_run=self.dry_run,
                    rebalancer=self.token,
                    interval_ms=self.interval_ms,
                )
            except BrokerUnavailableError:
                pass_errors.labels(job_type, queue).inc()
                if not self.dry_run:
                    self._publish_leadership(reachable=False)
                raise
            except Exception as exc:  # a bad pass must not end the loop
                pass_errors.labels(job_type, queue).inc()
                logger.error("%s: pass failed (%s)", job_type, type(exc).__name__)
                continue
            results.append(result)
            self._report(result)
            if not self.dry_run and not result.lock_lost:
                self.usage.run(queue)
        if not self.dry_run:
            self._publish_leadership()
        if done_queues and not self.dry_run:
            self._relay()
        return results

    def _publish_leadership(self, *, reachable: bool = True) -> None:
        """``queue_fair_leader``: 1 for each queue whose lock this loop holds, 0 for the
        others, and 0 for all while Redis is unreachable (the lock cannot be renewed, so
        this loop leads nothing)."""
        leader = get_metrics().leader
        for queue, lock in self.locks.items():
            leader.labels(queue).set(1 if reachable and lock.held else 0)

    def start_line(self) -> str:
        settings = get_settings()
        queues = ", ".join(
            job_type
            if settings.queues[job_type] == job_type
            else f"{job_type} (queue {settings.queues[job_type]})"
            for job_type in self.job_types
        )
        mode = " (dry run: writes nothing)" if self.dry_run else ""
        return (
            f"rebalance_fair starting{mode}: {queues}; every {self.interval_ms} ms; "
            f"wait bound {settings.max_wait_ms} ms; Redis {settings.redis_location} "
            f"prefix {settings.prefix!r}; {self.token}"
        )

    def _relay(self) -> None:
        """Move durable jobs from the outbox to Redis. Redis down raises (the loop backs
        off); any other failure is logged once per kind and the pass's round goes on."""
        try:
            result = relay_outbox(job_types=self.job_types)
        except BrokerUnavailableError:
            raise
        except Exception as exc:  # a database hiccup must not end the loop
            self._relay_failure.failed(exc)
            return
        self._relay_failure.succeeded()
        if result.sent or result.refused:
            logger.log(logging.INFO if self.verbosity >= 2 else logging.DEBUG, result.summary())

    # -- between rounds and after the last ----------------------------------------------

    def wait(self, pause_ms: int) -> None:
        """Wait for the next pass, running a tick every ``HISTORY_EVERY_MS`` for the
        queues this loop leads (never while Redis is down, never in a dry run): the
        stalled-job check, a page of adoption (jobs that run again get their fair place
        within a tick) and the history step; between ticks, the quota check of tenants
        whose running attempts could have reached their quota (its predicted time)."""
        now = time.monotonic()
        deadline = now + pause_ms / 1000
        next_tick = now + HISTORY_EVERY_MS / 1000
        while True:
            now = time.monotonic()
            remaining = deadline - now
            quota_s = math.inf if self.dry_run else max(self.usage.quota_due_in_s(), 0.001)
            step = min(remaining, next_tick - now, self._release_wait_s, quota_s)
            if remaining <= 0 or self._stop.wait(max(step, 0)):
                return
            now = time.monotonic()
            if deadline - now <= 0 or self.dry_run or self.backoff.down:
                continue
            if now >= next_tick:
                self._tick()
                next_tick = time.monotonic() + HISTORY_EVERY_MS / 1000
            elif self.usage.quota_due_in_s() <= 0:
                self.usage.check_running()  # a tenant's running attempts reach its quota
            self._release()

    def _release(self) -> None:
        """Release held jobs of tenants with room, in every queue this loop leads, and
        set ``queue_fair_held_jobs``. Unfenced on purpose: the release script decides
        and moves atomically, so a second caller (a worker, an old leader) cannot make a
        tenant exceed its limits, and a new leader after a crash simply carries on."""
        metrics = get_metrics()
        wait_ms = RELEASE_IDLE_MS
        sync_broker = get_sync_broker()
        for queue, lock in self.locks.items():
            if not lock.held:
                continue
            try:
                released = sync_broker.run(sync_broker.broker.limits.release, queue)
            except Exception as exc:  # the next step tries again; never end the loop
                logger.debug("%s: release failed (%s)", queue, type(exc).__name__)
                continue
            for job_type in self._job_types_of[queue]:
                metrics.held_jobs.labels(job_type, queue).set(released.held)
            if released.held:
                wait_ms = min(wait_ms, RELEASE_EVERY_MS, released.wake_ms or RELEASE_EVERY_MS)
        self._release_wait_s = wait_ms / 1000

    def _tick(self) -> None:
        settings = get_settings()
        done: set[str] = set()
        for job_type in self.job_types:
            queue = settings.queues[job_type]
            if queue in done or not self.locks[queue].held:
                continue
            done.add(queue)
            try:
                run_tick(job_type, rebalancer=self.token, interval_ms=self.interval_ms)
            except Exception as exc:  # the next pass does what this tick missed
                logger.debug("%s: tick failed (%s)", job_type, type(exc).__name__)
                continue
            self.usage.run(queue)

    def finish(self) -> None:
        self.release_locks()
        if not self.dry_run:
            self._publish_leadership()
        self._log_quiet(force=True)

    def release_locks(self) -> None:
        for lock in self.locks.values():
            try:
                lock.release()
            except (BrokerUnavailableError, BrokerRejectedError):
                pass  # the lock expires by itself

    # -- what a pass logs -----------------------------------------------------------------

    def _report(self, result: PassResult) -> None:
        """One pass's line: the full summary on ``out`` for a dry run (printed once, not
        logged as well), else a log line by verbosity (see the class docstring)."""
        if result.dry_run and self.out is not None:
            self.out.write(f"{result.summary()}\n")
            return
        if self.verbosity >= 2:
            logger.info("%s", result.summary())
            return
        first = result.job_type not in self._last_overdue
        previous = self._last_overdue.get(result.job_type, 0)
        self._last_overdue[result.job_type] = result.overdue
        busy = (
            result.adopted
            or result.recovered
            or result.aged
            or result.rebased
            or result.parked
            or result.lock_lost
        )
        # Overdue counts move with every pass under load: only jobs going overdue, or
        # none being overdue any more, is news; the quiet line carries the count.
        if busy or first or (result.overdue > 0) != (previous > 0) or self.once:
            logger.info("%s", compact_line(result))
        else:
            self._quiet_passes += 1
            self._quiet_worst_ms = max(self._quiet_worst_ms, result.duration_ms)
        self._log_quiet()

    def _log_quiet(self, *, force: bool = False) -> None:
        """The quiet passes since the last such line, once per QUIET_SUMMARY_S."""
        elapsed = time.monotonic() - self._quiet_since
        if not self._quiet_passes or (elapsed < QUIET_SUMMARY_S and not force):
            return
        overdue = sum(self._last_overdue.values())
        logger.info(
            "%d quiet passes in %.0f s (nothing to adopt or rebase; overdue now %d; "
            "slowest %.1f ms)",
            self._quiet_passes,
            elapsed,
            overdue,
            self._quiet_worst_ms,
        )
        self._quiet_passes, self._quiet_worst_ms = 0, 0.0
        self._quiet_since = time.monotonic()


def compact_line(result: PassResult) -> str:
    """A pass in one short line: what it changed and how long it took (counts only)."""
    parts = [
        f"adopted {result.adopted}",
        f"aged {result.aged}",
        f"overdue {result.overdue}",
        f"rebased {result.rebased}",
    ]
    if result.recovered:
        parts.append(f"recovered {result.recovered} stalled")
    if result.parked:
        parts.append(f"parked {result.parked}")
    if result.lock_lost:
        parts.append("lock lost")
    return f"{result.job_type}: {', '.join(parts)} in {result.duration_ms:.0f} ms"
