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

An account (docs/design.md, "Accounts") is noisy by the same rule one step up: its
tenants' running jobs in a level, together, over :data:`NOISY_FACTOR` times the account's
entitlement (its max-min share of the level given who is asking, its flows all asking)
while other accounts or lone tenants of the level wait. Ten tenants of one customer each
within its own share can be a noisy account.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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
class InFlight:
    """What runs in a queue now (BullMQ's active list, ``console.in_flight``): running
    jobs per (level, tenant), each level's counted weight of flows with work, the running
    tenants' flows, how many accounts run jobs (a tenant without one its own), the
    running tenants' accounts (tenant -> account id) and each running (level, account)'s
    counted account weight and whether any of its flows has work; per (level, tenant)
    the ms its running jobs have run so far."""

    running: dict[tuple[str, str], int]
    level_weights: dict[str, int]
    flows: dict[tuple[str, str], FlowWeight]
    accounts_running: int = 0
    accounts: dict[str, str] = field(default_factory=dict)
    account_flows: dict[tuple[str, str], FlowWeight] = field(default_factory=dict)
    ran_ms: dict[tuple[str, str], float] = field(default_factory=dict)


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


@dataclass(frozen=True, slots=True)
class NoisyAccount:
    """An account running more than its share of a level: its running jobs there and
    its running tenants, the level's running jobs, and its entitlement (0..1, as
    :attr:`Noisy.entitled`)."""

    level: str
    account: str
    running: int
    tenants: int
    level_running: int
    entitled: float
    measured: bool = True

    @property
    def share(self) -> float:
        return self.running / self.level_running if self.level_running else 0.0


def noisy_accounts(
    running: Mapping[tuple[str, str], int],
    level_weights: Mapping[str, int],
    owners: Mapping[str, str],
    account_flows: Mapping[tuple[str, str], FlowWeight],
    entitled: Mapping[tuple[str, str], float | None] | None = None,
) -> list[NoisyAccount]:
    """The noisy accounts among ``running`` ((level, tenant) -> running jobs): the
    running tenants of an account (``owners``: tenant -> account) summed per level,
    against what the account is ``entitled`` to now ((level, account) -> its max-min share
    of the level; missing or ``None``: its counted weight in ``account_flows`` over the
    level's ``level_weights``, which count an account's weight once)."""
    level_running: dict[str, int] = {}
    summed: dict[tuple[str, str], list[int]] = {}
    for (level, tenant), count in running.items():
        level_running[level] = level_running.get(level, 0) + count
        account = owners.get(tenant)
        if account is not None:
            row = summed.setdefault((level, account), [0, 0])
            row[0] += count
            row[1] += 1
    found = []
    for (level, account), (count, tenants) in summed.items():
        flow = account_flows.get((level, account), FlowWeight(1, False))
        waiting_weight = level_weights.get(level, 0)
        others_wait = waiting_weight - (flow.weight if flow.has_work else 0) > 0
        share = (entitled or {}).get((level, account))
        measured = share is not None
        if share is None:
            total = waiting_weight + (0 if flow.has_work else flow.weight)
            share = flow.weight / total if total else 1.0
        over = count > NOISY_FACTOR * share * level_running[level]
        if others_wait and count >= NOISY_MIN and over:
            found.append(
                NoisyAccount(level, account, count, tenants, level_running[level], share, measured)
            )
    return sorted(found, key=lambda n: (-n.running, n.level, n.account))
