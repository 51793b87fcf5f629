"""A queue's recent failures for the console: which tenants' jobs fail, and with what.

Bounded whatever the queue: the last :data:`RECENT_FAILED` jobs of BullMQ's failed set
that failed since a given time (its score is the job's ``finishedOn``), their tenant and
failure message in one pipelined round trip; the error class is read from one stack
trace per distinct message only (:meth:`FailureReads.error_classes`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

from fairqueue.broker.common import as_text, tenant_in_data
from fairqueue.broker.connection import BrokerPart

#: Failures one read looks at, newest first.
RECENT_FAILED: Final = 1_000


_MESSAGE_CHARS: Final = 300
#: What a failure message may not show: things that look like secrets or addresses.
_SECRETISH = re.compile(
    r"(?i)(\b[a-z][a-z0-9+.-]*://\S+)|((password|passwd|secret|token|api[_-]?key|"
    r"authorization)\s*[=:]\s*\S+)|(\b[\w.+-]+@[\w-]+\.[\w.-]+\b)"
)


_ERROR_CLASS = re.compile(r"\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout))\b")


def sanitize_failure(message: str | None) -> str:
    """A failure message an operator may read: its first line, without URLs, e-mail
    addresses or ``password=...``-like pairs, cut to 300 characters. Payloads never
    reach here (BullMQ keeps the error's message, not the job's data)."""
    if not message:
        return ""
    first = message.strip().splitlines()[0] if message.strip() else ""
    cleaned = _SECRETISH.sub("[hidden]", first)
    return cleaned if len(cleaned) <= _MESSAGE_CHARS else cleaned[: _MESSAGE_CHARS - 1] + "…"


def failure_class(message: str | None, stacktrace: str | None = None) -> str:
    """The error's class: from the message when it starts with one (``ValueError:
    ...``), else from the stack trace BullMQ keeps (a Python traceback ends with
    ``ValueError: ...``, a Node stack starts with ``Error: ...``); ``""`` when neither
    names one. Only the class name is taken from the trace, never its text."""
    match = _ERROR_CLASS.match(message or "")
    if match:
        return match.group(1)
    try:
        traces = json.loads(stacktrace) if stacktrace else None
    except ValueError:
        return ""
    if not isinstance(traces, list) or not traces or not isinstance(traces[-1], str):
        return ""
    for line in reversed(traces[-1].strip().splitlines()):
        found = _ERROR_CLASS.match(line)
        if found and line[found.end() : found.end() + 1] in (":", ""):
            return found.group(1)
    return ""


@dataclass(frozen=True, slots=True)
class RecentFailure:
    """One failed job: when it failed, its tenant (``None``: none) and its message."""

    job_id: str
    failed_at_ms: int
    tenant: str | None
    #: Sanitized first line (:func:`sanitize_failure`).
    message: str


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
        pairs: list[tuple[str, float]] = [
            (as_text(job_id), float(score)) for job_id, score in found
        ]
        pairs = pairs[:count]
        if not pairs:
            return [], False
        async with client.pipeline(transaction=False) as pipe:
            for job_id, _ in pairs:
                pipe.hmget(self.conn.key(queue, job_id), "data", "failedReason")
            rows = await self.conn.guard(pipe.execute())
        failures = []
        for (job_id, score), (data, reason) in zip(pairs, rows, strict=True):
            failures.append(
                RecentFailure(
                    job_id=job_id,
                    failed_at_ms=int(score),
                    tenant=tenant_in_data(data),
                    message=sanitize_failure(None if reason is None else as_text(reason)),
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
                None if reason is None else as_text(reason),
                None if trace is None else as_text(trace),
            )
            for reason, trace in rows
        ]
