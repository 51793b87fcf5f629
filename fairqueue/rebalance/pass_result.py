"""What one rebalance pass did (:class:`PassResult`, counts only) and how its script
calls are timed (:class:`Timed`); the dashboard reads the record a pass leaves."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Final, TypeVar

T = TypeVar("T")

#: What a pass did, as counts: recorded for the dashboard, which shows them.
PASS_COUNTS: Final = ("adopted", "recovered", "aged", "parked", "overdue", "cleaned", "rebased")
LAST_RUN_RECORD: Final = "last_pass"


@dataclass(slots=True)
class PassResult:
    """What one pass did. Counts only: no payloads, no tenant ids."""

    job_type: str
    queue: str
    adopted: int = 0
    #: Stalled jobs (their worker died) recovered into the fair order.
    recovered: int = 0
    aged: int = 0
    parked: int = 0
    overdue: int = 0
    cleaned: int = 0
    rebased: int = 0
    #: Held jobs released (their tenant got room), and jobs still held after the pass.
    released: int = 0
    held: int = 0
    #: Started jobs recorded in the history, those of unknown level (their hash was
    #: gone), and milliseconds of the events stream trimmed before the pass read them.
    recorded: int = 0
    unrecorded: int = 0
    history_gap_ms: int = 0
    #: Overdue jobs found waiting, per level name (the checked part of the count).
    overdue_by_level: dict[str, int] = field(default_factory=dict)
    #: Level name -> (worker milliseconds of the attempts seen finishing, restarts of jobs
    #: that had run before), from BullMQ's events stream.
    served: dict[str, tuple[int, int]] = field(default_factory=dict)
    script_calls: int = 0
    #: The slowest script call of the pass, as this host timed it (round trip included).
    worst_script_ms: float = 0.0
    duration_ms: float = 0.0
    dry_run: bool = False
    #: Another rebalancer holds the queue's lock: this pass stopped writing.
    lock_lost: bool = False

    def record(self, at_ms: int, rebalancer: str | None) -> dict[str, object]:
        """The status record the dashboard shows (counts only)."""
        return {
            **{name: getattr(self, name) for name in PASS_COUNTS},
            "overdue_by_level": self.overdue_by_level,
            "recorded": self.recorded,
            "unrecorded": self.unrecorded,
            "history_gap_ms": self.history_gap_ms,
            "script_calls": self.script_calls,
            "worst_script_ms": round(self.worst_script_ms, 2),
            "duration_ms": self.duration_ms,
            "job_type": self.job_type,
            "at_ms": at_ms,
            "by": rebalancer or "",
        }

    def summary(self) -> str:
        counts = " ".join(f"{name}={getattr(self, name)}" for name in PASS_COUNTS)
        notes = " (dry run)" if self.dry_run else ""
        notes += " (lock held by another rebalancer: stopped)" if self.lock_lost else ""
        return (
            f"{self.job_type}: {counts} worst_script={self.worst_script_ms:.1f}ms "
            f"duration={self.duration_ms:.1f}ms{notes}"
        )


class Timed:
    """Counts a pass's script calls and keeps the slowest."""

    def __init__(self, result: PassResult) -> None:
        self.result = result

    async def __call__(self, call: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await call
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            self.result.script_calls += 1
            self.result.worst_script_ms = max(self.result.worst_script_ms, elapsed)
