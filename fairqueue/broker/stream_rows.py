"""What BullMQ's events stream entries and started jobs' hashes say, read leniently.

Split from :mod:`fairqueue.broker.events` (which reads a page and writes it): these are
pure functions of the bytes Redis returns, tested without Redis. A job another producer
wrote oddly must never stop the history, so every reader here returns ``None`` or a
default instead of raising.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from fairqueue.scheduling.attempt_events import LEVELS, Event, EventKind, Start
from fairqueue.scheduling.levels import INTERNAL_TENANT

#: The job hash fields a start needs (BullMQ's names).
START_FIELDS = ("timestamp", "delay", "ats", "opts", "data", "fqPaid", "fqCost")
_END_EVENTS = {b"completed", b"failed"}
_READD_EVENTS = {b"waiting", b"delayed"}
_WANTED = {b"active", *_END_EVENTS, *_READD_EVENTS, b"stalled"}
#: fairqueue's own jobs, read without decoding: the producer writes the level and the
#: tenant first in the data, the add script a whole fqReady in the opts.
_FAST_META = re.compile(rb'\{"priorityLevel":"([a-z]+)","tenantId":"([^"\\]+)"[,}]')
_FAST_READY = re.compile(rb'[{,]"fqReady":(\d+)[,}]')
#: The expected start an enqueue with ``estimate=True`` kept in the job's opts.
FAST_ETA = re.compile(rb'[{,]"fqEta":(\d+)[,}]')


def text_of(raw: bytes) -> str:
    """Bytes from Redis as text, losslessly (written back as the same bytes)."""
    return raw.decode("utf-8", "surrogateescape")


def raw_of(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def number_of(value: Any) -> float | None:
    """A number as Lua's ``tonumber`` reads it (a JSON number or numeric text); ``None``
    for anything else, infinities and NaN included: a job another producer wrote oddly
    must never stop the history (its cursor would not move past it)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str | bytes):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, int | float) and math.isfinite(value):
        return value
    return None


def _level_of_priority(priority: Any) -> str:
    """The level a producer's numeric priority stands for (``levels.normalize_priority``,
    read leniently: a job from another producer never fails the page)."""
    p = number_of(priority) or 0
    if p == 1:
        return "critical"
    if p in (2, 3):
        return "high"
    if p >= 6:
        return "low"
    return "normal"


def parse_start(row: list[bytes | None], max_data_bytes: int) -> Start | None:
    """What a started job's hash (``START_FIELDS``) says; ``None`` when it is gone or
    its data is over ``max_data_bytes`` (an unknown level)."""
    timestamp, delay, ats, opts_raw, data_raw = row[:5]
    paid = number_of(row[5]) if len(row) > 5 and row[5] is not None else None
    placed = number_of(row[6]) if len(row) > 6 and row[6] is not None else None
    size = len(data_raw) if data_raw else 0
    if timestamp is None or size > max_data_bytes:
        return None
    fast = _FAST_META.match(data_raw or b"")
    ready_text = _FAST_READY.search(opts_raw or b"") if fast else None
    if fast and ready_text and fast.group(1).decode() in LEVELS:
        return Start(
            level=fast.group(1).decode(),
            tenant=fast.group(2).decode("utf-8", "replace"),
            ready_ms=int(ready_text.group(1)),
            first_attempt=(number_of(ats) or 1) <= 1,
            paid=paid,
            placed=placed,
        )
    try:
        opts = json.loads(opts_raw or b"{}")
    except (ValueError, RecursionError):
        opts = None
    if not isinstance(opts, dict):
        opts = {}
    try:
        data = json.loads(data_raw or b"")
    except (ValueError, RecursionError):
        data = None
    level: str | None = None
    tenant = "default"
    if isinstance(data, list):
        data = {}  # a JSON array: no fairqueue metadata, the level of its priority
    if isinstance(data, dict):
        named, tid = data.get("priorityLevel"), data.get("tenantId")
        if named is None:
            level = _level_of_priority(opts.get("priority", 0))
        elif isinstance(named, str) and named in LEVELS:
            level = named
        if isinstance(tid, str) and tid != "":
            tenant = tid.encode("utf-8", "replace").decode("utf-8")
        elif tid is None and "tenantId" in data:  # an internal job: JSON null
            tenant = INTERNAL_TENANT
        elif tid is not None:
            level = None  # unreadable fairqueue metadata, as the dashboard's '?'
    ready = number_of(opts.get("fqReady"))
    if ready is None:
        ready = (number_of(timestamp) or 0) + (number_of(delay) or 0)
        if not math.isfinite(ready):  # two finite numbers whose sum overflows
            return None
    return Start(
        level=level,
        tenant=tenant,
        ready_ms=int(ready),
        first_attempt=(number_of(ats) or 1) <= 1,
        paid=paid,
        placed=placed,
    )


def ms_of(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0])


def parse_event(entry_id: bytes, fields: list[bytes]) -> Event | None:
    """The attempt a stream entry (its fields as Redis sends them: name, value, ...)
    starts or ends; ``None`` for the others ('added', 'drained', progress...)."""
    if fields and fields[0] == b"event" and fields[1] not in _WANTED:
        return None  # BullMQ writes the event's name first: most entries end here
    event = job_id = prev = None
    for i in range(0, len(fields) - 1, 2):
        name = fields[i]
        if name == b"event":
            event = fields[i + 1]
        elif name == b"jobId":
            job_id = fields[i + 1]
        elif name == b"prev":
            prev = fields[i + 1]
    if job_id is None:
        return None
    kind: EventKind
    if event == b"active":
        kind = "start"
    elif event in _END_EVENTS:
        kind = "end"
    elif (event in _READD_EVENTS and prev == b"active") or (event == b"delayed" and prev is None):
        # An attempt that failed with attempts left, at once or backed off (BullMQ's
        # backoff writes 'delayed' with no 'prev'; so does adding a delayed job, whose
        # id has no run: the recorders ignore an end without one).
        kind = "retry"
    elif event == b"stalled":
        kind = "stalled"  # its worker died: the re-add just before it was no retry
    else:
        return None
    return Event(kind, text_of(job_id), ms_of(entry_id), event == b"completed")
