"""``manage.py fairqueue_relay``: move durable jobs from the outbox to BullMQ.

The ``rebalance_fair`` leader already relays every round; run this where no rebalancer
runs, or to drain the outbox faster. Several may run at once on PostgreSQL (rows are
claimed with ``SKIP LOCKED``); on SQLite run one. The command parses arguments;
:class:`Relay` runs the loop.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from fairqueue.conf import get_settings
from fairqueue.enqueue.outbox import RELAY_BATCH_SIZE, RelayResult, relay_outbox
from fairqueue.exceptions import BrokerUnavailableError
from fairqueue.management.arguments import int_in_range

logger = logging.getLogger("fairqueue.outbox")

MAX_BACKOFF_MS = 30_000
DEFAULT_INTERVAL_MS = 1_000

interval_ms = int_in_range(1, 3_600_000)
batch_size = int_in_range(1, 10_000)


class Relay:
    """The relay loop: a relay run every interval (at once again while rows remain).

    Redis down is logged once and retried with backoff; any other failure is logged by
    class name and the loop goes on. SIGINT/SIGTERM finish the run in flight; a second
    signal exits at once.
    """

    def __init__(
        self,
        job_types: Sequence[str],
        *,
        interval_ms: int,
        batch_size: int = RELAY_BATCH_SIZE,
        verbosity: int = 1,
    ) -> None:
        self.job_types = list(job_types)
        self.batch_size = batch_size
        self.interval_ms = interval_ms
        self.verbosity = verbosity
        self._stop = threading.Event()
        self._signals = 0
        self._failures = 0

    def request_stop(self, signum: int | None = None, frame: Any = None) -> None:
        self._signals += 1
        if self._signals > 1:
            os._exit(128 + (signum or signal.SIGTERM))
        self._stop.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)

    def run_once(self) -> RelayResult:
        close_old_connections()
        result = relay_outbox(job_types=self.job_types, batch_size=self.batch_size)
        if result.sent or result.refused:
            logger.log(logging.INFO if self.verbosity >= 2 else logging.DEBUG, result.summary())
        return result

    def run(self) -> None:
        while not self._stop.is_set():
            wait_ms = self.interval_ms
            try:
                result = self.run_once()
                if self._failures:
                    logger.info("Redis is reachable again; relaying resumed")
                self._failures = 0
                if result.sent:
                    wait_ms = 0  # rows moved: more may wait
            except BrokerUnavailableError as exc:
                if not self._failures:
                    logger.warning("Redis is unreachable (%s); retrying with backoff", exc)
                self._failures += 1
                wait_ms = min(self.interval_ms * 2 ** min(self._failures, 10), MAX_BACKOFF_MS)
            except Exception as exc:  # a database hiccup must not end the loop
                logger.error("outbox relay failed (%s)", type(exc).__name__)
            self._stop.wait(wait_ms / 1000)


class Command(BaseCommand):
    help = (
        "Move durable jobs (enqueue_on_commit, durable=True) from the outbox table to "
        "BullMQ, oldest first, with their fair placement."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Run the relay once and exit.")
        parser.add_argument(
            "--queue",
            action="append",
            dest="job_types",
            metavar="NAME",
            help="Job type to relay (repeatable; default: every configured job type).",
        )
        parser.add_argument(
            "--interval-ms",
            type=interval_ms,
            help=f"Pause between runs in ms, 1..3600000 (default: {DEFAULT_INTERVAL_MS}).",
        )
        parser.add_argument(
            "--batch-size",
            type=batch_size,
            default=RELAY_BATCH_SIZE,
            help=f"Rows claimed per transaction, 1..10000 (default: {RELAY_BATCH_SIZE}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        settings = get_settings()
        level = {0: logging.WARNING, 1: logging.INFO}.get(options["verbosity"], logging.DEBUG)
        logger.setLevel(level)
        job_types = options.get("job_types") or list(settings.queues)
        unknown = [job_type for job_type in job_types if job_type not in settings.queues]
        if unknown:
            raise CommandError(
                f"--queue {unknown[0]!r} is not allowed: expected one of {sorted(settings.queues)}"
            )
        interval = options.get("interval_ms")
        if interval is None:
            interval = DEFAULT_INTERVAL_MS
        else:  # call_command(interval_ms=...) bypasses argparse's type check
            try:
                interval = interval_ms(interval)
            except argparse.ArgumentTypeError as exc:
                raise CommandError(f"argument --interval-ms: {exc}") from None
        try:
            size = batch_size(options.get("batch_size", RELAY_BATCH_SIZE))
        except argparse.ArgumentTypeError as exc:
            raise CommandError(f"argument --batch-size: {exc}") from None
        relay = Relay(
            job_types, interval_ms=interval, batch_size=size, verbosity=options["verbosity"]
        )
        try:
            if options["once"]:
                self.stdout.write(f"{relay.run_once().summary()}\n")
                return
            if threading.current_thread() is threading.main_thread():
                relay.install_signal_handlers()
            relay.run()
        except BrokerUnavailableError as exc:
            raise CommandError(f"Redis is unreachable: {exc}") from None
