"""The worker processes' own Prometheus metrics: jobs each process ran, and the
supervisor's children and restarts.

They go to prometheus_client's process-wide registry. With ``--processes N`` each child
counts in its own process; set ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's
multiprocess mode, an empty directory the worker may write) and
``fairqueue_worker --metrics-port`` serves the sum over every child, the supervisor's
included (docs/operations.md). Labels are queue, job type, outcome and exit reason:
never a tenant.
"""

from __future__ import annotations

import os
import threading

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

_lock = threading.Lock()
_counters: dict[str, Counter] = {}
_gauges: dict[str, Gauge] = {}
#: ``queue_fair_worker_jobs``' children by (queue, job type, outcome): bounded by the
#: worker's queues and job types (never a tenant).
_job_children: dict[tuple[str, str, str], Counter] = {}


def multiprocess_dir() -> str | None:
    """prometheus_client's multiprocess directory, if this process runs in that mode."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def _create() -> None:
    with _lock:
        if not _counters:
            _counters["jobs"] = Counter(
                "queue_fair_worker_jobs",
                "Jobs fairqueue_worker processes ran, by outcome (every attempt).",
                ("queue", "job_type", "outcome"),
                registry=REGISTRY,
            )
            _counters["restarts"] = Counter(
                "queue_fair_worker_restarts",
                "Worker processes the supervisor replaced, by why the old one exited.",
                ("reason",),
                registry=REGISTRY,
            )
            _gauges["children"] = Gauge(
                "queue_fair_worker_processes",
                "Worker processes the supervisor runs now.",
                registry=REGISTRY,
                multiprocess_mode="livesum",
            )


def record_job(queue: str, job_type: str, outcome: str) -> None:
    """Count one job (every job calls it: its labelled child is looked up once)."""
    child = _job_children.get((queue, job_type, outcome))
    if child is None:
        _create()
        child = _counters["jobs"].labels(queue=queue, job_type=job_type, outcome=outcome)
        _job_children[(queue, job_type, outcome)] = child
    child.inc()


def record_restart(reason: str) -> None:
    _create()
    _counters["restarts"].labels(reason=reason).inc()


def set_children(count: int) -> None:
    _create()
    _gauges["children"].set(count)


def serving_registry() -> CollectorRegistry:
    """The registry ``--metrics-port`` serves: in multiprocess mode, a fresh one that
    sums every process's files; else this process's own."""
    directory = multiprocess_dir()
    if directory is None:
        return REGISTRY
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    return registry


def child_exited(pid: int) -> None:
    """Drop a dead child's live gauges (multiprocess mode only)."""
    if multiprocess_dir() is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
