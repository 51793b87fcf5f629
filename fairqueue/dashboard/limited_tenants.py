"""The limited tenants of a queue as the dashboard shows them: why each one's jobs
wait, its limits in words, and totals that add up over every tenant, listed or not."""

from __future__ import annotations

from typing import Any, Final

from fairqueue.broker import LimitsStatus, TenantState
from fairqueue.dashboard.wording import format_duration

#: Held jobs the dashboard lists per limited tenant.
HELD_JOBS_SHOWN: Final = 10


def rate_window(ms: int | None) -> str:
    """A rate window for people: ``250 ms``, ``1s``, ``1m 00s``."""
    if ms is None:
        return "?"
    return f"{ms} ms" if ms < 1000 else format_duration(ms)


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
        "tenants": [
            {
                "tenant": state.tenant_id,
                "running": state.running,
                "occupied": state.occupied,
                "held": state.held,
                "max_active": state.limits.max_active,
                "rate": (
                    None
                    if state.limits.rate_max is None
                    else f"{state.limits.rate_max} per {rate_window(state.limits.rate_duration_ms)}"
                ),
                "max_waiting": state.limits.max_waiting,
                "paused": state.limits.paused,
                "why": why_held(state),
                "held_jobs": list(state.held_jobs),
            }
            for state in status.tenants
        ],
    }
