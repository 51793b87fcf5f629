"""Worker support (fairqueue.worker): the only place a BullMQ Worker is built, so
BullMQ's Job object stays in the broker, the idle check of a burst worker, and the
worker processes' liveness records.

Liveness: each worker process (one per ``--processes`` child) writes a record into
``<prefix>:<queue>:fq:procs`` (a hash: ``host:pid`` -> JSON) for every queue it serves,
every few seconds. A record not refreshed within its ``stale_after_s`` is a dead
process: readers skip it and delete it, so the hash holds at most the live processes
plus those that died since the last read (bounded by the processes, not by jobs or
tenants). The hash expires too, so a prefix no worker uses again leaves nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

from bullmq import Job as BullJob
from bullmq import Worker as BullWorker

from fairqueue.broker.chaining import ChainingWorker
from fairqueue.broker.common import int_or
from fairqueue.broker.connection import BrokerPart

#: The liveness hash's suffix beside a queue's keys.
PROCESSES_SUFFIX: Final = "procs"


@dataclass(frozen=True, slots=True)
class WorkerProcess:
    """A live worker process as its last liveness record describes it (no tenant ids,
    no payloads: what an operator needs to tell processes apart and see them work)."""

    host: str
    pid: int
    #: The supervisor's pid (``None``: a worker started without ``--processes``).
    supervisor_pid: int | None
    #: Which of the supervisor's slots it fills (0-based; ``None`` without a supervisor).
    slot: int | None
    concurrency: int
    started_ms: int
    beat_ms: int
    jobs_done: int


@dataclass(slots=True)
class ActiveJob:
    """A job a worker took, in fairqueue's terms (see :meth:`WorkerSupport.make_worker`).

    ``data`` is the job's payload as enqueued (normally a dict, but other producers may
    enqueue any JSON value); ``attempts_made`` counts the attempts that already failed;
    ``timestamp_ms`` is when it was added and ``processed_on_ms`` when this attempt
    started (ms since the epoch, ``None`` where BullMQ has none).

    Not frozen: one is built for every job, and a frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field) costs several times a plain one's. Nothing keeps
    or hashes it past its job.
    """

    job_id: str
    name: str
    data: Any
    attempts_made: int
    timestamp_ms: int | None = None
    processed_on_ms: int | None = None


def limited_tenant(job: Any) -> str | None:
    """The tenant of a BullMQ job the add script held (``fqLim`` in its opts), else
    ``None``: only limited tenants' jobs cost the worker a release call."""
    opts = getattr(job, "opts", None) or {}
    data = getattr(job, "data", None)
    if not opts.get("fqLim") or not isinstance(data, dict) or data.get("tenantId") is None:
        return None
    return str(data["tenantId"])


class WorkerSupport(BrokerPart):
    """What a worker needs of the broker: a stock BullMQ worker built under this broker's
    Redis and prefix, and the idle check of a burst worker."""

    def make_worker(
        self,
        queue: str,
        processor: Callable[[ActiveJob], Awaitable[Any]],
        *,
        concurrency: int,
        on_error: Callable[[BaseException], None] | None = None,
        on_finished: Callable[[str], None] | None = None,
    ) -> BullWorker:
        """A BullMQ worker for ``queue`` under this broker's Redis URL and prefix: BullMQ's
        own, whose completions fetch the slot's next job (:mod:`.chaining`).

        It is not started: the caller awaits ``worker.run()`` and later
        ``worker.close()``, which stops taking jobs and waits for the active ones. It
        opens its own connections (BullMQ's worker blocks on one of them).

        Args:
            queue: the BullMQ queue name.
            processor: called with each job; an exception it raises fails the job, so
                BullMQ's attempts and backoff apply. What it returns (JSON) is stored
                as the job's return value.
            concurrency: how many jobs this worker runs at once.
            on_finished: called with the tenant of a finished job that its tenant's
                limits held (after BullMQ moved it to completed or failed, so its slot
                is free): the caller releases that tenant's next held job at once.
            on_error: called with errors BullMQ's loop meets outside a processor
                (e.g. a lost connection), which BullMQ would otherwise drop.
        """

        def process(job: BullJob, token: str) -> Awaitable[Any]:
            # Not a coroutine itself: BullMQ awaits what it returns, the processor's
            # coroutine (one coroutine less per job). Job.fromJSON gives ints; int_or
            # is for anything else.
            attempts, added = job.attemptsMade, job.timestamp
            started = getattr(job, "processedOn", None)
            return processor(
                ActiveJob(
                    str(job.id),
                    job.name or "",
                    job.data,
                    attempts if type(attempts) is int else int_or(attempts, 0),
                    added if type(added) is int else int_or(added, None),
                    started if type(started) is int else int_or(started, None),
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
        worker = ChainingWorker(
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
        if on_finished is not None:

            def finished(job: Any, *_: Any) -> None:
                tenant = limited_tenant(job)
                if tenant is not None:
                    on_finished(tenant)

            worker.on("completed", finished)
            worker.on("failed", finished)
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

    # -- liveness of worker processes -------------------------------------------------

    async def beat(self, queue: str, process: WorkerProcess, *, stale_after_s: float) -> None:
        """Write ``process``'s liveness record for ``queue`` (one HSET and one EXPIRE)."""
        key = self.conn.fair_key(queue, PROCESSES_SUFFIX)
        record = json.dumps({**asdict(process), "stale_after_ms": int(stale_after_s * 1000)})
        async with self.conn.client().pipeline(transaction=True) as pipe:
            pipe.hset(key, f"{process.host}:{process.pid}", record)
            pipe.expire(key, max(1, int(stale_after_s * 4)))
            await self.conn.guard(pipe.execute())

    async def forget(self, queue: str, host: str, pid: int) -> None:
        """Remove a process's record (it stopped; a dead one ages out instead)."""
        await self.conn.guard(
            self.conn.client().hdel(self.conn.fair_key(queue, PROCESSES_SUFFIX), f"{host}:{pid}")
        )

    async def processes(self, queue: str, *, now_ms: int | None = None) -> list[WorkerProcess]:
        """The live worker processes of ``queue``, by host, supervisor and slot; records
        past their ``stale_after_ms`` are deleted on the way."""
        key = self.conn.fair_key(queue, PROCESSES_SUFFIX)
        raw: Mapping[Any, Any] = await self.conn.guard(self.conn.client().hgetall(key))
        now = int(time.time() * 1000) if now_ms is None else now_ms
        live: list[WorkerProcess] = []
        stale: list[Any] = []
        for member, value in raw.items():
            process = _parse_process(value)
            if process is None or now - process[0].beat_ms > process[1]:
                stale.append(member)
            else:
                live.append(process[0])
        if stale:
            await self.conn.guard(self.conn.client().hdel(key, *stale))
        return sorted(live, key=lambda p: (p.host, p.supervisor_pid or p.pid, p.slot or 0, p.pid))


def _parse_process(value: Any) -> tuple[WorkerProcess, int] | None:
    """A liveness record and its staleness bound, or ``None`` for one that is not ours."""
    try:
        record = json.loads(value)
        return (
            WorkerProcess(
                host=str(record["host"]),
                pid=int(record["pid"]),
                supervisor_pid=int_or(record.get("supervisor_pid"), None),
                slot=int_or(record.get("slot"), None),
                concurrency=int(record["concurrency"]),
                started_ms=int(record["started_ms"]),
                beat_ms=int(record["beat_ms"]),
                jobs_done=int(record["jobs_done"]),
            ),
            int(record["stale_after_ms"]),
        )
    except (ValueError, TypeError, KeyError):
        return None
