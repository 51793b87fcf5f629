"""``manage.py rebalance_fair``: keep BullMQ queues in the fair order.

The command parses and checks arguments; :class:`Rebalancer` runs the loop (the
django-tasks ``db_worker`` split).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from fairqueue.conf import get_settings
from fairqueue.enqueue.outbox import relay_outbox
from fairqueue.exceptions import BrokerRejectedError, BrokerUnavailableError
from fairqueue.management.arguments import int_in_range
from fairqueue.metrics import get_metrics
from fairqueue.rebalance.passes import (
    LeaderLock,
    PassResult,
    lock_ttl_ms,
    rebalance_queue,
    rebalancer_id,
    record_history,
)

logger = logging.getLogger("fairqueue.rebalance")

MAX_BACKOFF_MS = 30_000
#: Between two passes the loop records the dashboard's history this often: BullMQ keeps
#: about 10,000 events (about 3 per job: 3 s of them at 1,000 jobs/s), and with
#: KEEP_COMPLETED's count of 1,000 a finished job's hash (its level and tenant) lives
#: about 1,000 / throughput seconds.
HISTORY_EVERY_MS = 250
#: At default verbosity, passes that found nothing to do are logged as one line per
#: this many seconds (a loop at 4 passes/s over three queues would otherwise log 12
#: identical lines a second).
QUIET_SUMMARY_S = 60.0


interval_ms = int_in_range(1, 3_600_000)
port = int_in_range(1, 65_535, "a TCP port")


class Rebalancer:
    """The rebalance loop: one pass per configured queue every interval, as leader only,
    and a run of the outbox relay (for its job types) when it leads any queue.

    A Redis outage is logged once and retried with backoff; any other failure of a pass
    is logged by class name and the loop goes on. SIGINT/SIGTERM finish the pass in
    flight, release the locks and return; a second signal exits at once.

    Logging (logger ``fairqueue.rebalance``): one line at start; at verbosity 1 one
    compact line per pass that did something (adopted, aged, rebased, parked, a lost
    lock, jobs going overdue or none overdue any more) and one line per
    :data:`QUIET_SUMMARY_S` for the quiet passes; at verbosity 2 every pass's full
    counts. Counts only: no tenant ids.
    """

    def __init__(
        self,
        job_types: Sequence[str],
        *,
        interval_ms: int,
        dry_run: bool = False,
        out: TextIO | None = None,
        verbosity: int = 1,
    ) -> None:
        self.job_types = list(job_types)
        self.interval_ms = interval_ms
        self.dry_run = dry_run
        self.out = out
        self.verbosity = verbosity
        self.token = rebalancer_id()
        settings = get_settings()
        self.locks = {
            queue: LeaderLock(queue, self.token, lock_ttl_ms(interval_ms))
            for queue in {settings.queues[job_type] for job_type in self.job_types}
        }
        self._stop = threading.Event()
        self._signals = 0
        self._redis_down = False
        self._failures = 0
        self._relay_error: str | None = None
        self._last_overdue: dict[str, int] = {}
        self._quiet_passes = 0
        self._quiet_worst_ms = 0.0
        self._quiet_since = time.monotonic()
        self._once = False

    # -- control ----------------------------------------------------------------------

    def request_stop(self, signum: int | None = None, frame: Any = None) -> None:
        self._signals += 1
        if self._signals > 1:
            logger.warning("second signal: exiting now")
            os._exit(128 + (signum or signal.SIGTERM))
        logger.info("stopping after the pass in flight")
        self._stop.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)

    # -- the loop ---------------------------------------------------------------------

    def run_once(self) -> list[PassResult]:
        """One round over every queue. Raises BrokerUnavailableError if Redis is down."""
        close_old_connections()
        settings = get_settings()
        results = []
        done_queues: set[str] = set()
        for job_type in self.job_types:
            queue = settings.queues[job_type]
            if not self.dry_run:
                if queue not in done_queues and not self.locks[queue].acquire():
                    logger.debug("%s: another rebalancer holds the lock", job_type)
                    continue
                done_queues.add(queue)
            try:
                result = rebalance_queue(
                    job_type,
                    dry_run=self.dry_run,
                    rebalancer=self.token,
                    interval_ms=self.interval_ms,
                )
            except BrokerUnavailableError:
                raise
            except Exception as exc:  # a bad pass must not end the loop
                logger.error("%s: pass failed (%s)", job_type, type(exc).__name__)
                continue
            results.append(result)
            self._report(result)
        if done_queues and not self.dry_run:
            self._relay()
        return results

    def start_line(self) -> str:
        """What the loop will do, logged once at start (no password, no tenant ids)."""
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
        off); any other failure is logged and the loop goes on."""
        try:
            result = relay_outbox(job_types=self.job_types)
        except BrokerUnavailableError:
            raise
        except Exception as exc:  # a database hiccup must not end the loop
            error = type(exc).__name__
            if error != self._relay_error:  # once per kind of failure, not every round
                logger.error("outbox relay failed (%s); retrying every round", error)
            self._relay_error = error
            return
        if self._relay_error is not None:
            logger.info("outbox relay works again")
            self._relay_error = None
        if result.sent or result.refused:
            logger.log(logging.INFO if self.verbosity >= 2 else logging.DEBUG, result.summary())

    def run(self, *, once: bool = False) -> None:
        logger.info("%s", self.start_line())
        self._once = once
        if not once:
            # Rebalancers started together (a deploy) should not all hit Redis at once.
            self._stop.wait(random.uniform(0, min(self.interval_ms, 1_000)) / 1000)  # noqa: S311
        try:
            while not self._stop.is_set():
                wait_ms = self.interval_ms
                try:
                    self.run_once()
                    if self._redis_down:
                        logger.info("Redis is reachable again; rebalancing resumed")
                    self._redis_down, self._failures = False, 0
                except BrokerUnavailableError as exc:
                    if once:  # the command says so once, as its error: no retry to announce
                        raise
                    if not self._redis_down:
                        logger.warning(
                            "Redis at %s is unreachable (%s); retrying with backoff up to %d s",
                            get_settings().redis_location,
                            unavailable_reason(exc),
                            MAX_BACKOFF_MS // 1000,
                        )
                    self._redis_down = True
                    self._failures += 1
                    wait_ms = min(self.interval_ms * 2 ** min(self._failures, 10), MAX_BACKOFF_MS)
                except BrokerRejectedError as exc:  # e.g. out of memory taking the lock
                    if once:
                        raise
                    logger.warning("Redis refused a command (%s); retrying", exc.redis_error)
                    self._failures += 1
                    wait_ms = min(self.interval_ms * 2 ** min(self._failures, 10), MAX_BACKOFF_MS)
                if once:
                    break
                self._wait(wait_ms)
        finally:
            self.release_locks()
            self._log_quiet(force=True)

    def _wait(self, wait_ms: int) -> None:
        """Wait for the next pass, recording the history every ``HISTORY_EVERY_MS`` for
        the queues this loop leads (never while Redis is down, never in a dry run)."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stop.wait(min(remaining, HISTORY_EVERY_MS / 1000)):
                return
            if deadline - time.monotonic() > 0 and not (self.dry_run or self._redis_down):
                self._record_history()

    def _record_history(self) -> None:
        settings = get_settings()
        done: set[str] = set()
        for job_type in self.job_types:
            queue = settings.queues[job_type]
            if queue in done or not self.locks[queue].held:
                continue
            done.add(queue)
            try:
                record_history(job_type, rebalancer=self.token, interval_ms=self.interval_ms)
            except Exception as exc:  # the next pass records what this one missed
                logger.debug("%s: history step failed (%s)", job_type, type(exc).__name__)

    def release_locks(self) -> None:
        for lock in self.locks.values():
            try:
                lock.release()
            except (BrokerUnavailableError, BrokerRejectedError):
                pass  # the lock expires by itself

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
        busy = result.adopted or result.aged or result.rebased or result.parked or result.lock_lost
        # Overdue counts move with every pass under load: only jobs going overdue, or
        # none being overdue any more, is news; the quiet line carries the count.
        if busy or first or (result.overdue > 0) != (previous > 0) or self._once:
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
    if result.parked:
        parts.append(f"parked {result.parked}")
    if result.lock_lost:
        parts.append("lock lost")
    return f"{result.job_type}: {', '.join(parts)} in {result.duration_ms:.0f} ms"


def unavailable_reason(exc: BrokerUnavailableError) -> str:
    """Why Redis could not be reached, as the underlying error's class name."""
    cause = exc.__cause__
    return type(cause).__name__ if cause is not None else str(exc)


