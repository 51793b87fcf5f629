"""When a job will start: its place by the fair clock, the measured service rate, and the
limits that hold its tenant. Plain data in, plain data out (no Django, no Redis).

``lua/include/eta_place.lua`` reads the clock and a flow's state without writing and
places a new job as the add script would; :func:`fairqueue.scheduling.placing.place` is
the same arithmetic, and the tests hold both to the add script's placement. The rest
turns a place into a time (docs/design.md, "When a job will start"):

* **The service rate** is what the loop's history step measured over the last 20-30 s:
  jobs started per second (``R``), and per level. The virtual time moves at
  ``v = TAG_SCALE * max over levels (level's turns served per second / level weight)``
  (turns: jobs started, or with fairness by time worker time over the typical run time):
  a level with a backlog is served exactly at that pace (its tenants' flow weights add
  up to its weight), a level within its share at less, so the largest is the clock's.
  Where the loop sampled the virtual time over the window (``vt_moved_per_s``), tag
  distances are read at the pace it really moved: tags placed while another flow was
  briefly counted are wider than one turn, which the model's pace does not see.
* **A waiting job** waits for its flow's jobs before it (``own``: the distance from the
  virtual time to its tag over its flow's step) at its flow's pace NOW: the flow's
  weighted max-min share given who is asking (:func:`fairqueue.scheduling.pace
  .current_shares`: quiet, held, paused and rate-limited tenants and quiet levels count
  for what they use, not for their weight), never less than the jobs now ahead of it
  over ``R``. Without that read (older callers): ``(T - TAG_SCALE / W - vt) / v``.
* **A held job** waits for its tenant's room first: its place among the tenant's held
  jobs over the tenant's real release pace (for ``max_active``: the faster of the pace
  its jobs started at over the last buckets and its flow's share, at most ``max_active``
  jobs per typical run time; or its rate limit),
  then its flow's place.
* **The range and the confidence** follow how the level's recent estimates came out
  (:mod:`fairqueue.scheduling.calibration`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from fairqueue.scheduling.calibration import (
    FLOOR_MS,
    UNCALIBRATED,
    Calibration,
    admission_wait,
    calibrate,
    summed,
    wait_range,
)
from fairqueue.scheduling.calibration import confidence as calibrated_confidence
from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, PriorityLevel
from fairqueue.scheduling.limits import REASON_MAX_ACTIVE, REASON_PAUSED, REASON_RATE, TenantLimits
from fairqueue.scheduling.order import TAG_SCALE
from fairqueue.scheduling.placing import FlowSnapshot, place

Confidence = Literal["high", "medium", "low", "none"]

__all__ = ["FlowSnapshot", "place"]  # where the model of a placement lives

#: The window the service rate is measured over (seconds): the history's buckets that
#: start within it, the current one partly elapsed (20 to 30 s of starts). Long enough
#: for a steady pace, short enough to follow a change of load within half a minute.
RATE_WINDOW_S: Final = 20
#: Starts measured in the window for a ``high`` confidence (with steady buckets), and for
#: ``medium``; fewer is ``low``; none at all (and jobs ahead) is ``none``: no estimate.
HIGH_CONFIDENCE_STARTS: Final = 60
MEDIUM_CONFIDENCE_STARTS: Final = 10
#: The slowest and fastest bucket of the window may differ by this fraction of the mean
#: rate for a ``high`` confidence.
STEADY_SPREAD: Final = 0.5
#: A ``high`` estimate needs the load to look as it was when the level's recent estimates
#: were made: its flow's pace now and the virtual time's measured pace give waits within
#: this factor (the 25% a ``high`` stands for), and the clock moves within it of its
#: measured pace (``clock_ratio``). After a change, ``high`` estimates made from the
#: calibration of the load before came out at p90 0.55-0.97 of the wait in bench_eta;
#: within 10%, none was ``high`` in a steady flood either (the sampled clock's pace is
#: that noisy).
STEADY_AGREE: Final = 1.25
#: The least span (seconds) of the virtual time's samples its measured pace is taken over.
VT_SAMPLED_S: Final = 5.0
LEVEL_NAMES: Final = tuple(level.value for level in PriorityLevel)


@dataclass(frozen=True, slots=True)
class HistoryBucket:
    """One bucket of the history (``BUCKET_S`` seconds from ``start_s``): jobs started
    and worker milliseconds of finished attempts, per level name."""

    start_s: int
    starts: Mapping[str, int]
    worker_ms: Mapping[str, int]
    #: Per level, how its estimates came out: counts per ratio bin
    #: (:func:`fairqueue.scheduling.calibration.error_bin`), and the sum of the waits
    #: (ms) they expected (no key: not recorded).
    errors: Mapping[str, Sequence[int]] = field(default_factory=dict)
    expected_ms: Mapping[str, int] = field(default_factory=dict)
    #: Where the virtual time stood at the bucket's first and last sample: (ms, tag units).
    vt_first: tuple[int, float] | None = None
    vt_last: tuple[int, float] | None = None


@dataclass(frozen=True, slots=True)
class ServiceRate:
    """What the workers served over the rate's window (:data:`RATE_WINDOW_S`)."""

    #: Jobs started per second, all levels.
    jobs_per_s: float
    #: How fast the virtual time moves (tag units per second); 0: nothing measured.
    vt_per_s: float
    #: The slowest and fastest whole bucket of the window (jobs per second).
    slowest_per_s: float
    fastest_per_s: float
    #: Starts counted in the window.
    measured: int
    #: Turns served per second, all levels (jobs per second when fairness counts jobs).
    turns_per_s: float = 0.0
    #: Seconds the window spans (starts counted over it); per level, jobs started in it.
    window_s: float = 0.0
    level_starts: Mapping[str, int] = field(default_factory=dict)
    #: Per level, how its recent estimates came out (the window's ratio bins).
    calibrations: Mapping[str, Calibration] = field(default_factory=dict)
    #: How fast the virtual time really moved over the window (tag units per second,
    #: from its samples); 0: not sampled over :data:`VT_SAMPLED_S` at least.
    vt_moved_per_s: float = 0.0

    def calibration(self, level: PriorityLevel | str | None) -> Calibration:
        """The calibration of ``level``'s estimates (uncalibrated: none seen)."""
        name = level.value if isinstance(level, PriorityLevel) else level
        return self.calibrations.get(name or "", UNCALIBRATED)

    @property
    def known(self) -> bool:
        return self.jobs_per_s > 0 and self.vt_per_s > 0


