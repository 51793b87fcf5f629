"""``manage.py fairqueue_worker [JOB_TYPE ...]``: run job handlers, and Django tasks
enqueued through ``fairqueue.tasks.backend.FairQueueBackend``, on BullMQ's queues.

This command parses and checks arguments; :class:`fairqueue.worker.runner.Worker` runs the
loop (an asyncio one: it shares :mod:`fairqueue.loop`'s stop rule and backoff, and
:class:`~fairqueue.management.base.LoopCommand`'s logging; ``--burst`` is its ``--once``).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser

from fairqueue.exceptions import BrokerError
from fairqueue.management.arguments import int_in_range, recheck
from fairqueue.management.base import LoopCommand
from fairqueue.worker.handlers import autodiscover
from fairqueue.worker.runner import (
    MAX_CONCURRENCY,
    MIN_CONCURRENCY,
    Worker,
    WorkerStoppedError,
    runnable_job_types,
)

#: argparse type of ``--concurrency``: an integer in 1..1000.
concurrency = int_in_range(MIN_CONCURRENCY, MAX_CONCURRENCY)


class Command(LoopCommand):
    help = (
        "Run the handlers of fairqueue job types (registered with @fairqueue.handler in "
        "installed apps' jobs.py) and Django tasks (@task, enqueued through "
        "fairqueue.tasks.backend.FairQueueBackend) with stock BullMQ workers, one per "
        "queue. SIGTERM or "
        "SIGINT stops taking jobs and exits once the active ones finish; a second signal "
        "exits at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "job_types",
            nargs="*",
            metavar="JOB_TYPE",
            help=(
                "Job types to run (default: every job type that has a handler or that a "
                "FairQueueBackend enqueues Django tasks to)."
            ),
        )
        parser.add_argument(
            "--concurrency",
            type=concurrency,
            default=1,
            help=(
                f"Jobs run at once per queue, {MIN_CONCURRENCY}..{MAX_CONCURRENCY} (default: 1)."
            ),
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help=(
                "Exit once every queue has nothing waiting, delayed (retries serving their "
                "backoff included) or active."
            ),
        )

    def handle_loop(self, **options: Any) -> None:
        value = recheck("--concurrency", options["concurrency"], concurrency)
        autodiscover()
        try:
            known = runnable_job_types()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        job_types = list(dict.fromkeys(options["job_types"]))
        unknown = [job_type for job_type in job_types if job_type not in known]
        if unknown:
            raise CommandError(
                f"unknown job type {unknown[0]!r}: job types with a handler or Django tasks are "
                f"{', '.join(repr(t) for t in known) or '(none)'}"
            )
        try:
            worker = Worker(job_types or known, concurrency=value, burst=options["burst"])
        except (LookupError, ValueError, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from exc
        try:
            worker.run()
        except (BrokerError, WorkerStoppedError) as exc:
            raise CommandError(str(exc)) from exc
