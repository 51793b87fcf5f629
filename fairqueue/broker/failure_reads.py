"""A queue's recent failures for the console: which tenants' jobs fail, and with what.

Bounded whatever the queue: the last :data:`RECENT_FAILED` jobs of BullMQ's failed set
that failed since a given time (its score is the job's ``finishedOn``), their tenant and
failure message in one pipelined round trip; the error class is read from one stack
trace per distinct message only (:meth:`FailureReads.error_classes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from fairqueue.broker.common import parse_job_data
from fairqueue.broker.connection import BrokerPart
from fairqueue.broker.console_reads import failure_class, sanitize_failure

#: Failures one read looks at, newest first.
RECENT_FAILED: Final = 1_000


@dataclass(frozen=True, slots=True)
class RecentFailure:
    """One failed job: when it failed, its tenant (``None``: none) and its message."""

    job_id: str
    failed_at_ms: int
    tenant: str | None
    #: Sanitized first line (:func:`~fairqueue.broker.console_reads.sanitize_failure`).
    message: str


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class FailureReads(BrokerPart):
    """Reads over BullMQ's failed sets."""

    async def recent(
        self, queue: str, *, since_ms: int, count: int = RECENT_FAILED
    ) -> tuple[list[RecentFailure], bool]:
        """The jobs of ``queue`` that failed since ``since_ms``, newest first, at most
        ``count``; and whether more failed in that time (then the list is the newest)."""
        client = self.conn.client()
        failed_key = self.conn.key(queue, "failed")
        found: list[Any] = await self.conn.guard(
            client.zrevrangebyscore(
                failed_key, "+inf", since_ms, start=0, num=count + 1, withscores=True
            )
        )
        more = len(found) > count
        pairs: list[tuple[str, float]] = [(_text(job_id), float(score)) for job_id, score in found]
        pairs = pairs[:count]
        if not pairs:
            return [], False
        async with client.pipeline(transaction=False) as pipe:
            for job_id, _ in pairs:
                pipe.hmget(self.conn.key(queue, job_id), "data", "failedReason")
            rows = await self.conn.guard(pipe.execute())
        failures = []
        for (job_id, score), (data, reason) in zip(pairs, rows, strict=True):
            parsed = parse_job_data(None if data is None else _text(data))
            tenant = parsed.get("tenantId") if isinstance(parsed, dict) else None
            failures.append(
                RecentFailure(
                    job_id=job_id,
                    failed_at_ms=int(score),
                    tenant=tenant if isinstance(tenant, str) and tenant else None,
                    message=sanitize_failure(None if reason is None else _text(reason)),
                )
            )
        return failures, more

    async def error_classes(self, queue: str, job_ids: list[str]) -> list[str]:
        """The error class of each of ``job_ids`` (``""``: none named), from its message
        or its last stack trace (one pipelined round trip)."""
        if not job_ids:
            return []
        async with self.conn.client().pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hmget(self.conn.key(queue, job_id), "failedReason", "stacktrace")
            rows = await self.conn.guard(pipe.execute())
        return [
            failure_class(
                None if reason is None else _text(reason), None if trace is None else _text(trace)
            )
            for reason, trace in rows
        ]
