"""``fairqueue_worker --processes N``: N worker processes under one supervisor, so
CPU-bound handlers use every core (the GIL gives one process one core).

The supervisor imports the handlers and checks the plan once, then forks each child
(fast, and the imported code is shared): each is a single-process
:class:`~fairqueue.worker.runner.Worker`. It takes no job and opens no Redis connection
itself. It restarts a child that exits, with a doubling delay (0.5 s to 30 s) while
children keep dying young, so a crash loop does not spin; on SIGTERM/SIGINT it passes
SIGTERM to every child and kills one still there ``--grace-s`` plus
:data:`KILL_MARGIN_S` later (a second signal kills at once). A job a child could not
finish keeps its BullMQ lock until it expires, then BullMQ's stalled check hands it on:
never lost, never run twice at once. Children run in their own process group, so a
terminal's Ctrl-C reaches the supervisor only, and a child whose supervisor died stops
by itself (:mod:`fairqueue.worker.liveness`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any, Final

from django.db import connections

from fairqueue.worker.process_metrics import child_exited, record_restart, set_children
from fairqueue.worker.recycling import RECYCLED_EXIT, STOPPED_EXIT, Recycling, exit_reason

logger = logging.getLogger("fairqueue.worker")

MIN_PROCESSES: Final = 1
MAX_PROCESSES: Final = 256
#: A child that ran this long before it exited was healthy: it is restarted at once.
HEALTHY_AFTER_S: Final = 10.0
#: The first delayed restart; it doubles with each child that dies young in a row.
RESTART_BASE_S: Final = 0.5
MAX_RESTART_DELAY_S: Final = 30.0
#: After a stop, how long past ``--grace-s`` a child may take before it is killed.
KILL_MARGIN_S: Final = 5.0
#: The most the supervisor sleeps without looking at its children.
_TICK_S: Final = 1.0


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity: a container's cpuset, taskset),
    which ``--processes auto`` starts one child per."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS has no affinity
        return max(1, os.cpu_count() or 1)


def restart_delay_s(young_deaths: int) -> float:
    """The pause before restarting a child after ``young_deaths`` children of its slot
    in a row exited before :data:`HEALTHY_AFTER_S` (0: restart at once)."""
    if young_deaths <= 0:
        return 0.0
    return min(RESTART_BASE_S * 2 ** min(young_deaths - 1, 16), MAX_RESTART_DELAY_S)


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """What each child runs: the :class:`~fairqueue.worker.runner.Worker` arguments."""

    job_types: Sequence[str]
    concurrency: int = 1
    burst: bool = False
    grace_s: float | None = None
    max_jobs: int | None = None
    max_memory_mb: int | None = None


def run_child(spec: ChildSpec, slot: int, supervisor_pid: int) -> int:
    """A child's whole life, in the forked process: run the worker; its exit status."""
    from fairqueue.exceptions import BrokerError, WorkerStoppedError
    from fairqueue.worker.runner import Worker

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)  # the supervisor's handlers are not ours
    os.setpgid(0, 0)
    logger.addFilter(_SlotPrefix(slot))
    worker = Worker(
        spec.job_types,
        concurrency=spec.concurrency,
        burst=spec.burst,
        grace_s=spec.grace_s,
        recycling=Recycling(max_jobs=spec.max_jobs, max_memory_mb=spec.max_memory_mb),
        supervisor_pid=supervisor_pid,
        slot=slot,
    )
    try:
        worker.run()
    except (BrokerError, WorkerStoppedError) as exc:
        logger.error("worker process %d failed: %s", slot, exc)
        return 1
    return RECYCLED_EXIT if worker.recycled else STOPPED_EXIT


class _SlotPrefix(logging.Filter):
    """Start a child's log lines with its slot, so N processes' lines can be told apart."""

    def __init__(self, slot: int) -> None:
        super().__init__()
        self.prefix = f"[worker {slot}] "

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and not record.msg.startswith(self.prefix):
            record.msg = self.prefix + record.msg
        return True


