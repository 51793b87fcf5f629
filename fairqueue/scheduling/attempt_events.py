"""What the history step reads of BullMQ's events stream about attempts: the entries
(:class:`Event`: starts, ends, re-adds and stalls), what a started job's hash said
(:class:`Start`), and what is remembered of a run between its start and its end
(:class:`Run`, in fq:run); the stream's folding rules (a re-add a ``stalled`` follows is
a lost attempt; a page cut right after a re-add leaves it for the next), and which runs
and fq:state fields a page needs. :mod:`fairqueue.scheduling.attempts` turns a page of
them into what is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from fairqueue.scheduling.levels import LEVELS_BY_RANK
from fairqueue.scheduling.wire import flow_member

#: The level names a start or a run may carry (anything else is an unknown level).
LEVELS: Final = frozenset(level.value for level in LEVELS_BY_RANK)

#: ``stalled`` marks the ``retry`` just before it as ``lost`` (:func:`fold_stalls`); the
#: recorders see ``start``, ``end``, ``retry`` and ``lost``.
EventKind = Literal["start", "end", "retry", "lost", "stalled"]


@dataclass(frozen=True, slots=True)
class Event:
    """A stream entry the recorder reads: an attempt's start, its end, or the re-add
    that ends an attempt which failed with attempts left."""

    kind: EventKind
    job_id: str
    at_ms: int
    #: An ``end``: it completed (``False``: it failed). The usage ledger reads it.
    ok: bool = False


@dataclass(frozen=True, slots=True)
class Start:
    """What a started job's hash said: its level (``None``: unreadable), tenant, ready
    time (ms, Redis's clock), whether this is its first attempt, and what a job placed
    while its flow had nothing measured paid (``fqPaid``: its step in turns times the
    turn's length then, :func:`~fairqueue.scheduling.order.turn_scale`; ``None`` for a
    job placed by its flow's estimate); ``placed``, what a job placed by its flow's
    estimate paid (``fqCost``, the same unit; ``None``: not recorded)."""

    level: str | None
    tenant: str
    ready_ms: int
    first_attempt: bool
    paid: float | None = None
    placed: float | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """A running attempt as remembered between its start and its end: ``cold``, its job
    was placed while its flow had nothing measured (its turns prefixed ``c``)."""

    level: str
    tenant: str
    start_ms: int
    turns: float
    cold: bool = False

    def encode(self) -> str:
        turns = ("c" if self.cold else "") + g6(self.turns)
        return f"{flow_member(self.level, self.tenant)}\n{self.start_ms}\n{turns}"

    @classmethod
    def decode(cls, text: str) -> Run | None:
        head, _, turns = text.rpartition("\n")
        rest, _, start = head.rpartition("\n")
        level, sep, tenant = rest.partition("\n")
        if not sep or level not in LEVELS:
            return None
        cold = turns.startswith("c")
        try:
            start_ms, paid = float(start), float(turns[cold:]) if turns[cold:] else 1.0
        except ValueError:  # not a run this version wrote
            return None
        if not (math.isfinite(start_ms) and math.isfinite(paid)):
            return None
        return cls(level, tenant, int(start_ms), paid, cold)


def fold_stalls(events: Sequence[Event]) -> list[Event]:
    """``events`` with each ``retry`` that a ``stalled`` of its job follows turned into a
    ``lost`` end, and the ``stalled`` markers dropped. BullMQ's stalled-job check writes
    the two entries one after the other in one script, so a page holds both, unless it
    was cut between them: :func:`cut_before_trailing_retry` keeps such a retry for the
    next page."""
    out: list[Event] = []
    retry_at: dict[str, int] = {}  # job id -> index in out of its latest retry
    for event in events:
        if event.kind == "stalled":
            index = retry_at.pop(event.job_id, None)
            if index is not None:
                out[index] = Event("lost", event.job_id, out[index].at_ms)
            continue
        if event.kind == "retry":
            retry_at[event.job_id] = len(out)
        else:
            retry_at.pop(event.job_id, None)
        out.append(event)
    return out


def cut_before_trailing_retry(kinds: Sequence[EventKind | None], *, cut: bool) -> int:
    """How many of a page's entries (their kinds, ``None`` for the others) to record:
    all, unless the page was cut (more entries follow unread) right after a ``retry``,
    whose ``stalled`` may be the next entry; then all but that retry (never none)."""
    if cut and len(kinds) > 1 and kinds[-1] == "retry":
        return len(kinds) - 1
    return len(kinds)


def runs_to_read(events: Iterable[Event]) -> list[str]:
    """The job ids whose remembered run (fq:run) the page needs: those that end before
    the page saw them start."""
    started: set[str] = set()
    wanted: dict[str, None] = {}
    for event in events:
        if event.kind == "start":
            started.add(event.job_id)
        elif event.job_id not in started:
            wanted[event.job_id] = None
    return list(wanted)


def state_fields(starts: Iterable[Start | None], runs: Iterable[Run | None]) -> list[str]:
    """The fq:state fields the page may read with fairness by time."""
    members = {flow_member(s.level, s.tenant) for s in starts if s and s.level}
    members |= {flow_member(r.level, r.tenant) for r in runs if r}
    return ["typ", "unit", *(f"{kind}:{m}" for m in sorted(members) for kind in ("c", "d"))]


def g6(value: float) -> str:
    """A number as the Lua side stores it (``%.6g``)."""
    return f"{value:.6g}"
