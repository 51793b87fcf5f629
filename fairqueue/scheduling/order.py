"""The fair ordering policy: plain data in, plain data out (no I/O, no Django), so it
can be tested exhaustively and the scripts that place jobs checked against it.

Two models of the same rule (docs/design.md, "The rule"): :func:`order_pending_jobs`,
the fair run order of a waiting set computed from scratch (the dashboard compares it
with the queue's real order), and :class:`FairClock`, the rule as the add script applies
it one job at a time (the tests require the same placement). An overdue job takes its
flow's next turn like any other (docs/design.md, "The wait bound").
:func:`order_by_occupancy` is the occupancy rule it replaced, kept for the benchmarks.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import lcm
from typing import Final, Literal

from fairqueue.scheduling.hierarchy import ACCOUNT_MARK, flow_share, group_of, level_groups
from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, LEVELS_BY_RANK, PriorityLevel
from fairqueue.scheduling.wire import flow_member

Decision = Literal["aged", "weighted_fair"]

AGED: Final = "aged"
WEIGHTED_FAIR: Final = "weighted_fair"

#: Virtual time a weight-1 flow of a weight-1 level uses per job, in BullMQ priority
#: units: 12 is the least common multiple of 4, 3, 2 and 1, so a lone tenant's tags
#: are whole numbers at every level (critical 3, high 4, normal 6, low 12 per job).
TAG_SCALE: Final = 12
#: How many of the flows that reach furthest ahead (of every level) a joining flow looks
#: through for its level's frontier: bounded work per placement; past it, the joining
#: flow gets the plain split of its level's weight.
FRONTIER_SCAN: Final = 64


@dataclass(frozen=True, slots=True)
class PendingJob:
    """One waiting job as the policy sees it.

    ``enqueued_at_ms`` is when the job became ready to run (on Redis's clock for jobs
    fairqueue added; a delayed job's delay is not waiting).
    """

    job_id: str
    priority_level: PriorityLevel
    tenant_id: str
    enqueued_at_ms: int
    tenant_weight: int = 1


@dataclass(frozen=True, slots=True)
class ScheduledJob:
    """A job's place in the run order. ``position`` is 1-based: position 1 runs first."""

    job_id: str
    position: int
    decision: Decision


def job_id_sort_key(job_id: str) -> tuple[int, int, str]:
    """Order job ids numerically where they are numbers (BullMQ's own ids), else by text.

    Numeric ids sort before textual ones so "9" < "10" < "custom-id".
    """
    if job_id.isascii() and job_id.isdigit():
        return (0, int(job_id), job_id)
    return (1, 0, job_id)


def is_overdue(job: PendingJob, *, now_ms: int, max_wait_ms: int) -> bool:
    """Whether ``job`` has waited longer than the hard bound."""
    return now_ms - job.enqueued_at_ms > max_wait_ms


#: A re-placement: (anchor, ratio, shift in tags, up to): the flow's waiting jobs placed
#: after the anchor and up to its last tag when it began (jobs placed beyond it, after a
#: refund moved its last tag back, keep their place, as the script's pages leave them).
Move = tuple[float, float, float, float]


def replaced_tag(tag: float, anchor: float, ratio: float, shift: float = 0.0) -> float:
    """A waiting job's tag once its tenant's weight changed by ``ratio`` (old over new)
    at virtual time ``anchor``: its distance from then shrinks or grows by the ratio
    (docs/design.md, "A weight change"; ``reweight_page.lua``). A cold flow's first
    measurement places its jobs again the same way, ``ratio`` being its measured cost
    over the one its jobs paid, ``shift`` (tags) what its runs so far overran, paid at
    once (docs/design.md, "Service is worker time"). A refund stops at the anchor."""
    return max(anchor, anchor + shift + (tag - anchor) * ratio)


def flow_step(
    level_weight: int,
    tenant_weight: int,
    level_tenant_weights: float,
    scale: int = TAG_SCALE,
    cost: float = 1.0,
) -> float:
    """Virtual time one job of a flow uses: ``scale * cost / flow weight`` where the flow
    weight is the level's weight split among its tenants with work by their tenant
    weights, and ``cost`` the job's worker time in turns (:func:`cost_turns`; 1 when
    fairness counts jobs; docs/design.md, "Service is worker time"). With accounts,
    ``level_tenant_weights`` is the flow's share: the level's split over its account's
    weight, times its account's split (:meth:`FairClock.place`)."""
    return scale * cost * level_tenant_weights / (level_weight * tenant_weight)


#: A job's cost in turns is kept within these bounds (a job 100x the others is charged
#: 16 turns: a slow flow waits longer, it never starves the others, and one outlier
#: never sets a flow back for long).
MIN_COST_TURNS: Final = 1 / 16
MAX_COST_TURNS: Final = 16.0
#: Estimates within this factor of the queue's typical run time count as one turn
#: exactly, so equal-cost jobs keep the order of fairness by jobs (their measured times
#: differ by noise only).
COST_DEAD_BAND: Final = 2**0.125


def cost_turns(estimate_s: float | None, typical_s: float | None) -> float:
    """The turns a job costs its flow when it is placed: its estimated run time over the
    queue's typical one, on a grid of quarter powers of two (so placements of equal-cost
    flows are exactly equal), within :data:`MIN_COST_TURNS`..:data:`MAX_COST_TURNS`.
    One turn with nothing measured yet (cold start)."""
    if not estimate_s or not typical_s or estimate_s <= 0 or typical_s <= 0:
        return 1.0
    ratio = estimate_s / typical_s
    if 1 / COST_DEAD_BAND < ratio < COST_DEAD_BAND:
        return 1.0
    quarters = max(-16, min(16, math.floor(math.log(ratio) / math.log(2) * 4 + 0.5)))  # as the Lua
    return 2.0 ** (quarters / 4)


def turn_scale(typical_s: float | None, unit_s: float | None) -> float:
    """How long a turn is in tags now: the queue's typical run time over its *unit* (the
    typical run time when the queue last started from idle, or when it was first
    measured), within :data:`MIN_COST_TURNS`..:data:`MAX_COST_TURNS`; 1 with either
    unknown. Tags placed while the typical time moves stay in one currency: a job placed
    now and one placed seconds ago cost what their worker time says, not what the
    typical time said when each was placed (docs/design.md, "Service is worker time")."""
    if not typical_s or not unit_s or typical_s <= 0 or unit_s <= 0:
        return 1.0
    return min(MAX_COST_TURNS, max(MIN_COST_TURNS, typical_s / unit_s))


def overrun_turns(used_s: float, placed_turns: float, typical_s: float | None) -> float:
    """What an attempt used beyond the turns its flow paid for it, in turns: negative when
    it used less. The attempt's use is bounded to MIN..MAX_COST_TURNS, so one outlier
    moves its flow by at most 16 turns."""
    if not typical_s or typical_s <= 0:
        return 0.0
    used = min(MAX_COST_TURNS, max(MIN_COST_TURNS, used_s / typical_s))
    return used - placed_turns


def settle_debt(debt: float, overrun: float) -> tuple[float, float]:
    """A flow's running balance of overruns, and what to charge it now: the balance once
    it reaches a whole turn either way, else nothing. Jitter (zero on average) seldom
    adds up to a turn, so equal-cost flows keep the order of counting jobs, while a
    systematic error of the estimate (its grid, a flow whose jobs got slower) is paid in
    full, both ways, one turn at a time."""
    debt += overrun
    if abs(debt) >= 1:
        return 0.0, debt
    return debt, 0.0


def order_pending_jobs(
    jobs: Iterable[PendingJob],
    *,
    now_ms: int,
    max_wait_ms: int,
    weights: Mapping[PriorityLevel, int] = DEFAULT_FAIR_WEIGHTS,
) -> list[ScheduledJob]:
    """Return the fair run order of ``jobs`` (see the module docstring).

    A tenant's weight is the one its most recently ready job carries. Runs in
    O(n log n).

    Raises:
        ValueError: for a non-positive weight or a level missing from ``weights``.
    """
    _check_weights(weights)
    flows: dict[tuple[PriorityLevel, str], list[PendingJob]] = defaultdict(list)
    for job in jobs:
        flows[(job.priority_level, job.tenant_id)].append(job)
    tenant_weight: dict[tuple[PriorityLevel, str], int] = {}
    level_total: dict[PriorityLevel, int] = defaultdict(int)
    for key, flow in flows.items():
        flow.sort(key=_ready_order)
        tenant_weight[key] = max(flow, key=_ready_order).tenant_weight
        level_total[key[0]] += tenant_weight[key]

    tagged: list[tuple[float, int, int, tuple[int, int, str], PendingJob]] = []
    for (level, tenant), flow in flows.items():
        step = flow_step(weights[level], tenant_weight[(level, tenant)], level_total[level])
        for k, job in enumerate(flow, start=1):
            tagged.append(
                (k * step, -weights[level], job.enqueued_at_ms, job_id_sort_key(job.job_id), job)
            )
    tagged.sort(key=lambda entry: entry[:4])
    return [
        ScheduledJob(
            job_id=job.job_id,
            position=position,
            decision=AGED
            if is_overdue(job, now_ms=now_ms, max_wait_ms=max_wait_ms)
            else WEIGHTED_FAIR,
        )
        for position, (*_, job) in enumerate(tagged, start=1)
    ]


@dataclass
class FairClock:
    """The add script's placement rule, one arrival at a time (a reference model).

    ``vt`` is the virtual time: what the first waiting job stands for, never going back.
    The script reads it from that job's score alone (no per-job record): the job's
    finish tag as the score keeps it (``resolution`` units per tag unit) less one turn of
    a lone weight-1 tenant of its level, which is its start tag or a little past it. A
    flow whose last tag is not ahead of ``vt`` has no work left and stops counting
    towards its level's total; when it comes back it starts at ``vt``. Tags are floats:
    the script keeps them as Lua numbers.
    """

    weights: Mapping[PriorityLevel, int] = field(default_factory=lambda: DEFAULT_FAIR_WEIGHTS)
    resolution: int = 1_024
    vt: float = 0.0
    last: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)
    counted: dict[tuple[PriorityLevel, str], int] = field(default_factory=dict)
    #: A joining account's catch-up horizon: where its level's backlogs ended when it
    #: joined (keyed by level and tenant, or ``ACCOUNT_MARK`` + account).
    horizon: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)
    #: The level's split (its accounts' weights) an account's last job was placed with, so
    #: one joining beside its backlog is placed at its spacing
    #: (docs/design.md, "Joining a level").
    spacing: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)
    #: A charge (turns) a flow's runs left after it had no work: its next job pays it
    #: with its own turn (:meth:`charge`; ``p:`` fields of fq:state).
    carried: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)
    #: The account a flow with work counts under (absent: none, the flow is its own
    #: account), kept until the flow retires, and each (level, account)'s weight.
    accounts: dict[tuple[PriorityLevel, str], str] = field(default_factory=dict)
    account_weights: dict[tuple[PriorityLevel, str], int] = field(default_factory=dict)
    #: A tenant that joined its account's flows with work: where their backlogs ended
    #: then, and the account's split it is placed at until it gets there (the densest its
    #: mates were placed at, at most their weights): the joining rule one level down.
    inner: dict[tuple[PriorityLevel, str], tuple[float, float]] = field(default_factory=dict)
    #: The level's split an account's flows together were last placed at (its spacing
    #: less what its tenants catching up inside it add): what a joining account matches.
    density: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)
    #: The account's split (its flows' weights) a flow's last job was placed with.
    inner_spacing: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)

    def observe_head(self, head_tag: float | None, head_level: PriorityLevel | None = None) -> None:
        """Advance the virtual time to what the first waiting job (its finish tag and
        level) stands for."""
        if head_tag is None or head_level is None:
            return
        start = (
            math.floor(head_tag * self.resolution) / self.resolution
            - TAG_SCALE / self.weights[head_level]
        )
        if start > self.vt:
            self.vt = start

    def place(
        self,
        level: PriorityLevel,
        tenant: str,
        tenant_weight: int = 1,
        *,
        cost: float = 1.0,
        stored: bool = False,
        account: str | None = None,
        account_weight: int = 1,
    ) -> float:
        """The finish tag of a new job of (``level``, ``tenant``); jobs run in tag order.
        ``cost`` is its worker time in turns. An overdue job is placed the same way: it
        takes its flow's next turn and is charged for it, so a flow over its share never
        takes a turn from another flow by being late.

        Hierarchical max-min (docs/design.md, "Accounts"): a level's accounts share it by
        account weight, an account's tenants share the account's part by tenant weight;
        a tenant without an account is an account of its own, of its weight, so without
        accounts every tag is the flat rule's. A flow with work keeps its account.

        An account that joins a level whose other accounts have backlogs is placed at
        their spacing (the level's split among the others, as their jobs were placed)
        until it reaches where those backlogs ended when it joined: its round-robin turn
        from its first job, instead of paying for the backlogs placed while it was idle.
        A tenant joining its account's flows with work does the same inside the account.

        ``stored``: ``tenant_weight`` was stored with the job when it was enqueued (a
        delayed or held job, a rerun): a flow with work places it by the weight it counts,
        so a weight changed since (:meth:`reweight`) is kept; so is its account's.
        """
        self._retire()
        key = (level, tenant)
        if stored and key in self.counted:
            tenant_weight = self.counted[key]
        if key in self.counted:
            account = self.accounts.get(key)
        group = group_of(tenant, account)
        groups = self._groups(level, key)
        weight = tenant_weight if account is None else account_weight
        if account is not None and stored and group in groups:
            weight = groups[group][0]
        mates = groups.pop(group, (weight, 0))[1]
        others = sum(w for w, _ in groups.values())
        start = max(self.vt, self.last.get(key, self.vt))
        joined = None
        catch_up: float = self.spacing.get((level, group), others)
        if key not in self.counted and others and not mates:
            frontier = self._frontier(level)
            if frontier is not None and frontier[0] > start:
                joined = frontier[0]
                catch_up = others if frontier[1] is None else min(others, frontier[1])
        horizon = joined if joined is not None else self.horizon.get((level, group))
        catching_up = horizon is not None and start < horizon
        split = catch_up if catching_up else others + weight
        inner = self._inner(key, account, mates, start, catching_up)
        part = mates + tenant_weight if inner is None else inner
        share = split * part / weight
        pay = cost + self.carried.pop(key, 0.0)  # a refund past its cost: the next job's
        if pay < (least := min(cost, MIN_COST_TURNS)):
            self.carried[key], pay = pay - least, least
        tag = start + flow_step(self.weights[level], tenant_weight, share, cost=pay)
        self.counted[key] = tenant_weight
        if account is not None:
            self.accounts[key] = account
            self.account_weights[(level, account)] = weight
        self.spacing[(level, group)] = split
        # what a joiner matches: the account's whole spacing, its flows placed denser than
        # its split (catching up inside it) counted (a tenant's own: its split)
        self.density[(level, group)] = split * part / (mates + tenant_weight)
        if account is not None:
            self.inner_spacing[key] = part
        if joined is not None:
            self.horizon[(level, group)] = joined
        elif horizon is not None and start >= horizon:
            del self.horizon[(level, group)]
        self.last[key] = max(tag, self.last.get(key, tag))
        return tag

    def _inner(
        self,
        key: tuple[PriorityLevel, str],
        account: str | None,
        mates: int,
        start: float,
        catching_up: bool,
    ) -> float | None:
        """The account split a tenant joining its account's flows with work is placed at
        until it reaches where their backlogs ended (``None``: its account's split with
        it). Not while its account catches up to the level: matching its mates' density
        as well would compound (each account joining denser than the last)."""
        if key not in self.counted and mates and not catching_up:
            # its mates' backlogs, read as the level's are: among the flows reaching
            # furthest (bounded work, no walk of the account's flows)
            found = self._frontier(key[0], account)
            if found is not None and found[0] > start:
                densest = mates if found[1] is None else min(mates, found[1])
                self.inner[key] = (found[0], densest)
        inner = self.inner.get(key)
        if inner is not None and start >= inner[0]:
            del self.inner[key]
            return None
        return None if inner is None else inner[1]

    def _retire(self) -> None:
        """Flows the virtual time has passed stop counting; an account's catch-up state
        goes with its last flow."""
        gone = [key for key, tag in self.last.items() if tag <= self.vt]
        groups = set()
        for key in gone:
            del self.last[key], self.counted[key]
            self.inner.pop(key, None)
            self.inner_spacing.pop(key, None)
            account = self.accounts.pop(key, None)
            groups.add((key[0], group_of(key[1], account)))
        for level, group in groups:
            if group.startswith(ACCOUNT_MARK) and group in self._groups(level):
                continue
            self.horizon.pop((level, group), None)
            self.spacing.pop((level, group), None)
            self.density.pop((level, group), None)
            if group.startswith(ACCOUNT_MARK):
                del self.account_weights[(level, group[len(ACCOUNT_MARK) :])]

    def _group_of(self, key: tuple[PriorityLevel, str]) -> str:
        return group_of(key[1], self.accounts.get(key))

    def _groups(
        self, level: PriorityLevel, but: tuple[PriorityLevel, str] | None = None
    ) -> dict[str, tuple[int, int]]:
        return level_groups(self.counted, self.accounts, self.account_weights, level, but)

    def reweight(
        self, tenant: str, tenant_weight: int
    ) -> dict[tuple[PriorityLevel, str], tuple[float, float]]:
        """``tenant``'s weight changed: each of its flows with work counts the new one at
        once (so its level's total does too), and places its next jobs by it. Its jobs
        waiting are placed again (:func:`replaced_tag`), and its last tag with them.
        The virtual time stays: the anchor, and what the head stands for once every job
        is placed again (:meth:`observe_head`), never a head part-way through.
        Returns, per flow whose weight changed, the (anchor, ratio) its waiting jobs'
        tags are placed again by."""
        moved = {}
        for key, counted in self.counted.items():
            if key[1] != tenant:
                continue
            last = self.last.get(key)
            if counted != tenant_weight and last is not None and last > self.vt:
                moved[key] = (self.vt, counted / tenant_weight)
                self.last[key] = replaced_tag(last, self.vt, counted / tenant_weight)
            self.counted[key] = tenant_weight
        return moved

    def recost(
        self, level: PriorityLevel, tenant: str, ratio: float, shift_turns: float
    ) -> Move | None:
        """The flow's first runs were measured: its waiting jobs, placed cold, are placed
        again at ``ratio`` (measured cost over what they paid) from the virtual time,
        ``shift_turns`` later (its overrun so far, or less), and its last tag with them,
        as :meth:`charge`, whichever way they move: a cheaper flood's backlog repaid only
        by its jobs' charges would be repaid once it drained, which a flood's never does
        (``None``: no work, the shift is charged as any settlement)."""
        key = (level, tenant)
        last = self.last.get(key)
        if last is None or last <= self.vt:
            return self.charge(level, tenant, shift_turns)
        share = flow_share(self._groups(level), self._group_of(key))
        shift = flow_step(self.weights[level], self.counted[key], share, cost=shift_turns)
        self.last[key] = replaced_tag(last, self.vt, ratio, shift)
        return self.vt, ratio, shift, last

    def _frontier(
        self, level: PriorityLevel, account: str | None = None
    ) -> tuple[float, float | None] | None:
        """The last tag of ``level``'s flow that reaches furthest, among the
        :data:`FRONTIER_SCAN` flows of every level that reach furthest (as the script
        reads them: by tag, then member, from the top), and the densest spacing of the
        level's flows among them (``None``: none kept): a backlog placed while fewer
        tenants had work is that dense, though its flow's last jobs may not be. With
        ``account``: of that account's flows of the level among them, and the densest
        account split they were placed with."""
        top = sorted(
            (
                (tag, flow_member(lvl.value, tenant), (lvl, tenant))
                for (lvl, tenant), tag in self.last.items()
            ),
            reverse=True,
        )[:FRONTIER_SCAN]
        mine = [
            (tag, key)
            for tag, _, key in top
            if key[0] == level and (account is None or self.accounts.get(key) == account)
        ]
        if not mine:
            return None
        if account is not None:
            parts = [self.inner_spacing[key] for _, key in mine if key in self.inner_spacing]
            return mine[0][0], min(parts) if parts else None
        found = ((key[0], self._group_of(key)) for _, key in mine)
        spaced = [self.density[group] for group in found if group in self.density]
        return mine[0][0], min(spaced) if spaced else None

    def charge(self, level: PriorityLevel, tenant: str, turns: float) -> Move | None:
        """The flow's attempts used ``turns`` more (less, if negative) than they paid when
        placed: paid at once, its waiting jobs and last tag moved that much later (a
        refund: earlier, none behind the virtual time; a refund of its last tag alone
        would count only once its backlog drained, never for a flood): (anchor, 1, shift
        in tags, up to) for :func:`replaced_tag`. ``None``: no work left, it is carried
        to its next job, which pays it with its own turn (a flow that keeps emptying too;
        docs/design.md, "Service is worker time")."""
        key = (level, tenant)
        if self.last.get(key, self.vt) <= self.vt or not turns:
            self.carried[key] = self.carried.get(key, 0.0) + turns
            return None
        share = flow_share(self._groups(level), self._group_of(key))
        shift = flow_step(self.weights[level], self.counted[key], share, cost=turns)
        upto = self.last[key]
        self.last[key] = replaced_tag(upto, self.vt, 1.0, shift)
        return self.vt, 1.0, shift, upto


