"""Reading one job back by id, for the Django tasks backend's ``get_result``: BullMQ's own
state script and the job's hash, in fairqueue's types."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from fairqueue.broker.common import int_or
from fairqueue.broker.connection import BrokerPart, guarded

#: BullMQ's job states (``Queue.getJobState``); ``waiting`` covers the ``wait`` list.
JOB_STATES = frozenset(
    {"waiting", "prioritized", "delayed", "waiting-children", "active", "completed", "failed"}
)


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A job as BullMQ stored it (times in ms since the epoch, ``None`` where unset).

    ``state`` is BullMQ's (``JOB_STATES``); ``return_value`` is the decoded JSON a
    worker returned (``None`` until it completes); ``stacktrace`` holds one traceback
    per failed attempt, oldest first, as BullMQ keeps them; ``processed_by`` is the
    worker name BullMQ records when the worker has one (Node workers with ``name``).
    """

    queue: str
    job_id: str
    name: str
    state: str
    data: Any
    timestamp_ms: int | None
    processed_on_ms: int | None
    finished_on_ms: int | None
    return_value: Any
    failed_reason: str | None
    stacktrace: tuple[str, ...]
    attempts_made: int
    attempts_started: int
    processed_by: str | None


def _json_or(raw: str | None, default: Any) -> Any:
    if raw is None:
        return default
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return default


class ResultReads(BrokerPart):
    """One job read back by id, for the Django tasks backend's ``get_result``."""

    @guarded
    async def find_job(self, queues: Sequence[str], job_id: str) -> StoredJob | None:
        """The job ``job_id`` in the first of ``queues`` that holds it, or ``None``. The
        state is read before the hash, so a job that finishes in between reads as still
        active with its result already there, never as completed without one."""
        queues = list(dict.fromkeys(queues))
        if not queues:
            return None
        client = self.conn.client()
        if len(queues) == 1:
            queue: str | None = queues[0]  # its state says "unknown" if the job is not there
        else:
            async with client.pipeline(transaction=False) as pipe:
                for name in queues:
                    pipe.exists(self.conn.key(name, job_id))
                found = await pipe.execute()
            queue = next((q for q, there in zip(queues, found, strict=True) if there), None)
        if queue is None:
            return None
        if await client.type(self.conn.key(queue, job_id)) not in ("hash", b"hash"):
            return None  # no job, or one of the queue's own keys (a list, a stream...)
        state = await self.conn.queue(queue).getJobState(job_id)
        fields = cast("dict[str, str]", await client.hgetall(self.conn.key(queue, job_id)))
        if not fields:
            return None  # removed between the reads
        stacktrace = _json_or(fields.get("stacktrace"), [])
        return StoredJob(
            queue=queue,
            job_id=job_id,
            name=fields.get("name") or "",
            state=str(state),
            data=_json_or(fields.get("data"), None),
            timestamp_ms=int_or(fields.get("timestamp"), None),
            processed_on_ms=int_or(fields.get("processedOn"), None),
            finished_on_ms=int_or(fields.get("finishedOn"), None),
            return_value=_json_or(fields.get("returnvalue"), None),
            failed_reason=fields.get("failedReason") or None,
            stacktrace=tuple(str(t) for t in stacktrace) if isinstance(stacktrace, list) else (),
            attempts_made=int_or(fields.get("atm") or fields.get("attemptsMade"), 0) or 0,
            attempts_started=int_or(fields.get("ats"), 0) or 0,
            processed_by=fields.get("pb") or None,
        )

    @guarded
    async def stored_payloads(
        self, queue: str, job_ids: Sequence[str]
    ) -> list[tuple[str, str] | None]:
        """Each job's ``(name, data)`` as stored, or ``None`` where ``queue`` has no such
        job: how the outbox relay tells its own job (a retry after a crash) from another
        job that holds the same id. One pipeline, no MULTI."""
        if not job_ids:
            return []
        async with self.conn.client().pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hmget(self.conn.key(queue, job_id), "name", "data")
            rows = await pipe.execute(raise_on_error=False)
        found: list[tuple[str, str] | None] = []
        for row in rows:
            if isinstance(row, Exception) or row[0] is None or row[1] is None:
                found.append(None)  # no job, or a key of another type
            else:
                found.append((str(row[0]), str(row[1])))
        return found
