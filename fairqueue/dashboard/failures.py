"""Failures as an operator reads them: grouped by error class and message (twenty
identical failures are one row with a count and the latest job ids), and the tenants
whose attempts fail above :data:`FAILING_RATIO`, which the overview lists as needing
attention.

A tenant's ratio is its jobs that failed in the window (BullMQ's failed set, the newest
:data:`~fairqueue.broker.failure_reads.RECENT_FAILED`) over the attempts it started in
the same window (its per-minute history, the record the tenant page shows). A failed
job ended at least one attempt, so when fewer attempts were recorded (the loop was not
recording) the failures themselves count as its attempts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Final

from fairqueue.broker import Broker, RecentFailure
from fairqueue.dashboard.wording import tenant_words

#: A tenant whose failed jobs reach this share of its attempts started is failing...
FAILING_RATIO: Final = 0.5
#: ...once it has at least this many failed jobs in the window.
FAILING_MIN: Final = 5
#: Tenants checked at most (those with the most failures), and groups listed.
FAILING_CHECKED: Final = 20
GROUPS_LISTED: Final = 10
#: Latest job ids a group lists.
GROUP_IDS: Final = 5


@dataclass(frozen=True, slots=True)
class FailureGroup:
    """Failures with one error class and message."""

    error_class: str
    message: str
    count: int
    #: The newest first.
    latest_ids: tuple[str, ...]
    tenants: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FailingTenant:
    tenant: str
    failed: int
    attempts: int

    @property
    def ratio(self) -> float:
        return self.failed / self.attempts if self.attempts else 0.0

    @property
    def text(self) -> str:
        return (
            f"{tenant_words(self.tenant)}: {self.failed} of {self.attempts} attempts failed "
            f"({100 * self.ratio:.0f}%)"
        )


@dataclass(frozen=True, slots=True)
class QueueFailures:
    """What failed in one queue over the window."""

    window_min: int
    read: int
    #: More failed in the window than were read (the groups are of the newest).
    more: bool
    groups: tuple[FailureGroup, ...]
    failing: tuple[FailingTenant, ...]


def group_failures(
    failures: list[RecentFailure], classes: dict[str, str], *, listed: int = GROUPS_LISTED
) -> tuple[FailureGroup, ...]:
    """``failures`` (newest first) grouped by (error class, message), the largest group
    first; ``classes``: message -> its error class."""
    by_key: dict[tuple[str, str], list[RecentFailure]] = {}
    for failure in failures:
        key = (classes.get(failure.message, ""), failure.message)
        by_key.setdefault(key, []).append(failure)
    groups = [
        FailureGroup(
            error_class=error_class or "error",
            message=message or "—",
            count=len(members),
            latest_ids=tuple(f.job_id for f in members[:GROUP_IDS]),
            tenants=tuple(sorted({tenant_words(f.tenant) for f in members})),
        )
        for (error_class, message), members in by_key.items()
    ]
    groups.sort(key=lambda g: (-g.count, g.error_class, g.message))
    return tuple(groups[:listed])


def failing_tenants(
    failed_by_tenant: dict[str, int], attempts_by_tenant: dict[str, int]
) -> tuple[FailingTenant, ...]:
    """The tenants whose failed jobs reach :data:`FAILING_RATIO` of their attempts (and
    :data:`FAILING_MIN`), the most failed first."""
    found = []
    for tenant, failed in failed_by_tenant.items():
        attempts = max(failed, attempts_by_tenant.get(tenant, 0))
        if failed >= FAILING_MIN and failed >= FAILING_RATIO * attempts:
            found.append(FailingTenant(tenant, failed, attempts))
    return tuple(sorted(found, key=lambda t: (-t.failed, t.tenant)))


def _attempts(buckets: dict[int, dict[str, str]]) -> int:
    """Attempts started in a tenant's per-minute buckets (``s:<level>`` fields)."""
    return sum(
        int(value)
        for fields in buckets.values()
        for key, value in fields.items()
        if key.startswith("s:")
    )


async def queue_failures(broker: Broker, queue: str, *, now_ms: int, minutes: int) -> QueueFailures:
    """The queue's failures over the last ``minutes``: grouped, and its failing tenants."""
    reads = broker.failures
    failures, more = await reads.recent(queue, since_ms=now_ms - minutes * 60_000)
    first_of: dict[str, str] = {}
    for failure in failures:
        first_of.setdefault(failure.message, failure.job_id)
    messages = list(first_of)[: GROUPS_LISTED * 2]
    found = await reads.error_classes(queue, [first_of[m] for m in messages])
    classes = dict(zip(messages, found, strict=True))
    failed_by: Counter[str] = Counter(f.tenant for f in failures if f.tenant is not None)
    checked = [t for t, n in failed_by.most_common(FAILING_CHECKED) if n >= FAILING_MIN]
    attempts = {}
    for tenant in checked:
        buckets = await broker.history.read_tenant_history(
            queue, tenant, now_s=now_ms // 1000, window_s=minutes * 60
        )
        attempts[tenant] = _attempts(buckets)
    return QueueFailures(
        window_min=minutes,
        read=len(failures),
        more=more,
        groups=group_failures(failures, classes),
        failing=failing_tenants({t: failed_by[t] for t in checked}, attempts),
    )


def failures_figures(found: QueueFailures) -> dict[str, Any]:
    """``found`` as the stats' plain data (the JSON endpoint's shape)."""
    return {
        "window_min": found.window_min,
        "read": found.read,
        "more": found.more,
        "groups": [
            {**asdict(g), "latest_ids": list(g.latest_ids), "tenants": list(g.tenants)}
            for g in found.groups
        ],
        "failing": [
            {
                **asdict(t),
                "display": tenant_words(t.tenant),
                "ratio": round(t.ratio, 3),
                "text": t.text,
            }
            for t in found.failing
        ],
    }
