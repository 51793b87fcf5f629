"""The fair ordering policy: plain data in, plain data out (no I/O, no Django), so it
can be tested exhaustively and the scripts that place jobs checked against it.

Two models of the same rule (docs/design.md, "The rule"): :func:`order_pending_jobs`,
the fair run order of a waiting set computed from scratch (the dashboard compares it
with the queue's real order), and :class:`~fairqueue.scheduling.fair_clock.FairClock`,
the rule as the add script applies it one job at a time (the tests require the same
placement), built on this module's steps and costs. An overdue job takes its
flow's next turn like any other (docs/design.md, "The wait bound").
:func:`order_by_occupancy` is the occupancy rule it replaced, kept for the benchmarks.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import lcm
from typing import Final, Literal

from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, LEVELS_BY_RANK, PriorityLevel

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
    once (docs/design.md, "Service is worker time"). A refund (``shift`` < 0) never
    moves a job behind the anchor, nor onto another of its flow: within twice the refund
    of the anchor its jobs come half as far from it (so a refund every flow gets alike
    changes no order among them, where a stop at the anchor gave them one tag, taken
    flow by flow)."""
    return max(anchor + (tag - anchor) * ratio / 2, anchor + shift + (tag - anchor) * ratio)


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