class Command(BaseCommand):
    help = (
        "Rebalance BullMQ queues into fairqueue's weighted fair order every "
        "QUEUE_FAIR_REBALANCE_INTERVAL_MS. Run one per host; a Redis lock makes only one "
        "write per queue."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Run one pass and exit.")
        parser.add_argument(
            "--queue",
            action="append",
            dest="job_types",
            metavar="NAME",
            help="Job type to rebalance (repeatable; default: every configured job type).",
        )
        parser.add_argument(
            "--interval-ms",
            type=interval_ms,
            help="Pass interval in ms, 1..3600000 (default: QUEUE_FAIR_REBALANCE_INTERVAL_MS).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Print what a pass would do (adopt, overdue); write nothing.",
        )
        parser.add_argument(
            "--metrics-port", type=port, help="Serve Prometheus metrics on this port."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        settings = get_settings()
        level = {0: logging.WARNING, 1: logging.INFO}.get(options["verbosity"], logging.DEBUG)
        logger.setLevel(level)
        if not logger.hasHandlers():  # no LOGGING for fairqueue: still say what happens
            handler = logging.StreamHandler(self.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)
        job_types = options.get("job_types") or list(settings.queues)
        unknown = [job_type for job_type in job_types if job_type not in settings.queues]
        if unknown:
            raise CommandError(
                f"--queue {unknown[0]!r} is not allowed: expected one of {sorted(settings.queues)}"
            )
        interval = options.get("interval_ms")
        if interval is None:
            interval = settings.rebalance_interval_ms
        else:  # call_command(interval_ms=...) bypasses argparse's type check
            try:
                interval = interval_ms(interval)
            except argparse.ArgumentTypeError as exc:
                raise CommandError(f"argument --interval-ms: {exc}") from None
        if options.get("metrics_port"):
            from prometheus_client import start_http_server

            get_metrics()
            start_http_server(options["metrics_port"])
        rebalancer = Rebalancer(
            job_types,
            interval_ms=interval,
            dry_run=options["dry_run"],
            out=self.stdout,
            verbosity=options["verbosity"],
        )
        if not options["once"] and threading.current_thread() is threading.main_thread():
            rebalancer.install_signal_handlers()
        try:
            rebalancer.run(once=options["once"])
        except BrokerUnavailableError as exc:
            raise CommandError(
                f"Redis at {settings.redis_location} is unreachable "
                f"({unavailable_reason(exc)}): no pass ran"
            ) from None
        except BrokerRejectedError as exc:
            raise CommandError(
                f"Redis refused a command ({exc.redis_error}): no pass ran"
            ) from None
