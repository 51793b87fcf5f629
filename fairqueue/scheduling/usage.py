"""The usage ledger's share of one history page: plain data in, plain data out.

The history step already pairs every attempt's start (BullMQ's ``active`` event) with
its end (``completed``, ``failed``, or the re-add of an attempt that failed with attempts
left) on Redis's clock (:mod:`fairqueue.scheduling.attempts`). This module replays the
same page for the ledger, per tenant, job type and UTC day:

* ``a`` attempts started (counted on the day the attempt started), by its worker's
  start: an attempt whose worker died counts here only (``a`` less ``c`` and ``f`` is
  those, and the attempts running);
* ``c`` / ``f`` attempts that completed / failed (a failed attempt with attempts left
  counts as failed), and ``t`` their worker milliseconds (on the day the attempt ended:
  what a tenant consumed today is what ended today);
* ``r`` of the failed attempts, those that had attempts left (BullMQ retried the job):
  ``f`` less ``r`` is the jobs that failed for good;
* ``l`` attempts lost: their worker died (BullMQ's stalled-job check put the job back),
  on the day the check found it; no worker time. The breaker counts them as failures;
* ``w`` total and ``m`` maximum wait in ms of first attempts, ready to start (on the
  day the attempt started); later attempts have no wait, as in the history.

Nothing here talks to Redis: the page's counts ride the history commit
(``lua/history_commit.lua``), so they are written with the page, once or not at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from fairqueue.scheduling.attempt_events import Event, Run, Start

#: The ledger's counters, in the order the loop reads them (field prefixes in Redis).
STATS: Final = ("a", "c", "f", "t", "w", "m", "r", "l")
#: How long a day's counters stay in Redis after its last write (seconds): time for the
#: loop to write them to the database after an outage of up to two days.
DAY_TTL_S: Final = 3 * 86_400
#: The job type of an attempt whose job type could not be read (a shared queue whose
#: job hash was gone).
UNKNOWN_JOB_TYPE: Final = "?"


def day_of(ms: int) -> str:
    """The UTC day a moment (ms) falls in, as ``YYYYMMDD``."""
    return time.strftime("%Y%m%d", time.gmtime(ms / 1000))


def member(day: str, tenant: str, job_type: str) -> str:
    """The ledger's name for one row: day, tenant and job type."""
    return f"{day}\n{tenant}\n{job_type}"


def split_member(text: str) -> tuple[str, str, str] | None:
    """``(day, tenant, job type)`` of :func:`member`'s text, ``None`` if malformed."""
    day, sep, rest = text.partition("\n")
    tenant, sep2, job_type = rest.rpartition("\n")
    if not sep or not sep2 or len(day) != 8 or not day.isdigit():
        return None
    return day, tenant, job_type


@dataclass(frozen=True, slots=True)
class Ledger:
    """What the history step needs to count a queue's usage: the job types configured
    for it (a job's BullMQ name says which, when there are several) and the epoch a
    day's counters get when Redis creates them."""

    job_types: tuple[str, ...]
    epoch: str


@dataclass(slots=True)
class PageUsage:
    """What a page adds to the ledger."""

    #: (day, '<stat>:<tenant>\\n<job type>') -> increment
    increments: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (day, 'm:<tenant>\\n<job type>') -> the page's largest wait
    maxima: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, day: str, stat: str, row: str, n: int) -> None:
        key = (day, f"{stat}:{row}")
        self.increments[key] = self.increments.get(key, 0) + n

    def most(self, day: str, row: str, value: int) -> None:
        key = (day, f"m:{row}")
        if value > self.maxima.get(key, -1):
            self.maxima[key] = value

    def __bool__(self) -> bool:
        return bool(self.increments or self.maxima)