def _child_main(spec: ChildSpec, slot: int, supervisor_pid: int) -> None:
    sys.exit(run_child(spec, slot, supervisor_pid))


@dataclass(slots=True)
class _Slot:
    """One of the N places a child fills, across its restarts."""

    index: int
    process: BaseProcess | None = None
    started: float = 0.0
    young_deaths: int = 0
    restart_at: float | None = None
    done: bool = False
    failed: bool = False
    starts: int = field(default=0)


class Supervisor:
    """Run ``processes`` children of ``spec`` until stopped (:meth:`run`)."""

    def __init__(
        self, spec: ChildSpec, processes: int, *, install_signal_handlers: bool = True
    ) -> None:
        if isinstance(processes, bool) or not MIN_PROCESSES <= processes <= MAX_PROCESSES:
            raise ValueError(
                f"processes={processes!r} is not allowed: expected an integer in "
                f"{MIN_PROCESSES}..{MAX_PROCESSES}"
            )
        self.spec = spec
        self.slots = [_Slot(index) for index in range(processes)]
        self._install_signals = install_signal_handlers
        self._context = multiprocessing.get_context("fork")
        self._signalled: int | None = None
        self._stopping = False
        self._kill_at: float | None = None
        self._wake_r, self._wake_w = -1, -1

    # -- running ----------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until stopped, or until every child of a burst run is done.

        Returns 0, or 1 when a burst child failed (a burst run has no one to restart
        a failure for).
        """
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        restore = self._take_signals()
        logger.info(
            "supervisor started (pid %d): %d worker processes, concurrency %d each%s",
            os.getpid(),
            len(self.slots),
            self.spec.concurrency,
            f", grace {self.spec.grace_s:g} s" if self.spec.grace_s is not None else "",
        )
        try:
            for slot in self.slots:
                self._start(slot)
            while not self._finished():
                self._tick()
        finally:
            restore()
            os.close(self._wake_r)
            os.close(self._wake_w)
        set_children(0)
        logger.info("supervisor stopped")
        return 1 if any(slot.failed for slot in self.slots) else 0

    def request_stop(self) -> None:
        """Stop as the first SIGTERM would (safe from a signal handler)."""
        if self._signalled is None:
            self._signalled = signal.SIGTERM
        self._poke()

    def _finished(self) -> bool:
        return all(slot.process is None and (slot.done or self._stopping) for slot in self.slots)

    def _tick(self) -> None:
        now = time.monotonic()
        deadlines = [slot.restart_at for slot in self.slots if slot.restart_at is not None]
        if self._kill_at is not None:
            deadlines.append(self._kill_at)
        timeout = min([_TICK_S, *(max(0.0, d - now) for d in deadlines)])
        sentinels = [slot.process.sentinel for slot in self.slots if slot.process is not None]
        wait([*sentinels, self._wake_r], timeout)
        self._drain_wakeups()
        if self._signalled is not None and not self._stopping:
            self._begin_stop(self._signalled)
        for slot in self.slots:
            if slot.process is not None and slot.process.exitcode is not None:
                self._reap(slot)
        now = time.monotonic()
        for slot in self.slots:
            if not self._stopping and slot.restart_at is not None and slot.restart_at <= now:
                self._start(slot)
        if self._kill_at is not None and now >= self._kill_at:
            self._kill_at = None
            self._kill_children("still running past the grace period")

    # -- children -----------------------------------------------------------------------

    def _start(self, slot: _Slot) -> None:
        connections.close_all()  # a child must never share the parent's DB sockets
        process = self._context.Process(
            target=_child_main,
            args=(self.spec, slot.index, os.getpid()),
            name=f"fairqueue-worker-{slot.index}",
            daemon=False,
        )
        process.start()
        slot.process, slot.started, slot.restart_at = process, time.monotonic(), None
        slot.starts += 1
        logger.info(
            "worker process %d started (pid %s)%s",
            slot.index,
            process.pid,
            "" if slot.starts == 1 else f", start {slot.starts}",
        )
        set_children(self._alive())

    def _reap(self, slot: _Slot) -> None:
        process = slot.process
        assert process is not None  # noqa: S101 (only called for a slot with a child)
        exitcode, pid = process.exitcode, process.pid
        lived_s = time.monotonic() - slot.started
        process.join()
        process.close()
        slot.process = None
        if pid is not None:
            child_exited(pid)
        set_children(self._alive())
        reason = exit_reason(exitcode)
        if self._stopping:
            logger.info("worker process %d (pid %s) exited: %s", slot.index, pid, reason)
            return
        if self.spec.burst and exitcode != RECYCLED_EXIT:
            slot.done = True
            slot.failed = exitcode != STOPPED_EXIT
            log = logger.info if not slot.failed else logger.error
            log("worker process %d (pid %s) exited: %s", slot.index, pid, reason)
            return
        if exitcode == RECYCLED_EXIT or lived_s >= HEALTHY_AFTER_S:
            slot.young_deaths = 0
        else:
            slot.young_deaths += 1
        delay_s = 0.0 if exitcode == RECYCLED_EXIT else restart_delay_s(slot.young_deaths)
        log = logger.info if exitcode == RECYCLED_EXIT else logger.warning
        log(
            "worker process %d (pid %s) exited after %.1f s: %s; restarting it %s",
            slot.index,
            pid,
            lived_s,
            reason,
            "now" if delay_s == 0 else f"in {delay_s:g} s",
        )
        record_restart(_restart_kind(exitcode))
        slot.restart_at = time.monotonic() + delay_s

    def _alive(self) -> int:
        return sum(1 for slot in self.slots if slot.process is not None)

    def _children_pids(self) -> list[int]:
        return [
            slot.process.pid
            for slot in self.slots
            if slot.process is not None and slot.process.pid is not None
        ]

    def _kill_children(self, why: str) -> None:
        for pid in self._children_pids():
            logger.warning("worker process pid %d %s: killing it", pid, why)
            _kill(pid, signal.SIGKILL)

    # -- stopping -----------------------------------------------------------------------

    def _begin_stop(self, signum: int) -> None:
        self._stopping = True
        for slot in self.slots:
            slot.restart_at = None
        grace = self.spec.grace_s
        logger.warning(
            "%s: stopping the worker processes once their active jobs finish%s "
            "(send it again to exit now)",
            signal.Signals(signum).name,
            f" (within {grace:g} s)" if grace is not None else "",
        )
        if grace is not None:
            self._kill_at = time.monotonic() + grace + KILL_MARGIN_S
        for pid in self._children_pids():
            _kill(pid, signal.SIGTERM)

    def _on_signal(self, signum: int, frame: Any = None) -> None:
        """A signal handler: the first signal is handled by the loop (woken through the
        pipe); a second kills the children and exits here, with nothing that could
        take a lock (no logging: it may interrupt a write to the same stream)."""
        if self._signalled is not None:
            for pid in self._children_pids():
                _kill(pid, signal.SIGKILL)
            name = signal.Signals(signum).name
            line = (
                f"{name} again: exiting now; the worker processes are killed and BullMQ's "
                "stalled-job check takes back their active jobs once their locks expire\n"
            )
            try:
                os.write(2, line.encode())
            except OSError:
                pass
            os._exit(128 + signum)
        self._signalled = signum
        self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # the pipe is full (already woken) or closed (done)
            pass

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def _take_signals(self) -> Any:
        if not self._install_signals:
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self._on_signal)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

        return restore


def _restart_kind(exitcode: int | None) -> str:
    """A child's exit as a metric label (a few fixed values)."""
    if exitcode == RECYCLED_EXIT:
        return "recycled"
    if exitcode is not None and exitcode < 0:
        return "signal"
    return "error" if exitcode != STOPPED_EXIT else "stopped"


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
