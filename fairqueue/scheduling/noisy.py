"""Noisy neighbours: tenants holding more than their share of a level's running jobs
while other tenants of that level wait.

Amazon SQS fair queues count a message group as noisy when it has more messages in
flight than its fair share while other groups have messages waiting. fairqueue's share
of a tenant is its entitlement now: its weighted max-min share of its level given who is
asking (:func:`fairqueue.scheduling.pace.current_shares`; held, paused and quiet tenants
count for what they use), the same figure its tenant page and start estimates show. A
tenant is noisy when others of its level wait and it runs more than :data:`NOISY_FACTOR`
times that share of the level's running jobs (and at least :data:`NOISY_MIN` jobs): a
flood of long jobs taking the workers, which fair starts alone do not prevent. A tenant
within its share is never flagged.

With fairness by worker time (``FAIRNESS_BY = "time"``) the running jobs are a snapshot
of a handful of workers, and a tenant of short jobs within its share often holds more
of them for a moment: it is noisy only if its worker time over the last minute or two
(the history's tenant buckets, and what its attempts running now have run so far) is
also over :data:`NOISY_FACTOR` times its share of its level's, so a tenant within its
share by worker time is never flagged.

With no service rate measured yet there is no "given who is asking" to read: the share
is then its weight over the weights of the level's tenants with work (``W:<level>`` in
the fair clock's state), counting itself when it has none waiting, and says so
(:attr:`Noisy.measured` false).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

#: Running more than this many times its share of its level's running jobs is noisy...
NOISY_FACTOR: Final = 1.5
#: ...and at least this many jobs (one or two jobs are nobody's flood).
NOISY_MIN: Final = 2


@dataclass(frozen=True, slots=True)
class FlowWeight:
    """A running tenant's flow: its weight, and whether it has work waiting."""

    weight: int
    has_work: bool


@dataclass(frozen=True, slots=True)
class Noisy:
    level: str
    tenant: str
    running: int
    level_running: int
    #: Its share of the level now, 0..1: its max-min share given who is asking
    #: (``measured``), else by weight alone (no service rate measured yet).
    entitled: float
    measured: bool = True
    #: With fairness by time: its share of its level's recent worker time, 0..1.
    worked: float | None = None

    @property
    def share(self) -> float:
        return self.running / self.level_running if self.level_running else 0.0


def noisy_tenants(
    running: Mapping[tuple[str, str], int],
    level_weights: Mapping[str, int],
    flows: Mapping[tuple[str, str], FlowWeight],
    entitled: Mapping[tuple[str, str], float | None] | None = None,
    worked: Mapping[tuple[str, str], float] | None = None,
) -> list[Noisy]:
    """The noisy tenants among ``running`` ((level, tenant) -> running jobs), given
    each level's total weight of flows with work, the running tenants' flows and what
    each is ``entitled`` to now (its max-min share of its level; missing or ``None``:
    by weight alone). ``worked`` (fairness by time): each running tenant's share of its
    level's recent worker time (missing: none recorded, none run), which must be over
    the factor times its share too.

    Raises:
        ValueError: a ``worked`` share outside 0..1.
    """
    for key, value in (worked or {}).items():
        if not 0 <= value <= 1:
            raise ValueError(f"worked[{key!r}]={value!r} is not allowed: expected a share 0..1")
    by_level: dict[str, int] = {}
    for (level, _), count in running.items():
        by_level[level] = by_level.get(level, 0) + count
    found = []
    for (level, tenant), count in running.items():
        flow = flows.get((level, tenant), FlowWeight(1, False))
        waiting_weight = level_weights.get(level, 0)
        others_wait = waiting_weight - (flow.weight if flow.has_work else 0) > 0
        share = (entitled or {}).get((level, tenant))
        measured = share is not None
        if share is None:
            total = waiting_weight + (0 if flow.has_work else flow.weight)
            share = flow.weight / total if total else 1.0
        if not (others_wait and count >= NOISY_MIN):
            continue
        if count <= NOISY_FACTOR * share * by_level[level]:
            continue
        part = None if worked is None else worked.get((level, tenant), 0.0)
        if part is not None and part <= NOISY_FACTOR * share:
            continue  # by worker time within its share: a moment's snapshot, not a flood
        found.append(Noisy(level, tenant, count, by_level[level], share, measured, part))
    return sorted(found, key=lambda n: (-n.running, n.level, n.tenant))
