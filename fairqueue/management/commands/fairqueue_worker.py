"""``manage.py fairqueue_worker [JOB_TYPE ...]``: run job handlers, and Django tasks
enqueued through ``fairqueue.tasks.backend.FairQueueBackend``, on BullMQ's queues.

This command parses and checks arguments; :class:`fairqueue.worker.runner.Worker` runs the
loop (an asyncio one: it shares :mod:`fairqueue.loop`'s stop rule and backoff, and
:class:`~fairqueue.management.base.LoopCommand`'s logging; ``--burst`` is its ``--once``),
and with ``--processes`` (or a recycling bound) :class:`fairqueue.worker.supervisor
.Supervisor` runs N of them as child processes.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser

from fairqueue.exceptions import BrokerError
from fairqueue.management.arguments import int_in_range, number_in_range, port, recheck
from fairqueue.management.base import LoopCommand
from fairqueue.worker.handlers import autodiscover
from fairqueue.worker.process_metrics import multiprocess_dir, serving_registry
from fairqueue.worker.recycling import MAX_JOBS_PER_CHILD, MAX_MEMORY_MB
from fairqueue.worker.runner import (
    MAX_CONCURRENCY,
    MIN_CONCURRENCY,
    Worker,
    WorkerStoppedError,
    plan_queues,
    runnable_job_types,
)
from fairqueue.worker.supervisor import (
    MAX_PROCESSES,
    MIN_PROCESSES,
    ChildSpec,
    Supervisor,
    available_cores,
)

#: argparse type of ``--concurrency``: an integer in 1..1000.
concurrency = int_in_range(MIN_CONCURRENCY, MAX_CONCURRENCY)
#: ``--grace-s``: up to a day.
grace_s = number_in_range(0, 86_400, "a number of seconds")
max_jobs_per_child = int_in_range(1, MAX_JOBS_PER_CHILD)
max_memory_mb = int_in_range(1, MAX_MEMORY_MB, "an integer (MiB)")
_process_count = int_in_range(MIN_PROCESSES, MAX_PROCESSES)


def processes(value: object) -> int:
    """argparse type of ``--processes``: an integer in 1..256, or ``auto`` (the cores
    this process may run on)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return available_cores()
    try:
        return _process_count(str(value))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not allowed: expected an integer in {MIN_PROCESSES}..{MAX_PROCESSES} "
            "or 'auto'"
        ) from None


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
            "--processes",
            type=processes,
            default=None,
            metavar="N|auto",
            help=(
                f"Run N worker processes ({MIN_PROCESSES}..{MAX_PROCESSES}; auto: one per core "
                "available) under a supervisor that restarts them; each runs --concurrency "
                "jobs per queue. Default: this one process."
            ),
        )
        parser.add_argument(
            "--grace-s",
            type=grace_s,
            default=None,
            help=(
                "On SIGTERM/SIGINT, how long active jobs may take to finish (0..86400); then "
                "the process exits and BullMQ's stalled check takes them back. Default: as "
                "long as they take."
            ),
        )
        parser.add_argument(
            "--max-jobs-per-child",
            type=max_jobs_per_child,
            default=None,
            help="Replace a worker process after this many jobs (once they finish).",
        )
        parser.add_argument(
            "--max-memory-mb",
            type=max_memory_mb,
            default=None,
            help="Replace a worker process whose resident memory is over this (checked after "
            "each job; it finishes its active jobs first).",
        )
        parser.add_argument(
            "--metrics-port",
            type=port,
            default=None,
            help="Serve the worker's Prometheus metrics on this port (with --processes, "
            "summed over every process: needs PROMETHEUS_MULTIPROC_DIR).",
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
        count = _optional("--processes", options.get("processes"), processes)
        grace = _optional("--grace-s", options.get("grace_s"), grace_s)
        max_jobs = _optional(
            "--max-jobs-per-child", options.get("max_jobs_per_child"), max_jobs_per_child
        )
        max_mb = _optional("--max-memory-mb", options.get("max_memory_mb"), max_memory_mb)
        metrics_port = _optional("--metrics-port", options.get("metrics_port"), port)
        supervised = count is not None or max_jobs is not None or max_mb is not None
        if metrics_port is not None and supervised and multiprocess_dir() is None:
            raise CommandError(
                f"argument --metrics-port: {metrics_port} is not allowed without "
                "PROMETHEUS_MULTIPROC_DIR: with worker processes, each counts in its own "
                "process; set it to an empty directory (prometheus_client's multiprocess "
                "mode) so the port serves their sum"
            )
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
        chosen = job_types or known
        if metrics_port is not None:
            from prometheus_client import start_http_server

            start_http_server(metrics_port, registry=serving_registry())
        if supervised:
            try:
                plan_queues(chosen)  # fail here, once, rather than in every child
            except (LookupError, ValueError, ImproperlyConfigured) as exc:
                raise CommandError(str(exc)) from exc
            spec = ChildSpec(
                chosen,
                concurrency=value,
                burst=options["burst"],
                grace_s=grace,
                max_jobs=max_jobs,
                max_memory_mb=max_mb,
            )
            if Supervisor(spec, count or 1).run():
                raise CommandError("a worker process failed (see the log above)")
            return
        try:
            worker = Worker(chosen, concurrency=value, burst=options["burst"], grace_s=grace)
        except (LookupError, ValueError, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from exc
        try:
            worker.run()
        except (BrokerError, WorkerStoppedError) as exc:
            raise CommandError(str(exc)) from exc


def _optional(option: str, value: object, parse: Any) -> Any:
    """An optional argument rechecked (:func:`recheck`), ``None`` left as it is."""
    return None if value is None else recheck(option, value, parse)