def page_usage(
    events: Sequence[Event],
    starts: Mapping[str, Start | None],
    runs: Mapping[str, Run],
    job_type_of: Callable[[str], str],
) -> PageUsage:
    """The ledger's counts of one page (``events`` in stream order, as the history step
    read it: ``starts`` and ``runs`` are the same mappings it got).

    Args:
        job_type_of: job id -> its job type.

    Each attempt is paired once, as the history pairs it: a second end of the same run is
    ignored, and an end whose start neither this page nor an earlier one recorded (the
    stream was trimmed before the loop read it) is not counted.
    """
    out = PageUsage()
    pending: dict[str, tuple[str, str, int]] = {}
    ended: set[str] = set()
    waited: set[str] = set()  # a job read once per page: its wait counts once
    for event in events:
        if event.kind == "start":
            start = starts.get(event.job_id)
            if start is None or start.level is None:
                continue
            job_type = job_type_of(event.job_id)
            row = f"{start.tenant}\n{job_type}"
            day = day_of(event.at_ms)
            out.add(day, "a", row, 1)
            pending[event.job_id] = (start.tenant, job_type, event.at_ms)
            ended.discard(event.job_id)
            if start.first_attempt and event.job_id not in waited:
                waited.add(event.job_id)
                wait = max(0, event.at_ms - min(start.ready_ms, event.at_ms))
                out.add(day, "w", row, wait)
                out.most(day, row, wait)
            continue
        if event.kind == "stalled":
            continue
        found = pending.pop(event.job_id, None)
        if found is None and event.job_id not in ended:
            run = runs.get(event.job_id)
            if run is not None:
                found = (run.tenant, job_type_of(event.job_id), run.start_ms)
        if found is None:
            continue
        ended.add(event.job_id)
        tenant, job_type, start_ms = found
        row = f"{tenant}\n{job_type}"
        day = day_of(event.at_ms)
        if event.kind == "lost":  # its worker died: started, lost, no outcome, no time
            out.add(day, "l", row, 1)
            continue
        out.add(day, "c" if event.kind == "end" and event.ok else "f", row, 1)
        if event.kind == "retry":
            out.add(day, "r", row, 1)
        out.add(day, "t", row, max(0, event.at_ms - start_ms))
    return out


@dataclass(frozen=True, slots=True)
class UsageValues:
    """One ledger row's cumulative counters as Redis holds them (one epoch)."""

    attempts: int = 0
    completed: int = 0
    failed: int = 0
    worker_ms: int = 0
    wait_ms_total: int = 0
    wait_ms_max: int = 0
    #: Of ``failed``, the attempts that had attempts left (a row written before this
    #: counter existed reads 0: its failures count as the jobs' last).
    retried: int = 0
    #: Attempts lost: their worker died (a row written before this counter existed
    #: reads 0).
    lost: int = 0

    def as_list(self) -> list[int]:
        return [
            self.attempts,
            self.completed,
            self.failed,
            self.worker_ms,
            self.wait_ms_total,
            self.wait_ms_max,
            self.retried,
            self.lost,
        ]

    @classmethod
    def from_list(cls, values: Sequence[object]) -> UsageValues:
        numbers = [_whole(v) for v in values][: len(STATS)]
        numbers += [0] * (len(STATS) - len(numbers))
        return cls(*numbers)

    def merged(self, other: UsageValues) -> UsageValues:
        """The larger of each counter: counters of one epoch only grow, so merging an
        older read (a loop that wrote after a newer one, or a Redis restored from an
        older snapshot) never lowers a row, and merging twice changes nothing."""
        return UsageValues(
            *(max(a, b) for a, b in zip(self.as_list(), other.as_list(), strict=True))
        )


def total(segments: Mapping[str, Sequence[object]]) -> UsageValues:
    """A row's totals over its epochs (each a Redis lifetime of the day's counters):
    sums, and the largest of the maxima."""
    rows = [UsageValues.from_list(values) for values in segments.values()]
    if not rows:
        return UsageValues()
    sums = [sum(column) for column in zip(*(row.as_list() for row in rows), strict=True)]
    sums[5] = max(row.wait_ms_max for row in rows)
    return UsageValues(*sums)


def _whole(value: object) -> int:
    if isinstance(value, bytes):
        value = value.decode()
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0
    return max(0, number)