NO_RATE: Final = ServiceRate(0.0, 0.0, 0.0, 0.0, 0, 0.0)


def service_rate(
    buckets: Sequence[HistoryBucket],
    *,
    now_ms: int,
    since_ms: int | None,
    bucket_s: int,
    window_s: int = RATE_WINDOW_S,
    typical_ms: float | None = None,
    by_time: bool = False,
    weights: Mapping[PriorityLevel, int] = DEFAULT_FAIR_WEIGHTS,
) -> ServiceRate:
    """The service rate of the last ``window_s`` (the buckets that start after
    ``now - window_s``, the current one partly elapsed). The virtual time's pace counts
    turns: with fairness by time (``by_time``) the worker time served over the queue's
    ``typical_ms`` run time, else jobs started. ``since_ms``: when the history began (a
    shorter window before then)."""
    if since_ms is None:
        return NO_RATE
    now_s = now_ms / 1000
    current = int(now_s // bucket_s * bucket_s)
    first = current - (window_s // bucket_s) * bucket_s
    start_s = max(first, since_ms / 1000)
    elapsed = now_s - start_s
    if elapsed <= 0:
        return NO_RATE
    kept = [b for b in buckets if first <= b.start_s <= current]
    starts = {name: sum(b.starts.get(name, 0) for b in kept) for name in LEVEL_NAMES}
    measured = sum(starts.values())
    if measured == 0:
        return NO_RATE
    worked = {name: sum(b.worker_ms.get(name, 0) for b in kept) for name in LEVEL_NAMES}
    # With fairness by time a flow's clock moves by the worker time its attempts used
    # (placed by their estimate, the rest charged): turns = worker time over the queue's
    # typical run time. Counting jobs, each start is a turn.
    use_time = by_time and bool(typical_ms) and sum(worked.values()) > 0
    served = {
        name: worked[name] / typical_ms if use_time and typical_ms else float(starts[name])
        for name in LEVEL_NAMES
    }
    paces = [served[level.value] / elapsed / weights[level] for level in PriorityLevel]
    samples = sorted(
        sample
        for b in kept
        for sample in (b.vt_first, b.vt_last)
        if sample is not None and sample[0] >= since_ms
    )
    moved = 0.0
    if samples and (samples[-1][0] - samples[0][0]) / 1000 >= VT_SAMPLED_S:
        (first_ms, first_vt), (last_ms, last_vt) = samples[0], samples[-1]
        moved = max(0.0, (last_vt - first_vt) / ((last_ms - first_ms) / 1000))
    whole = [
        sum(b.starts.values()) / bucket_s
        for b in kept
        if b.start_s < current and b.start_s >= since_ms / 1000
    ]
    rate = measured / elapsed
    return ServiceRate(
        jobs_per_s=rate,
        vt_per_s=TAG_SCALE * max(paces),
        slowest_per_s=min(whole, default=rate),
        fastest_per_s=max(whole, default=rate),
        measured=measured,
        turns_per_s=sum(served.values()) / elapsed,
        window_s=elapsed,
        level_starts=starts,
        calibrations={
            name: calibrate(
                summed(b.errors.get(name, ()) for b in kept),
                _expected_sum(kept, name),
            )
            for name in LEVEL_NAMES
        },
        vt_moved_per_s=moved,
    )


def _expected_sum(buckets: Sequence[HistoryBucket], level: str) -> float | None:
    """The waits the level's binned estimates expected, summed over ``buckets``
    (``None`` when a bucket with estimates did not record them: history written before)."""
    total = 0.0
    for bucket in buckets:
        if sum(bucket.errors.get(level, ())) == 0:
            continue
        if level not in bucket.expected_ms:
            return None
        total += bucket.expected_ms[level]
    return total


def confidence_of(rate: ServiceRate) -> Confidence:
    """How sure an estimate from ``rate`` is: ``high`` with many starts measured at a
    steady pace, ``medium`` with some, ``low`` with few, ``none`` with none."""
    if not rate.known:
        return "none"
    spread = (rate.fastest_per_s - rate.slowest_per_s) / rate.jobs_per_s
    if rate.measured >= HIGH_CONFIDENCE_STARTS and spread <= STEADY_SPREAD:
        return "high"
    if rate.measured >= MEDIUM_CONFIDENCE_STARTS:
        return "medium"
    return "low"


#: A held tenant with at least this many seconds of its measured starts held is taken to
#: have been held all along: its measured pace is its release pace (its limit binds).
HELD_BACKLOG_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class Wait:
    """An expected wait (seconds) and a range around it; ``None``: no estimate."""

    expected_s: float | None
    low_s: float | None
    high_s: float | None
    confidence: Confidence
    #: The wait admission holds to its bound (``None``: the expected wait;
    #: :func:`fairqueue.scheduling.calibration.admission_wait`).
    admit_s: float | None = None

    @property
    def admission_s(self) -> float | None:
        return self.expected_s if self.admit_s is None else self.admit_s


NO_WAIT: Final = Wait(0.0, 0.0, 0.0, "high")


def placed_wait(
    *,
    tag: float | None,
    level: PriorityLevel | None,
    vt: float,
    ahead: int,
    rate: ServiceRate,
    weights: Mapping[PriorityLevel, int] = DEFAULT_FAIR_WEIGHTS,
    own_ahead: float | None = None,
    flow_per_s: float | None = None,
    clock_ratio: float | None = None,
) -> Wait:
    """The wait of a job at finish tag ``tag`` of ``level`` (``None``: not in the fair
    band, placed by the jobs ahead alone) with ``ahead`` jobs popped before it now.

    With ``flow_per_s`` (its flow's pace now, :func:`fairqueue.scheduling.pace
    .current_shares`) and ``own_ahead`` (its flow's jobs before it): those jobs at that
    pace or, when earlier, the tag distance at the virtual time's measured pace times
    ``clock_ratio`` (:func:`fairqueue.scheduling.pace.clock_ratio`: how much faster it
    moves now), never less than the jobs ahead at the measured rate. Without them: the
    tag distance at the virtual time's measured pace (the module docstring). The range and
    confidence follow how the level's recent estimates came out
    (:mod:`fairqueue.scheduling.calibration`), and ``high`` is ``medium`` while the load
    looks changed (:data:`STEADY_AGREE`)."""
    if ahead <= 0:
        return _ranged(0.0, rate, level) if rate.known else Wait(0.0, 0.0, 0.05, "low")
    if not rate.known:
        return Wait(None, None, None, "none")
    by_count = ahead / rate.jobs_per_s
    by_clock = None
    if tag is not None and level is not None:
        # The virtual time's pace as sampled when it was (tags placed while a quiet flow
        # was counted are wider than one turn: the model's pace misses that), else the
        # model's.
        pace = (rate.vt_moved_per_s or rate.vt_per_s) * (clock_ratio or 1.0)
        by_clock = max(0.0, tag - TAG_SCALE / weights[level] - vt) / pace
    by_place = by_clock or 0.0
    moved = False
    if own_ahead is not None and flow_per_s:
        # Tag distances overstate a flow's jobs when it ran alone or was charged for long
        # runs (the virtual time then jumps to its head): never more than all jobs ahead.
        by_pace = min(max(0.0, own_ahead), ahead) / flow_per_s
        # The flow's jobs already waiting were placed at the spacing of their day; own_ahead
        # counts them at today's, so after a change of load it counts them double or half.
        # The virtual time's measured pace takes each tag as it was placed; it lags a
        # change of who is asking by 20-30 s, so it is scaled by ``clock_ratio`` (after a
        # level began to flood, normal's jobs started 40-50% later than the unscaled
        # clock said). The earlier of the two, never earlier than the jobs ahead at the
        # measured rate (by_count below).
        by_place = by_pace if by_clock is None else min(by_pace, by_clock)
        if by_clock is not None and not _agree(by_pace, by_clock):
            moved = True
    wait = _ranged(max(by_count, by_place), rate, level)
    if clock_ratio is not None and not _agree(clock_ratio, 1.0):
        moved = True
    if moved and wait.confidence == "high":
        # The level's recent estimates were made in the load before the change: how
        # they came out says little of this one until its like have started.
        return replace(wait, confidence="medium")
    return wait


def _agree(one: float, other: float) -> bool:
    """Whether two paces or waits (>= 0) are within :data:`STEADY_AGREE` of each other
    (both plus :data:`fairqueue.scheduling.calibration.FLOOR_MS`, as the calibration's
    ratios)."""
    floor = FLOOR_MS / 1000
    low, high = sorted((one + floor, other + floor))
    return high <= low * STEADY_AGREE


def _ranged(expected: float, rate: ServiceRate, level: PriorityLevel | str | None) -> Wait:
    calibration = rate.calibration(level)
    low, high = wait_range(expected, calibration)
    sure = calibrated_confidence(calibration, rate_known=rate.known, expected_s=expected)
    if confidence_of(rate) == "low" and sure in ("high", "medium"):
        sure = "low"
    return Wait(expected, low, high, sure, admission_wait(expected, calibration))


def held_reason(
    limits: TenantLimits, *, paused: bool, held_ahead: int, occupied: int
) -> str | None:
    """Which limit holds a tenant's next job (``held_ahead`` of its jobs held before it,
    ``occupied`` of its released ones not finished), or ``None``: it would go at once."""
    if paused or limits.paused:
        return REASON_PAUSED
    if limits.max_active is not None and (occupied >= limits.max_active or held_ahead > 0):
        return REASON_MAX_ACTIVE
    if limits.rate_max is not None and held_ahead > 0:
        return REASON_RATE
    return None


def held_delay_s(
    limits: TenantLimits,
    *,
    reason: str | None,
    held_ahead: int,
    occupied: int,
    run_s: float | None,
    tenant_per_s: float | None = None,
    flow_per_s: float | None = None,
) -> float | None:
    """How long until a held job is released (``None``: paused, or no pace known for a
    ``max_active`` tenant): its place among the tenant's held jobs over the pace its
    tenant is really released at. For ``max_active``: the pace its jobs were measured
    starting at lately (``tenant_per_s``, the history's starts of the tenant over its
    last buckets, :func:`fairqueue.scheduling.pace.tenant_pace`: a released job also
    waits its turn in its level, and its runs may be longer than the queue's typical
    run), at most ``max_active`` jobs per run time. Unless fewer of its jobs are held
    than it started in :data:`HELD_BACKLOG_S` at that pace: then it was held for a moment
    only and its starts followed its arrivals, so the faster of that and the pace its
    flow gets once it asks (``flow_per_s``, jobs per second,
    :func:`fairqueue.scheduling.pace.current_shares`). A measured pace past the share
    stands: a tenant kept at ``max_active`` has at most that many jobs waiting, placed
    near the virtual time, and is served past its weight (58% of the starts beside one
    other tenant, measured). For ``rate_max``: the pace its window allows."""
    if reason is None:
        return 0.0
    if reason == REASON_PAUSED:
        return None
    measured = tenant_per_s if tenant_per_s and tenant_per_s > 0 else None
    delays = [0.0]
    if limits.max_active is not None:
        room = max(0, limits.max_active - occupied)
        turns = held_ahead + 1 - room
        if turns > 0:
            allowed = limits.max_active / run_s if run_s else None
            flow = flow_per_s if flow_per_s and flow_per_s > 0 else None
            asked = measured
            if measured is None or held_ahead + 1 < measured * HELD_BACKLOG_S:
                asked = max((p for p in (measured, flow) if p), default=None)
            paces = [p for p in (asked, allowed) if p]
            if not paces:
                return None
            delays.append(turns / min(paces))
    if limits.rate_max is not None and limits.rate_duration_ms is not None:
        # released as the window allows, whatever runs: the turn in its level follows
        delays.append(held_ahead * limits.rate_duration_ms / 1000 / limits.rate_max)
    return max(delays)


def with_delay(wait: Wait, delay_s: float | None) -> Wait:
    """``wait`` after ``delay_s`` (``None``: unknown, no estimate)."""
    if delay_s is None or wait.expected_s is None:
        return Wait(None, None, None, "none")
    if not delay_s:
        return wait
    lower = "low" if wait.confidence in ("high", "medium") else wait.confidence
    return Wait(
        wait.expected_s + delay_s,
        (wait.low_s or 0.0) + delay_s * 0.5,
        (wait.high_s or 0.0) + delay_s * 2,
        lower,
        (wait.admission_s or 0.0) + delay_s,
    )


def flow_share(
    *,
    level: PriorityLevel,
    tenant_weight: int,
    level_share: int,
    rate: ServiceRate,
    weights: Mapping[PriorityLevel, int] = DEFAULT_FAIR_WEIGHTS,
) -> float | None:
    """The fraction of the workers the flow gets while it has a backlog: its flow weight
    (its level's weight split among ``level_share`` counted tenant weights) at the
    virtual time's measured pace, over the turns served per second."""
    if not rate.known or level_share <= 0:
        return None
    flow_weight = weights[level] * tenant_weight / level_share
    served = rate.turns_per_s or rate.jobs_per_s
    return min(1.0, rate.vt_per_s * flow_weight / TAG_SCALE / served)


@dataclass(frozen=True, slots=True)
class StartEstimate:
    """When a job is expected to start (times in ms since the epoch, Redis's clock).

    ``expected_start_ms`` lies between ``earliest_start_ms`` and ``latest_start_ms``;
    ``confidence`` is ``high`` (the level's recent estimates of this wait's scale came
    out tight, :func:`fairqueue.scheduling.calibration.confidence`), ``medium``, ``low``
    or ``none`` (no estimate: the times are ``None``). ``ahead`` counts the jobs
    BullMQ pops before it now; ``held_reason`` names the limit that holds its tenant
    (``max_active``, ``rate``, ``paused``) or is ``None``; ``share`` is the fraction of
    the workers its flow gets while it has a backlog, given who is asking now
    (:func:`fairqueue.scheduling.pace.current_shares`; ``None``: nothing measured), and
    ``level_share`` the fraction of its level's starts that is (its entitlement).
    """

    expected_wait_ms: int | None
    expected_start_ms: int | None
    earliest_start_ms: int | None
    latest_start_ms: int | None
    confidence: Confidence
    ahead: int | None
    held_reason: str | None = None
    share: float | None = None
    level: str | None = None
    #: The finish tag the fair clock gives the job (``None``: not placed by it).
    tag: float | None = None
    level_share: float | None = None
    #: The wait ``max_wait_ms`` is held to: the expected wait stretched to how late the
    #: level's recent estimates came out 9 times in 10 (``None``: as expected;
    #: :func:`fairqueue.scheduling.calibration.admission_wait`).
    admission_wait_ms: int | None = None