def order_by_occupancy(
    jobs: Iterable[PendingJob],
    *,
    now_ms: int,
    max_wait_ms: int,
    weights: Mapping[PriorityLevel, int] = DEFAULT_FAIR_WEIGHTS,
) -> list[ScheduledJob]:
    """The occupancy policy, for comparison only: overdue jobs first (oldest first),
    then largest ``waiting / weight`` first, fewest-waiting tenant first inside a level.

    At every step the level whose remaining backlog is largest relative to its weight
    gives up its next job (ties: higher weight). With 8,000 critical and 200 low jobs
    this runs 7,200 critical jobs before the first low one (docs/design.md, "The rule").
    """
    scale = lcm(*_check_weights(weights))
    aged: list[PendingJob] = []
    by_level: dict[PriorityLevel, list[PendingJob]] = defaultdict(list)
    for job in jobs:
        if is_overdue(job, now_ms=now_ms, max_wait_ms=max_wait_ms):
            aged.append(job)
        else:
            by_level[job.priority_level].append(job)
    aged.sort(key=_ready_order)
    order: list[tuple[str, Decision]] = [(job.job_id, AGED) for job in aged]
    queues = {level: _fewest_waiting_first(level_jobs) for level, level_jobs in by_level.items()}
    # remaining / weight compared exactly: remaining * (scale // weight) is an integer.
    heap = [
        (-len(level_jobs) * (scale // weights[level]), -weights[level], rank, level)
        for rank, level in enumerate(LEVELS_BY_RANK)
        if (level_jobs := queues.get(level))
    ]
    heapq.heapify(heap)
    cursors = dict.fromkeys(queues, 0)
    while heap:
        _, neg_weight, rank, level = heapq.heappop(heap)
        level_jobs = queues[level]
        index = cursors[level]
        order.append((level_jobs[index].job_id, WEIGHTED_FAIR))
        cursors[level] = index + 1
        remaining = len(level_jobs) - index - 1
        if remaining:
            heapq.heappush(heap, (-remaining * (scale // -neg_weight), neg_weight, rank, level))
    return [
        ScheduledJob(job_id=job_id, position=position, decision=decision)
        for position, (job_id, decision) in enumerate(order, start=1)
    ]


def _check_weights(weights: Mapping[PriorityLevel, int]) -> list[int]:
    values = []
    for level in LEVELS_BY_RANK:
        weight = weights.get(level)
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise ValueError(
                f"weights[{level.value!r}]={weight!r} is not allowed: "
                "every level needs a positive integer weight"
            )
        values.append(weight)
    return values


def _ready_order(job: PendingJob) -> tuple[int, tuple[int, int, str]]:
    return (job.enqueued_at_ms, job_id_sort_key(job.job_id))


def _fewest_waiting_first(jobs: Sequence[PendingJob]) -> list[PendingJob]:
    """The fewest-waiting tenant rule (shortest queue first), for :func:`order_by_occupancy`."""
    by_tenant: dict[str, list[PendingJob]] = defaultdict(list)
    for job in jobs:
        by_tenant[job.tenant_id].append(job)
    heap: list[tuple[int, int, str, int]] = []
    for tenant_id, tenant_jobs in by_tenant.items():
        tenant_jobs.sort(key=_ready_order)
        heap.append((len(tenant_jobs), tenant_jobs[0].enqueued_at_ms, tenant_id, 0))
    heapq.heapify(heap)
    ordered: list[PendingJob] = []
    while heap:
        remaining, _, tenant_id, index = heapq.heappop(heap)
        tenant_jobs = by_tenant[tenant_id]
        ordered.append(tenant_jobs[index])
        if remaining > 1:
            next_head = tenant_jobs[index + 1]
            heapq.heappush(heap, (remaining - 1, next_head.enqueued_at_ms, tenant_id, index + 1))
    return ordered
