"""When a worker process should be replaced, and how it tells its supervisor why.

Django handlers often leak (a module-level cache, a QuerySet kept alive, a C library's
arena): ``--max-jobs-per-child`` and ``--max-memory-mb`` put a bound on that. A process
over either takes no new job, lets its current ones finish and exits with
:data:`RECYCLED_EXIT`; the supervisor starts its replacement at once (no backoff: a
recycle is not a failure).

The exit status is the whole protocol between a child and its supervisor: no pipe to
keep alive, and a child killed by the kernel (OOM, ``kill -9``) reads the same way to it.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from dataclasses import dataclass, field
from typing import Final

#: A child that stopped as asked, or a burst child whose queues are empty.
STOPPED_EXIT: Final = 0
#: A child replaced after ``--max-jobs-per-child`` jobs or over ``--max-memory-mb``.
RECYCLED_EXIT: Final = 3
#: A child whose jobs were still running when ``--grace-s`` ran out: it exited and left
#: them to BullMQ's stalled check (which takes them back once their locks expire).
GRACE_EXPIRED_EXIT: Final = 4

MAX_JOBS_PER_CHILD: Final = 100_000_000
MAX_MEMORY_MB: Final = 1_048_576  # 1 TiB
_PAGE_BYTES: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_mb() -> float:
    """This process's resident memory now, in MiB (``/proc/self/statm``; elsewhere its
    peak, ``ru_maxrss``, which only grows: a stricter bound, never a looser one)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES / 1_048_576
    except (OSError, IndexError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # kB on Linux, bytes on macOS.
        return peak / (1_048_576 if sys.platform == "darwin" else 1024)


@dataclass(slots=True)
class Recycling:
    """A process's bounds (``None``: no bound) and the jobs it has finished.

    :meth:`job_finished` is called after every job (done or failed) and returns why the
    process should now be replaced, once, or ``None``.
    """

    max_jobs: int | None = None
    max_memory_mb: int | None = None
    jobs_done: int = 0
    reason: str | None = field(default=None)

    @property
    def active(self) -> bool:
        return self.max_jobs is not None or self.max_memory_mb is not None

    def job_finished(self) -> str | None:
        self.jobs_done += 1
        if self.reason is not None or (self.max_jobs is None and self.max_memory_mb is None):
            return None
        if self.max_jobs is not None and self.jobs_done >= self.max_jobs:
            self.reason = f"{self.jobs_done} jobs done (--max-jobs-per-child {self.max_jobs})"
        elif self.max_memory_mb is not None:
            used = resident_mb()
            if used > self.max_memory_mb:
                self.reason = f"{used:.0f} MiB resident (--max-memory-mb {self.max_memory_mb})"
        return self.reason


def exit_reason(exitcode: int | None) -> str:
    """What a child's exit status says, for the supervisor's log line."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return {
        STOPPED_EXIT: "stopped",
        RECYCLED_EXIT: "recycled",
        GRACE_EXPIRED_EXIT: "grace period over, jobs left to the stalled check",
    }.get(exitcode, f"exit status {exitcode}")
