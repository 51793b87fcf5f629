"""The words the operator's pages use for fairqueue's internal names.

The JSON keeps the machine names (``decision: "aged"``, a pass's ``wrote`` counts); the
pages show these phrases instead, so an operator reads "its fair turn" or "placed 3 jobs
that arrived outside the fair order", never a counter's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from fairqueue.scheduling.order import AGED, WEIGHTED_FAIR

#: What a row of the waiting order says about why a job stands where it does.
DECISION_WORDS: Final[Mapping[str, str]] = {
    WEIGHTED_FAIR: "its flow's fair turn",
    AGED: "its flow's fair turn, past the wait bound",
    "skipped": "unreadable metadata: placed as a normal job",
}

#: A tenant-less job (an internal job, another producer's job) is not a tenant's.
NO_TENANT: Final = "(no tenant)"

#: One phrase per count of a pass record, in the order a pass does the work.
_PASS_WORDS: Final[tuple[tuple[str, str], ...]] = (
    ("adopted", "placed {n} job(s) that arrived outside the fair order"),
    ("aged", "{n} of them already past the wait bound"),
    ("parked", "{n} left for the next pass (no room in the order yet)"),
    ("recovered", "recovered {n} stalled job(s) whose worker died"),
    ("overdue", "counted {n} job(s) waiting past the bound"),
    ("cleaned", "forgot {n} finished job(s) in its index"),
    ("rebased", "renumbered {n} place(s) ahead of the priority cap"),
)


def decision_words(decision: str) -> str:
    """The operator's phrase for a waiting-order decision."""
    return DECISION_WORDS.get(decision, decision)


def tenant_words(tenant_id: str | None) -> str:
    """A tenant id as the pages show it: ``None`` (a job without a tenant) in words."""
    return NO_TENANT if tenant_id is None else tenant_id


def pass_words(wrote: Mapping[str, int]) -> str:
    """What a pass did, in words, leaving out what it did not do."""
    parts = [template.format(n=wrote[name]) for name, template in _PASS_WORDS if wrote.get(name)]
    return "; ".join(parts) if parts else "nothing needed doing"


def format_duration(ms: float | None) -> str:
    """A short human duration: ``45s``, ``3m 05s``, ``2h 03m``, ``4d 01h``."""
    if ms is None:
        return "—"
    seconds = max(0, int(ms // 1000))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def format_time(ms: int | None) -> str:
    """A UTC wall-clock time for an epoch-ms value."""
    if ms is None:
        return "—"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
