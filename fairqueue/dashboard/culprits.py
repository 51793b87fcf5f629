"""What a tenant does to a queue and what the queue does to it, in sentences an on-call
operator acts on: its jobs past the bound (and whether they are the only ones), whether
it runs over its share, its wait p99 against the bound, what holds it (a pause, its
limits, a quota, the breaker), whether its attempts fail, each with the action that
helps. Built from the figures the pages already show (the backlog scan, the noisy
figures, its wait histogram, its held jobs), so a sentence never disagrees with the
numbers beside it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Final

from fairqueue.broker import BacklogScan, Broker
from fairqueue.dashboard.wording import format_duration, tenant_words

#: Flows (level, tenant) the queue's page lists by their jobs past the bound, at most.
OVERDUE_FLOWS: Final = 20
RED: Final = "red"
AMBER: Final = "amber"
OK: Final = "ok"
#: The actions a finding may point to (the tenant page's action links, by name).
PAUSE, RESUME, LIMITS, RETRY, FAILURES = "pause", "resume", "limits", "retry", "failures"
ACTION_WORDS: Final = {
    PAUSE: "Pause it…",
    RESUME: "Resume it…",
    LIMITS: "Change its weight and limits…",
    RETRY: "Retry its failed jobs…",
    FAILURES: "See its failures",
}


def overdue_flows(scan: BacklogScan | None) -> list[dict[str, Any]]:
    """The flows with waiting jobs past the bound, the most first: where an overdue
    count comes from (the scan that counts it, so they add up to each level's)."""
    if scan is None:
        return []
    flows = [
        (count, level, tenant)
        for level, by_tenant in scan.tenant_overdue.items()
        for tenant, count in by_tenant.items()
    ]
    top = heapq.nsmallest(OVERDUE_FLOWS, flows, key=lambda f: (-f[0], f[1], f[2]))
    return [
        {
            "level": level,
            "tenant": tenant or None,
            "display": tenant_words(tenant or None),
            "overdue": count,
            "waiting": scan.tenants.get(level, {}).get(tenant, 0),
        }
        for count, level, tenant in top
    ]


@dataclass(frozen=True, slots=True)
class Finding:
    """One sentence of the tenant's verdict in a queue, and the action that helps."""

    severity: str
    #: A short name tests and the page's markup key on (overdue, noisy, p99, held...).
    kind: str
    text: str
    action: str = ""

    @property
    def action_words(self) -> str:
        return ACTION_WORDS.get(self.action, "")


@dataclass(frozen=True, slots=True)
class TenantFacts:
    """The figures of one tenant in one queue a verdict is made of."""

    overdue: int | None
    queue_overdue: int | None
    waiting: int | None
    max_wait_ms: int
    p99_ms: float | None
    p99_minutes: int
    noisy: dict[str, Any] | None
    paused: bool
    held: int
    running: int
    max_active: int | None
    rate: str | None
    holds: tuple[tuple[str, str], ...]
    failing: dict[str, Any] | None


def verdict(facts: TenantFacts) -> tuple[Finding, ...]:
    """What the tenant does to the queue and the queue to it, the most urgent first."""
    found: list[Finding] = []
    bound = format_duration(facts.max_wait_ms)
    if facts.overdue:
        text = (
            f"{facts.overdue} of its waiting jobs are past the {bound} bound, of the "
            f"queue's {facts.queue_overdue} overdue"
        )
        if facts.overdue == facts.queue_overdue:
            text += ": only its own jobs wait past the bound, no other tenant's"
        found.append(Finding(RED, "overdue", text + ".", PAUSE if facts.noisy else LIMITS))
    if facts.noisy:
        n = facts.noisy
        found.append(
            Finding(
                RED,
                "noisy",
                f"It is over its share in {n['level']}: {n['running']} of the level's "
                f"{n['level_running']} running jobs ({n['share']}) against its entitlement now of "
                f"{n['entitled']}, {n['factor']} times it, while others of its level wait.",
                LIMITS,
            )
        )
    if facts.p99_ms is not None:
        over = facts.p99_ms > facts.max_wait_ms
        text = (
            f"Its wait p99 over the last {facts.p99_minutes} min is "
            f"{format_duration(facts.p99_ms)}, {'over' if over else 'within'} the {bound} bound."
        )
        found.append(Finding(RED if over else OK, "p99", text))
    found += _holds(facts)
    if facts.failing:
        failed, attempts = facts.failing["failed"], facts.failing["attempts"]
        found.append(
            Finding(
                RED,
                "failing",
                f"Its jobs fail: {failed} failed in the last {facts.p99_minutes} min, of "
                f"{attempts} attempts it started ({100 * failed / attempts:.0f}%).",
                RETRY,
            )
        )
    if not any(f.severity != OK for f in found):
        if facts.waiting:
            text = f"Nothing holds it: its {facts.waiting} waiting job(s) take their fair turns."
        else:
            text = "It has no job waiting or held here."
        found.append(Finding(OK, "fine", text))
    order = {RED: 0, AMBER: 1, OK: 2}
    return tuple(sorted(found, key=lambda f: order[f.severity]))


def _holds(facts: TenantFacts) -> list[Finding]:
    """What holds its jobs: its pause, its limits, a quota or the breaker."""
    found = []
    if facts.paused:
        found.append(
            Finding(
                AMBER,
                "paused",
                (
                    f"It is paused: {facts.held} job(s) held; none starts until it is resumed."
                    if facts.held
                    else "It is paused: none of its jobs starts here until it is resumed."
                ),
                RESUME,
            )
        )
    elif facts.held:
        # Held and not paused: its own limits hold it (a held job is not the queue's).
        bounds = []
        if facts.max_active is not None:
            bounds.append(f"{facts.max_active} at once ({facts.running} running)")
        if facts.rate:
            bounds.append(f"a rate of {facts.rate}")
        found.append(
            Finding(
                AMBER,
                "limited",
                f"Its own limits hold {facts.held} job(s): "
                f"{' and '.join(bounds) or 'its limits'}; their wait is its limits', not the "
                "queue's.",
                LIMITS,
            )
        )
    for reason, text in facts.holds:
        found.append(Finding(AMBER, reason, text))
    return found


def held_level_notes(
    levels: dict[str, dict[str, Any]],
    waiting: dict[str, int | None],
    held_by_level: dict[str, int],
) -> dict[str, str]:
    """Per level that looks starved in the history (served under half its entitlement,
    or its p99 over the bound) while none of its jobs waits in line now and its tenants'
    limits hold some: that its own limits hold it, not the other levels."""
    notes = {}
    for level, data in levels.items():
        held = held_by_level.get(level, 0)
        if not held or waiting.get(level):
            continue
        share, entitled = data.get("share"), data.get("entitled_share")
        starved = (share is not None and entitled and share < entitled / 2) or bool(
            data.get("p99_over")
        )
        if starved:
            notes[level] = (
                f"{level} is not starved: none of its jobs waits in line now, and its "
                f"tenants' own limits or pauses hold {held} of its jobs (the limited tenants "
                "below); their wait is their limits', not the other levels'."
            )
    return notes


async def note_held_levels(broker: Broker, stats: dict[str, Any]) -> None:
    """Says in the history which starved-looking levels its own limits hold: the level
    of each listed limited tenant's next held job (one HMGET), its held jobs counted
    there."""
    tenants = [t for t in stats["limits"]["tenants"] if t["held"] and t["held_jobs"]]
    levels_of = await broker.console.held_levels(
        stats["queue"], [t["held_jobs"][0] for t in tenants]
    )
    held_by_level: dict[str, int] = {}
    for tenant in tenants:
        level = levels_of.get(tenant["held_jobs"][0])
        if level is not None:
            held_by_level[level] = held_by_level.get(level, 0) + tenant["held"]
    waiting = {name: level["waiting"] for name, level in stats["levels"].items()}
    history = stats["history"]
    for data in history["levels"].values():
        data["p99_over"] = bool(data["p99_ms"] and data["p99_ms"] > stats["max_wait_ms"])
    notes = held_level_notes(history["levels"], waiting, held_by_level)
    for level, note in notes.items():
        history["levels"][level]["held_note"] = note
    history["notes"] = [*history["notes"], *notes.values()]
