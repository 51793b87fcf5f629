"""One queue's figures as a frozen dataclass: what its section's template, the overview
rows and their attention items read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's figures as its section's template reads them: one field per key of
    :func:`~fairqueue.dashboard.stats.queue_stats` (the JSON endpoint's), the sections
    inside as the JSON has them."""

    job_type: str
    queue: str
    now_ms: int
    read_at: Mapping[str, Any]
    counts: Mapping[str, int]
    waiting_total: int
    paused: bool
    redis_memory: Mapping[str, Any] | None
    max_wait_ms: int
    max_wait: str
    interval_ms: int
    levels: Mapping[str, Any]
    unparsed: Mapping[str, int] | None
    overdue_total: int | None
    overdue_flows: Sequence[Mapping[str, Any]]
    backlog: Mapping[str, Any]
    order: Mapping[str, Any]
    limits: Mapping[str, Any]
    workers: Mapping[str, Any]
    last_pass: Mapping[str, Any] | None
    lock: Mapping[str, Any]
    history: Mapping[str, Any]
    warnings: Sequence[str]
    noisy: Mapping[str, Any]
    failures: Mapping[str, Any]
    outbox: Mapping[str, Any]
    accounts: Sequence[Mapping[str, Any]]

    @classmethod
    def of(cls, stats: Mapping[str, Any]) -> QueueStats:
        """``stats`` (one queue's stats, its links added), every key a field and no other."""
        names = {f.name for f in fields(cls)}
        if set(stats) != names:
            raise ValueError(
                f"stats keys {sorted(set(stats) ^ names)!r} are not allowed or missing: "
                f"expected exactly {sorted(names)}"
            )
        return cls(**stats)
