"""A worker process's liveness: its record in Redis every few seconds (what the
console's worker list shows), and a watch on its supervisor.

A record that stops being refreshed is a dead process (readers drop it after
:data:`STALE_AFTER_S`). A child whose supervisor died (killed with ``-9``, so it could
not stop its children) stops gracefully rather than running on unsupervised: its
parent pid changes when it is re-parented.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Final

from fairqueue.broker import Broker, WorkerProcess

logger = logging.getLogger("fairqueue.worker")

#: How often a process writes its record.
BEAT_INTERVAL_S: Final = 5.0
#: A record older than this is a dead process.
STALE_AFTER_S: Final = 3 * BEAT_INTERVAL_S


class Liveness:
    """Write this process's record for each of ``queues`` until :meth:`stop`.

    Args:
        jobs_done: reads how many jobs the process has finished (shown in the record).
        supervisor_pid: the supervisor's pid for a child (watched: ``on_orphaned`` is
            called once if this process is re-parented), ``None`` for a lone worker.
        slot: the child's slot in its supervisor.
    """

    def __init__(
        self,
        broker: Broker,
        queues: Sequence[str],
        *,
        concurrency: int,
        jobs_done: Callable[[], int],
        on_orphaned: Callable[[], None],
        supervisor_pid: int | None = None,
        slot: int | None = None,
        interval_s: float = BEAT_INTERVAL_S,
    ) -> None:
        self._broker = broker
        self._queues = list(queues)
        self._concurrency = concurrency
        self._jobs_done = jobs_done
        self._on_orphaned = on_orphaned
        self._supervisor_pid = supervisor_pid
        self._slot = slot
        self._interval_s = interval_s
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._started_ms = int(time.time() * 1000)
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop beating and remove the records (a stopped process is not a dead one)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for queue in self._queues:
            try:
                await self._broker.workers.forget(queue, self._host, self._pid)
            except Exception as exc:  # its record ages out instead
                logger.debug("removing the liveness record failed (%s)", type(exc).__name__)

    async def _run(self) -> None:
        orphaned = False
        while True:
            if (
                not orphaned
                and self._supervisor_pid is not None
                and os.getppid() != self._supervisor_pid
            ):
                orphaned = True
                logger.warning("the supervisor (pid %d) is gone: stopping", self._supervisor_pid)
                self._on_orphaned()
            await self._beat()
            await asyncio.sleep(self._interval_s)

    async def _beat(self) -> None:
        record = WorkerProcess(
            host=self._host,
            pid=self._pid,
            supervisor_pid=self._supervisor_pid,
            slot=self._slot,
            concurrency=self._concurrency,
            started_ms=self._started_ms,
            beat_ms=int(time.time() * 1000),
            jobs_done=self._jobs_done(),
        )
        try:
            for queue in self._queues:
                await self._broker.workers.beat(queue, record, stale_after_s=STALE_AFTER_S)
        except Exception as exc:  # a missed beat never stops the worker
            if not self._failing:
                logger.warning("liveness record not written (%s)", type(exc).__name__)
            self._failing = True
            return
        self._failing = False
