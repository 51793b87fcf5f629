"""Expected starts for the dashboard's job and tenant pages: what to show, as frozen
dataclasses (no template here; the pages render them). Each call is one read-only Redis
round trip (:func:`fairqueue.job_status`, :func:`fairqueue.estimate_start`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from fairqueue.enqueue.start_estimates import estimate_start
from fairqueue.enqueue.status import job_status
from fairqueue.scheduling.estimate import StartEstimate


def _when(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def _span(ms: int) -> str:
    seconds = ms / 1000
    if seconds < 1:
        return f"{ms} ms"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe(estimate: StartEstimate) -> str:
    """``in about 12 s (8 s to 20 s, high confidence)``, ``now``, or why there is none."""
    wait = estimate.expected_wait_ms
    if wait is None:
        if estimate.held_reason == "paused":
            return "not while its tenant is paused"
        return "unknown (no service rate measured yet)"
    if wait <= 0:
        return "now"
    text = f"in about {_span(wait)}"
    expected = estimate.expected_start_ms or 0
    low, high = estimate.earliest_start_ms, estimate.latest_start_ms
    if low is not None and high is not None:
        start = expected - wait
        text += f" ({_span(max(0, low - start))} to {_span(max(0, high - start))}"
        text += f", {estimate.confidence} confidence)"
    return text


@dataclass(frozen=True, slots=True)
class ExpectedStart:
    """An estimate as a page shows it: its times as datetimes, its sentence in ``text``;
    ``state``: the job's state on a job page ("" for a tenant's next job)."""

    expected_start: datetime | None
    earliest_start: datetime | None
    latest_start: datetime | None
    expected_wait_ms: int | None
    confidence: str | None
    ahead: int | None
    held_reason: str | None
    share: float | None
    level_share: float | None
    level: str | None
    text: str
    state: str = ""


def _shown(estimate: StartEstimate) -> ExpectedStart:
    return ExpectedStart(
        expected_start=_when(estimate.expected_start_ms),
        earliest_start=_when(estimate.earliest_start_ms),
        latest_start=_when(estimate.latest_start_ms),
        expected_wait_ms=estimate.expected_wait_ms,
        confidence=estimate.confidence,
        ahead=estimate.ahead,
        held_reason=estimate.held_reason,
        share=estimate.share,
        level_share=estimate.level_share,
        level=estimate.level,
        text=describe(estimate),
    )


def job_expected_start(job_type: str, job_id: str) -> ExpectedStart | None:
    """A job page's expected start, with the job's state (``None``: no such job)."""
    status = job_status(job_type, job_id)
    if status is None:
        return None
    shown = replace(_shown(status.estimate), state=status.state)
    if status.state in ("active", "completed", "failed"):
        text = (
            f"started {_when(status.started_ms):%Y-%m-%d %H:%M:%S} UTC"
            if (status.started_ms is not None)
            else status.state
        )
        shown = replace(shown, text=text)
    return shown


def tenant_expected_start(
    job_type: str, tenant_id: str, priority_level: str | None = None
) -> ExpectedStart:
    """A tenant page's "a new job would start ...": where its next job of
    ``priority_level`` (``None``: the level its plan gives it) would be placed now."""
    options: dict[str, Any] = {"tenant_id": tenant_id}
    if priority_level is not None:
        options["priority_level"] = priority_level
    return _shown(estimate_start(job_type, **options))
