"""The limited tenants of a queue as the dashboard shows them: why each one's jobs
wait, its limits in words, and totals that add up over every tenant, listed or not."""

from __future__ import annotations

from typing import Any, Final

from fairqueue.broker import LimitsStatus, TenantState
from fairqueue.dashboard.wording import format_duration
from fairqueue.scheduling.limits import LIMIT_FIELDS, LIMITS, TenantLimits

#: Held jobs the dashboard lists per limited tenant.
HELD_JOBS_SHOWN: Final = 10


def rate_window(ms: int | None) -> str:
    """A rate window for people: ``250 ms``, ``1s``, ``1m 00s``."""
    if ms is None:
        return "?"
    return f"{ms} ms" if ms < 1000 else format_duration(ms)


def limits_in_words(limits: TenantLimits) -> tuple[tuple[str, str], ...]:
    """``(label, value)`` of each limit with a label in ``LIMITS`` (``"—"``: none): what
    the console's pages show, a new limit included; the rate with its window."""
    shown = []
    for name, field in LIMITS.items():
        value = getattr(limits, name)
        if not field.label:
            continue
        if value is None:
            shown.append((field.label, "—"))
        elif name == "rate_max":
            shown.append((field.label, f"{value} per {rate_window(limits.rate_duration_ms)}"))
        else:
            shown.append((field.label, str(value)))
    return tuple(shown)


def why_held(state: TenantState) -> str:
    """Why a limited tenant's held jobs wait: the limit it bears (its own, not the queue's
    overload: a held job is not overdue against the bound while its tenant is at it)."""
    limits = state.limits
    if not state.held:
        return "nothing held"
    if limits.paused:
        return "paused"
    if state.catching_up:
        return "resumed: its backlog drains a few jobs at a time, with the slots others leave"
    if limits.max_active is not None and state.occupied >= limits.max_active:
        # A released job holds its slot from its release, before a worker takes it.
        started = f"{state.running} running"
        if state.occupied > state.running:
            started += f", {state.occupied - state.running} released and not taken by a worker yet"
        return f"at its limit of {limits.max_active} at once ({started})"
    if limits.rate_max is not None:
        return f"at its rate limit ({limits.rate_max} per {rate_window(limits.rate_duration_ms)})"
    return "released at the loop's next step"


def limits_section(status: LimitsStatus) -> dict[str, Any]:
    """The limited tenants of a queue (running, held, their limits, why they wait, their
    first held jobs in release order): at most ``STATUS_TENANTS`` listed, with totals
    over all of them that add up (the held total is what the listed tenants hold plus
    ``held_not_listed``)."""
    return {
        "held_total": status.held_total,
        "holding": status.holding,
        "limited": status.limited,
        "paused": status.paused,
        "listed": len(status.tenants),
        "held_not_listed": status.held_not_listed,
        "holding_not_listed": status.holding_not_listed,
        "labels": [field.label for field in LIMITS.values() if field.label],
        "tenants": [
            {
                "tenant": state.tenant_id,
                "running": state.running,
                "occupied": state.occupied,
                "held": state.held,
                **{name: getattr(state.limits, name) for name in LIMIT_FIELDS},
                "limits": limits_in_words(state.limits),
                "paused": state.limits.paused,
                "why": why_held(state),
                "held_jobs": list(state.held_jobs),
            }
            for state in status.tenants
        ],
    }
