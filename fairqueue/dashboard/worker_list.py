"""The console's worker list: the worker processes serving a queue, from their
liveness records (:mod:`fairqueue.worker.liveness`), so an operator sees each process
of a ``fairqueue_worker --processes N`` (and of lone workers), that it is alive and
working, and the slots (processes x concurrency) the queue has."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fairqueue.broker import WorkerProcess
from fairqueue.dashboard.wording import format_duration


def workers_section(processes: Sequence[WorkerProcess], *, now_ms: int) -> dict[str, Any]:
    """Rows for the template, and the totals its heading shows."""
    rows = [
        {
            "host": process.host,
            "pid": process.pid,
            "supervisor": process.supervisor_pid if process.supervisor_pid is not None else "—",
            "slot": process.slot if process.slot is not None else "—",
            "concurrency": process.concurrency,
            "up": format_duration(now_ms - process.started_ms),
            "beat_age": format_duration(now_ms - process.beat_ms),
            "jobs_done": process.jobs_done,
        }
        for process in processes
    ]
    return {
        "rows": rows,
        "processes": len(rows),
        "slots": sum(process.concurrency for process in processes),
        "hosts": len({process.host for process in processes}),
    }
