"""The pace a flow really gets now: its weighted max-min share given who is asking.

Plain data in, plain data out (no Django, no Redis). One function, :func:`current_shares`,
is THE entitlement of a flow: the start estimate (``job_status``, ``estimate_start``)
turns a job's place into a time with it, and the dashboard's tenant page shows it as
"entitled". Callers describe each flow they know of as a :class:`FlowAsk` (its level, its
tenant weight and what it asks for) and get back the jobs per second each flow gets.

Why not the weights alone: weights say what a flow gets while every flow of every level
has a backlog. A flow that asks for less (a quiet tenant, one held by ``max_active``, a
paused or rate-limited one) gets what it asks and the rest goes to the others, level by
level (weighted max-min, water-filling, :func:`fairqueue.scheduling.shares.max_min`):

1. the levels share the workers by their weights (4/3/2/1), a level asking for less than
   its part getting what it asks (a level asks for what its flows ask, summed);
2. inside a level, its accounts share the level's part by their account weights the same
   way (an account asks for what its flows ask; a tenant without an account is an account
   of its own, of its tenant weight: without accounts, this is the flat rule);
3. inside an account, its tenants share the account's part by their tenant weights.

What a flow asks for (:func:`asked_rate`): unbounded (``math.inf``) while it has a
backlog the scheduler alone holds back; else what it was served lately (its limits or its
own arrivals hold it, so it uses what it uses, not what its weight would give it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from fairqueue.scheduling.hierarchy import ACCOUNT_MARK, group_of
from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS
from fairqueue.scheduling.order import TAG_SCALE
from fairqueue.scheduling.shares import max_min

#: A flow with more jobs than this waiting in the fair band (not held) asks for more than
#: it gets: it is backlogged. A quiet flow has one job at a time waiting, one held by
#: ``max_active`` at most its running allowance.
BACKLOG_JOBS: Final = 2.0
#: The pseudo-flow that stands for a level's served starts no known flow accounts for
#: (tenants beyond the history's most served).
OTHER_FLOWS: Final = ""

LEVEL_WEIGHTS: Final[Mapping[str, float]] = {
    level.value: float(weight) for level, weight in DEFAULT_FAIR_WEIGHTS.items()
}


@dataclass(frozen=True, slots=True)
class FlowAsk:
    """One flow as :func:`current_shares` sees it: its ``level`` name, ``tenant``, tenant
    ``weight`` (> 0), the jobs per second it ``asks`` for (``math.inf``: backlogged,
    takes whatever it is given), and its ``account`` (``None``: none) with that account's
    ``account_weight`` (> 0)."""

    level: str
    tenant: str
    weight: float
    asks: float
    account: str | None = None
    account_weight: float = 1.0


def asked_rate(*, backlog_jobs: float, served_per_s: float, held: bool) -> float:
    """What a flow asks for now: ``math.inf`` when more than :data:`BACKLOG_JOBS` of its
    jobs wait in the fair band and no limit of its tenant holds the rest; else what it
    was served per second lately (a held, paused, rate-limited or quiet tenant uses what
    it uses)."""
    if not held and backlog_jobs > BACKLOG_JOBS:
        return math.inf
    return max(0.0, served_per_s)


def current_shares(
    capacity: float,
    flows: Iterable[FlowAsk],
    level_weights: Mapping[str, float] = LEVEL_WEIGHTS,
) -> dict[tuple[str, str], float]:
    """Jobs per second each flow ``(level, tenant)`` gets now out of ``capacity`` (jobs
    per second the workers start): weighted max-min across levels by ``level_weights``,
    then across each level's accounts by account weight, then across each account's
    flows by their tenant weights (see the module docstring).

    Every flow gets at most what it asks; the shares add up to ``min(capacity, all that is
    asked)``; a flow (an account) that gets less than it asks gets at least its weight's
    part beside any flow of its account (account of its level) that gets more per weight.

    Raises:
        ValueError: a negative capacity, a weight <= 0, a level without a weight, the
            same flow twice, or one account of a level given two weights.
    """
    if capacity < 0 or math.isnan(capacity):
        raise ValueError(f"capacity={capacity!r} is not allowed: expected a number >= 0")
    by_level: dict[str, dict[str, FlowAsk]] = {}
    for flow in flows:
        if flow.level not in level_weights:
            raise ValueError(
                f"level={flow.level!r} is not allowed: expected one of {sorted(level_weights)}"
            )
        if not flow.weight > 0:
            raise ValueError(f"weight={flow.weight!r} is not allowed: expected a number > 0")
        if flow.account is not None and not flow.account_weight > 0:
            raise ValueError(
                f"account_weight={flow.account_weight!r} is not allowed: expected a number > 0"
            )
        same_level = by_level.setdefault(flow.level, {})
        if flow.tenant in same_level:
            raise ValueError(f"flow {flow.level}/{flow.tenant!r} is given twice")
        same_level[flow.tenant] = flow
    asked = {
        level: sum(max(0.0, f.asks) for f in level_flows.values())
        for level, level_flows in by_level.items()
    }
    level_part = max_min(capacity, asked, level_weights)
    shares: dict[tuple[str, str], float] = {}
    for level, level_flows in by_level.items():
        for tenant, rate in account_max_min(level_part[level], level_flows.values()).items():
            shares[(level, tenant)] = rate
    return shares


def account_max_min(capacity: float, flows: Iterable[FlowAsk]) -> dict[str, float]:
    """One level's ``capacity`` split among its ``flows`` (tenant -> jobs per second):
    its accounts share it by account weight, each account's tenants share its part by
    tenant weight, max-min at both steps; a flow without an account is an account of its
    own, of its tenant weight.

    Raises:
        ValueError: one account given two weights.
    """
    groups: dict[str, list[FlowAsk]] = {}
    group_weights: dict[str, float] = {}
    for flow in flows:
        group = group_of(flow.tenant, flow.account)
        weight = flow.weight if flow.account is None else flow.account_weight
        if group_weights.setdefault(group, weight) != weight:
            raise ValueError(
                f"account_weight={weight!r} is not allowed: account {flow.account!r} "
                f"is given weight {group_weights[group]!r} by another of its flows"
            )
        groups.setdefault(group, []).append(flow)
    group_part = max_min(
        capacity,
        {group: sum(max(0.0, f.asks) for f in mates) for group, mates in groups.items()},
        group_weights,
    )
    got: dict[str, float] = {}
    for group, mates in groups.items():
        got.update(
            max_min(
                group_part[group],
                {f.tenant: max(0.0, f.asks) for f in mates},
                {f.tenant: f.weight for f in mates},
            )
        )
    return got


def share_of(
    capacity: float,
    flows: Iterable[FlowAsk],
    level: str,
    tenant: str,
    level_weights: Mapping[str, float] = LEVEL_WEIGHTS,
    weight: float | None = None,
    *,
    of_level: bool = False,
    account: tuple[str, float] | None = None,
) -> float | None:
    """The fraction of ``capacity`` flow ``(level, tenant)`` gets now once it asks for all
    it can take (a new job makes it ask): :func:`current_shares` with that flow
    backlogged, at tenant ``weight`` (``None``: as ``flows`` give it, else 1) and in its
    account as ``flows`` give it, else in ``account`` (``(account id, weight)``; the
    weight its flows in ``flows`` count it at, if any). With ``of_level``: the fraction
    of what its level gets instead (the dashboard's "entitled", beside the tenant's share
    of its level's starts). ``None`` with no capacity measured."""
    if capacity <= 0:
        return None
    known = list(flows)
    mine = next((f for f in known if (f.level, f.tenant) == (level, tenant)), None)
    if weight is None:
        weight = 1.0 if mine is None else mine.weight
    if mine is not None and mine.account is not None:
        account = (mine.account, mine.account_weight)
    if account is not None:
        counted = (f.account_weight for f in known if (f.level, f.account) == (level, account[0]))
        account = (account[0], next(counted, account[1]))
    others = [f for f in known if (f.level, f.tenant) != (level, tenant)]
    asking = FlowAsk(level, tenant, weight, math.inf)
    if account is not None:
        asking = FlowAsk(level, tenant, weight, math.inf, account[0], account[1])
    got = current_shares(capacity, [*others, asking], level_weights)
    if of_level:
        level_got = sum(rate for (name, _), rate in got.items() if name == level)
        return got[(level, tenant)] / level_got if level_got > 0 else None
    return got[(level, tenant)] / capacity


def account_share_of(
    capacity: float,
    flows: Iterable[FlowAsk],
    level: str,
    account: str,
    account_weight: float,
    level_weights: Mapping[str, float] = LEVEL_WEIGHTS,
) -> float | None:
    """The fraction of what ``level`` gets that ``account`` gets now once all its flows
    there ask for all they can take (a new tenant of it when ``flows`` hold none): its
    max-min share of the level by account weight (``account_weight``, or the weight its
    flows count it at). ``None`` with no capacity measured."""
    if capacity <= 0:
        return None
    known = list(flows)
    mine = [f for f in known if (f.level, f.account) == (level, account)]
    weight = mine[0].account_weight if mine else account_weight
    asking = [FlowAsk(level, f.tenant, f.weight, math.inf, account, weight) for f in mine] or [
        FlowAsk(level, OTHER_FLOWS + ACCOUNT_MARK, 1.0, math.inf, account, weight)
    ]
    others = [f for f in known if (f.level, f.account) != (level, account)]
    got = current_shares(capacity, [*others, *asking], level_weights)
    level_got = sum(rate for (name, _), rate in got.items() if name == level)
    ours = sum(got[(level, f.tenant)] for f in asking)
    return ours / level_got if level_got > 0 else None


#: The flows whose last tags reach furthest past the virtual time that the estimate
#: scripts read as backlogged candidates (bounded work per call, whatever the tenants).
ASKING_SCAN: Final = 16
#: The ids at the end of such a flow's line (its jobs placed behind one of its own) the
#: scripts look up in the waiting set: one more than :data:`BACKLOG_JOBS`, enough to
#: tell a backlog from a last tag that merely ran ahead.
ASKING_LINE_TAIL: Final = int(BACKLOG_JOBS) + 1


@dataclass(frozen=True, slots=True)
class AskingRead:
    """What the estimate scripts read of who is asking (``fqEtaAsking``): each level's
    counted weights (``totals``: an account counts its account weight), the flows reaching
    furthest past the virtual time (``ahead``: level, tenant, last tag, counted weight,
    whether its tenant has jobs held or is paused, and how many of the last
    :data:`ASKING_LINE_TAIL` ids of its line still wait, ``None``: it keeps no line), the
    account of those that count under one (``accounts``: (level, tenant) -> account id,
    account weight, its flows' tenant weights), the starts per flow over the rate's window
    (``served``) and over its last two buckets (``recent``, from second
    ``recent_since_s``: what a flow asks for follows a flow that stopped within 10-20 s,
    not the whole window)."""

    totals: Mapping[str, float]
    ahead: tuple[tuple[str, str, float, float, bool, int | None], ...] = ()
    served: Mapping[tuple[str, str], int] = field(default_factory=dict)
    recent: Mapping[tuple[str, str], int] = field(default_factory=dict)
    recent_since_s: int | None = None
    accounts: Mapping[tuple[str, str], tuple[str, float, float]] = field(default_factory=dict)


def flows_asking(
    read: AskingRead,
    *,
    vt: float,
    window_s: float,
    level_served: Mapping[str, int],
    now_s: float | None = None,
    level_weights: Mapping[str, float] = LEVEL_WEIGHTS,
    tenant_weights: Mapping[tuple[str, str], float] | None = None,
    accounts: Mapping[str, tuple[str, float]] | None = None,
) -> list[FlowAsk]:
    """The flows :func:`current_shares` takes, from what the scripts read: a flow in
    ``read.ahead`` has ``(last - vt) / its step`` jobs waiting (its step: its level's
    weight split among the level's counted weights, and with an account, its account's
    part split among the account's flows), at most one more than the ids of
    its line's tail still waiting (:func:`waiting_jobs`); what it asks is :func:`asked_rate`
    of that and of its recent starts (``read.recent`` since ``read.recent_since_s``,
    up to ``now_s``; without them, ``read.served`` over ``window_s``). Flows only seen
    starting ask for what they were served, and each level's starts over the window that
    no flow read accounts for (tenants past the history's most served) ask as one more
    flow, :data:`OTHER_FLOWS`. ``tenant_weights``: weights known otherwise (flows not
    counted now); ``accounts``: tenant -> (account id, account weight) known otherwise,
    for flows the read gives no account (an account's weight as the read counts it wins)."""
    per_s = 1 / window_s if window_s > 0 else 0.0
    served, served_per_s = read.served, per_s
    if read.recent_since_s is not None and now_s is not None and now_s > read.recent_since_s:
        served, served_per_s = read.recent, 1 / (now_s - read.recent_since_s)
    counted_accounts = {
        (level, account): weight for (level, _), (account, weight, _) in read.accounts.items()
    }

    def account_of(level: str, tenant: str) -> tuple[str | None, float]:
        found = read.accounts.get((level, tenant))
        if found is not None:
            return found[0], found[1]
        known = (accounts or {}).get(tenant)
        if known is None:
            return None, 1.0
        return known[0], counted_accounts.get((level, known[0]), known[1])

    asks: dict[tuple[str, str], FlowAsk] = {}
    for level, tenant, last, weight, held, line in read.ahead:
        if level not in level_weights:
            continue
        counted = weight if weight > 0 else 1.0
        total = max(read.totals.get(level, 0.0), counted)
        step = TAG_SCALE * total / (level_weights[level] * counted)
        grouped = read.accounts.get((level, tenant))
        if grouped is not None:  # the account's part, split among its flows
            _account, account_weight, mates = grouped
            step *= max(mates, counted) / account_weight
        rate = served.get((level, tenant), 0) * served_per_s
        backlog = waiting_jobs(max(0.0, last - vt) / step, line)
        asked = asked_rate(backlog_jobs=backlog, served_per_s=rate, held=held)
        account, account_weight = account_of(level, tenant)
        asks[(level, tenant)] = FlowAsk(level, tenant, counted, asked, account, account_weight)
    for (level, tenant), count in served.items():
        if level in level_weights and (level, tenant) not in asks:
            weight = (tenant_weights or {}).get((level, tenant), 1.0)
            account, account_weight = account_of(level, tenant)
            asks[(level, tenant)] = FlowAsk(
                level, tenant, weight, count * served_per_s, account, account_weight
            )
    known: dict[str, int] = {}
    for (level, _tenant), count in read.served.items():
        known[level] = known.get(level, 0) + count
    for level, count in level_served.items():
        rest = count - known.get(level, 0)
        if level in level_weights and rest > 0 and (level, OTHER_FLOWS) not in asks:
            asks[(level, OTHER_FLOWS)] = FlowAsk(level, OTHER_FLOWS, 1.0, rest * per_s)
    return list(asks.values())


def waiting_jobs(by_tag: float, line_waiting: int | None) -> float:
    """How many jobs a flow has waiting: ``by_tag`` (its last tag's distance past the
    virtual time in its steps), at most one more than ``line_waiting`` when fewer than
    :data:`ASKING_LINE_TAIL` of its line's last ids still wait.

    Why both: a flow served beyond its weight while the queue was nearly idle (its jobs
    start as soon as they come, whatever their tags) has its last tag far past the
    virtual time with nothing waiting, which the tag distance reads as a backlog. Its
    line holds every job placed behind one of its own still waiting, so it misses at
    most the flow's first waiting job. ``None``: no line kept (a flow whose jobs never
    waited behind each other, or a line dropped after an hour without adds): the tag
    distance alone.
    """
    if line_waiting is None or line_waiting >= ASKING_LINE_TAIL:
        return by_tag
    return min(by_tag, float(line_waiting + 1))
