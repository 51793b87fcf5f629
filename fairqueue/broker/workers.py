"""Worker support (fairqueue.worker): the only place a BullMQ Worker is built, so
BullMQ's Job object stays in the broker. Also the demo's support (fairqueue.demo):
finished jobs read and trimmed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from bullmq import Job as BullJob
from bullmq import Worker as BullWorker

from fairqueue.broker.common import _int_or, parse_job_data
from fairqueue.broker.connection import BrokerPart


@dataclass(frozen=True, slots=True)
class ActiveJob:
    """A job a worker took, in fairqueue's terms (see :meth:`Broker.make_worker`).

    ``data`` is the job's payload as enqueued (normally a dict, but other producers may
    enqueue any JSON value); ``attempts_made`` counts the attempts that already failed;
    ``timestamp_ms`` is when it was added and ``processed_on_ms`` when this attempt
    started (ms since the epoch, ``None`` where BullMQ has none).
    """

    job_id: str
    name: str
    data: Any
    attempts_made: int
    timestamp_ms: int | None = None
    processed_on_ms: int | None = None


# -- demo support types -------------------------------------------------------------------

_FINISHED_FIELDS: Final = ("data", "timestamp", "processedOn", "finishedOn")


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A completed job as :meth:`Broker.finished_since` reads it (times in ms since the
    epoch; ``None`` where BullMQ stored nothing)."""

    job_id: str
    data: dict[str, Any] | None
    timestamp_ms: int | None
    processed_on_ms: int | None
    finished_on_ms: int | None

    @property
    def wait_ms(self) -> int | None:
        """How long the job waited before a worker took it."""
        if self.timestamp_ms is None or self.processed_on_ms is None:
            return None
        return max(0, self.processed_on_ms - self.timestamp_ms)


class WorkerSupport(BrokerPart):
    """:class:`Broker`'s worker and demo support (mixed in; uses ``BrokerCore``'s
    plumbing)."""

    # -- worker support (fairqueue.worker) --------------------------------------------
    # The only place a BullMQ Worker is built, so BullMQ's Job object stays in here.

    def make_worker(
        self,
        queue: str,
        processor: Callable[[ActiveJob], Awaitable[Any]],
        *,
        concurrency: int,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> BullWorker:
        """A stock BullMQ worker for ``queue`` under this broker's Redis URL and prefix.

        It is not started: the caller awaits ``worker.run()`` and later
        ``worker.close()``, which stops taking jobs and waits for the active ones. It
        opens its own connections (BullMQ's worker blocks on one of them).

        Args:
            queue: the BullMQ queue name.
            processor: called with each job; an exception it raises fails the job, so
                BullMQ's attempts and backoff apply. What it returns (JSON) is stored
                as the job's return value.
            concurrency: how many jobs this worker runs at once.
            on_error: called with errors BullMQ's loop meets outside a processor
                (e.g. a lost connection), which BullMQ would otherwise drop.
        """

        async def process(job: BullJob, token: str) -> Any:
            return await processor(
                ActiveJob(
                    job_id=str(job.id),
                    name=job.name or "",
                    data=job.data,
                    attempts_made=_int_or(job.attemptsMade, 0) or 0,
                    timestamp_ms=_int_or(job.timestamp, None),
                    processed_on_ms=_int_or(getattr(job, "processedOn", None), None),
                )
            )

        # One server: BullMQ builds its clients from the URL (with its retry policy).
        # Sentinel or Cluster: a client of the worker's own (BullMQ's Python package takes
        # a Redis or RedisCluster instance), which the worker closes with itself.
        connection = (
            self.conn.target.url
            if self.conn.target.kind == "url"
            else self.conn.client_factory(self.conn.target)
        )
        worker = BullWorker(
            queue,
            process,
            {
                "connection": connection,
                "prefix": self.conn.prefix,
                "concurrency": concurrency,
                "autorun": False,
            },
        )
        if on_error is not None:
            worker.on("error", lambda error, *_: on_error(error))
        return worker

    async def count_unfinished(self, queue: str) -> int:
        """Jobs of ``queue`` a worker still has to finish: waiting (in the wait list or
        the prioritized set), delayed (including retries serving their backoff) or
        active.

        Read in one MULTI, so a job moving between those states (a retry going from
        active back to prioritized) is counted exactly once and an idle check cannot
        see a queue empty while it is not.
        """
        async with self.conn.client().pipeline(transaction=True) as pipe:
            pipe.llen(self.conn.key(queue, "wait"))
            pipe.zcard(self.conn.key(queue, "prioritized"))
            pipe.zcard(self.conn.key(queue, "delayed"))
            pipe.llen(self.conn.key(queue, "active"))
            counts = await self.conn.guard(pipe.execute())
        return sum(int(count) for count in counts)

    # -- demo support (fairqueue.demo) ------------------------------------------------
    # The demo's load generator and fairness summary count finished jobs by level and
    # tenant; a long demo trims them so Redis does not fill up with completed jobs.

    async def finished_since(
        self, queue: str, *, since_ms: int, limit: int = 10_000
    ) -> list[FinishedJob]:
        """Completed jobs of ``queue`` that finished at or after ``since_ms``, oldest first
        (at most ``limit``), with the times BullMQ stored for them.

        BullMQ keeps completed jobs in a sorted set scored by ``finishedOn``, so this costs
        O(log n + found) however long the history is.
        """
        return await self.conn.guard(self._finished_since(queue, since_ms, limit))

    async def _finished_since(self, queue: str, since_ms: int, limit: int) -> list[FinishedJob]:
        client = self.conn.client()
        ids = await client.zrangebyscore(
            self.conn.key(queue, "completed"), since_ms, "+inf", start=0, num=limit
        )
        if not ids:
            return []
        async with client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(self.conn.key(queue, job_id), *_FINISHED_FIELDS)
            rows = await pipe.execute()
        return [
            FinishedJob(
                job_id=str(job_id),
                data=parse_job_data(data),
                timestamp_ms=_int_or(timestamp, None),
                processed_on_ms=_int_or(processed, None),
                finished_on_ms=_int_or(finished, None),
            )
            for job_id, (data, timestamp, processed, finished) in zip(ids, rows, strict=True)
            if finished is not None  # trimmed between the two reads
        ]

    async def trim_finished(self, queue: str, *, grace_ms: int, limit: int = 10_000) -> int:
        """Delete up to ``limit`` completed jobs that finished more than ``grace_ms`` ago,
        with BullMQ's own ``clean``; returns how many were deleted."""
        return len(
            await self.conn.guard(self.conn.queue(queue).clean(grace_ms, limit, "completed"))
        )

    async def delete_prefix_keys(self, *, batch: int = 1_000) -> int:
        """Delete every key under this broker's prefix (``prefix:*``), in batches of
        ``batch`` (SCAN, then UNLINK: Redis is never blocked for long). Returns how many
        were deleted. For the demo's own prefix when it stops: never point it at a
        prefix real queues use."""
        return await self.conn.guard(self._delete_prefix_keys(batch))

    async def _delete_prefix_keys(self, batch: int) -> int:
        client = self.conn.client()
        deleted = 0
        keys: list[str] = []
        async for key in client.scan_iter(match=f"{self.conn.prefix}:*", count=batch):
            keys.append(key)
            if len(keys) >= batch:
                deleted += await client.unlink(*keys)
                keys = []
        if keys:
            deleted += await client.unlink(*keys)
        return deleted
