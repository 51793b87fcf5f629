"""Served shares and waits over the last minutes: the pure part of the dashboard's history.

Data in, data out: nothing here talks to Redis or reads settings. The rebalance loop
records what workers started (``scheduling/attempts.py``, ``broker/events.py``) in
per-``BUCKET_S`` buckets kept ``RETENTION_S``; :func:`summarize` turns those buckets into what the
dashboard shows: per level the share of the jobs started, the share it was *entitled*
to given the work each level had, wait p50/p99 against the bound; the top tenants.

Why entitlement and not just the weights: weights say 40/30/20/10 only while every
level has work. A level that asks for less than its share gets all it asks for and the
rest goes to the others (weighted max-min, water-filling). So per bucket the demand of a
level is its backlog at the bucket's start plus the jobs that became ready in it, the
capacity is what was served in it, and :func:`max_min` gives each level its
entitlement. Summed over the window, a fair queue serves each level about what it was
entitled to, whatever the mix; a starved level shows a served share far below it.
This is the level stage of :func:`fairqueue.scheduling.pace.current_shares` (the
console's "entitled now" of a tenant) applied per bucket to what each level had then
and summed: the pages call it "entitled over the window", a different quantity from a
tenant's entitlement now, not a second opinion on it.

Backlogs are not sampled: they follow from the buckets themselves. A started job adds
one arrival to the bucket it became ready in and one service to the bucket it started
in, so the running sum of arrivals less services is the backlog of jobs that have
started since (the backlog before the oldest bucket kept is the least that keeps that
sum non-negative). Jobs still waiting have not started, so the dashboard adds them
from its live per-level counts (``waiting_now``) as arrivals at their level's oldest
waiting job.

Waits go into histograms with bins about 19% wide (:data:`WAIT_EDGES`, four per
octave); a percentile is interpolated within its bin, so it is within one bin of the
exact value.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from fairqueue.scheduling.attempts import UNKNOWN
from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, LEVELS_BY_RANK
from fairqueue.scheduling.wire import split_flow_member

#: Width of a history bucket, and how long buckets are kept (Redis TTLs).
BUCKET_S: Final = 10
RETENTION_S: Final = 3_600
#: Tenants kept per bucket (the most served; the rest count as "other tenants").
TENANTS_PER_BUCKET: Final = 32
#: Windows the dashboard offers, in minutes.
DEFAULT_WINDOW_MIN: Final = 15
MAX_WINDOW_MIN: Final = RETENTION_S // 60
LEVEL_NAMES: Final = tuple(level.value for level in LEVELS_BY_RANK)


def _wait_edges() -> tuple[int, ...]:
    edges: list[int] = []
    step = 0
    while not edges or edges[-1] <= 2 * 86_400_000:
        edge = math.ceil(2 ** (step / 4))
        if not edges or edge > edges[-1]:
            edges.append(edge)
        step += 1
    return tuple(edges)


#: Upper edges (ms, exclusive) of the wait bins: bin 0 is [0, 1 ms), bin i is
#: [WAIT_EDGES[i-1], WAIT_EDGES[i]), the last bin is everything from two days up.
WAIT_EDGES: Final = _wait_edges()


def wait_bin(wait_ms: int) -> int:
    """The histogram bin of a wait (the Lua recorder bins with the same edges)."""
    return bisect.bisect_right(WAIT_EDGES, max(0, wait_ms))


def bin_bounds(index: int) -> tuple[float, float]:
    """The [low, high) range of a bin in ms (the last bin's high is its low doubled)."""
    low = 0.0 if index == 0 else float(WAIT_EDGES[index - 1])
    high = float(WAIT_EDGES[index]) if index < len(WAIT_EDGES) else 2 * low
    return low, high


def percentile(histogram: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of the waits in ``histogram`` (bin -> count),
    interpolated linearly within its bin; ``None`` for no waits."""
    if not 0 < q <= 1:
        raise ValueError(f"q={q!r} is not allowed: expected 0 < q <= 1")
    total = sum(count for count in histogram.values() if count > 0)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index in sorted(histogram):
        count = histogram[index]
        if count <= 0:
            continue
        if seen + count >= rank:
            low, high = bin_bounds(index)
            return low + (high - low) * (rank - seen) / count
        seen += count
    return bin_bounds(max(histogram))[1]  # pragma: no cover - float rounding only


def max_min(
    capacity: float, demands: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, float]:
    """Weighted max-min fair allocation of ``capacity`` (water-filling): a party that
    asks for less than its weighted share gets what it asks; the rest is split among
    the others by weight."""
    alloc = dict.fromkeys(demands, 0.0)
    active = {key for key, demand in demands.items() if demand > 0}
    remaining = float(capacity)
    while active and remaining > 1e-9:
        unit = remaining / sum(weights[key] for key in active)
        done = {key for key in active if demands[key] - alloc[key] <= unit * weights[key]}
        if not done:
            for key in active:
                alloc[key] += unit * weights[key]
            break
        for key in done:
            remaining -= demands[key] - alloc[key]
            alloc[key] = float(demands[key])
        active -= done
    return alloc


@dataclass(slots=True)
class Bucket:
    """What the pass recorded for one bucket (see ``broker/lua/history_commit.lua``)."""

    start_s: int
    #: Jobs started, per level (``UNKNOWN``: the job's hash was gone when read).
    served: dict[str, int] = field(default_factory=dict)
    #: Started jobs that became ready in this bucket, per level.
    arrived: dict[str, int] = field(default_factory=dict)
    #: Waits of the jobs started, per level: bin -> count.
    waits: dict[str, dict[int, int]] = field(default_factory=dict)
    #: Started jobs that had waited longer than the bound, per level.
    over: dict[str, int] = field(default_factory=dict)
    #: Starts of jobs that had more than one attempt when the pass read them (retried;
    #: no wait recorded for them: their timestamp is their first add's).
    retried: int = 0
    #: Worker milliseconds of the attempts that finished in this bucket, per level.
    worker_ms: dict[str, int] = field(default_factory=dict)
    #: Starts of jobs that had run before (retries, recovered stalled jobs), per level.
    restarts: dict[str, int] = field(default_factory=dict)
    #: Milliseconds of this bucket whose events the pass never saw (the stream was
    #: trimmed before it read them).
    gap_ms: int = 0
    #: (level, tenant) -> jobs started, for the bucket's most served tenants.
    tenants: dict[tuple[str, str], int] = field(default_factory=dict)


def parse_bucket(
    start_s: int, fields: Mapping[str, str], tenants: Iterable[tuple[str, float]] = ()
) -> Bucket:
    """A bucket from its Redis hash fields (``s:<level>``, ``a:<level>``,
    ``o:<level>``, ``w:<level>:<bin>``, ``t:<level>``, ``R:<level>``, ``r``, ``g``)
    and tenant zset entries
    (``"<level>\\n<tenant>"`` -> count). Unknown fields are ignored."""
    bucket = Bucket(start_s=start_s)
    targets = {
        "s": bucket.served,
        "a": bucket.arrived,
        "o": bucket.over,
        "t": bucket.worker_ms,
        "R": bucket.restarts,
    }
    for name, raw in fields.items():
        kind, rest = name[:1], name[2:]
        if not str(raw).isdigit():
            continue
        value = int(raw)
        if kind == "w":
            level, _, index = rest.partition(":")
            if index.isdigit():
                bucket.waits.setdefault(level, {})[int(index)] = value
        elif kind in targets and name[1:2] == ":":
            targets[kind][rest] = value
        elif name == "r":
            bucket.retried = value
        elif name == "g":
            bucket.gap_ms = value
    for member, score in tenants:
        flow = split_flow_member(str(member))
        if flow is not None:
            bucket.tenants[flow] = int(score)
    return bucket


def backlogs(buckets: list[Bucket]) -> list[dict[str, float]]:
    """Each bucket's backlog at its start, per level, from arrivals and services (see
    the module docstring); ``buckets`` oldest first, consecutive or not."""
    running = dict.fromkeys(LEVEL_NAMES, 0)
    lowest = dict.fromkeys(LEVEL_NAMES, 0)
    before: list[dict[str, int]] = []
    for bucket in buckets:
        before.append(dict(running))
        for level in LEVEL_NAMES:
            running[level] += bucket.arrived.get(level, 0) - bucket.served.get(level, 0)
            lowest[level] = min(lowest[level], running[level])
    return [{level: row[level] - lowest[level] for level in LEVEL_NAMES} for row in before]


def clamp_window_min(value: object) -> int:
    """Request input to a window in minutes: 1..``MAX_WINDOW_MIN``, else the default."""
    try:
        minutes = int(str(value))
    except (TypeError, ValueError):
        return DEFAULT_WINDOW_MIN
    return min(MAX_WINDOW_MIN, max(1, minutes))


def summarize(
    buckets: Iterable[Bucket],
    *,
    now_ms: int,
    window_s: int,
    max_wait_ms: int,
    waiting_now: Mapping[str, tuple[int, int | None]] | None = None,
    top_tenants: int = 5,
    weights: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Shares, entitlements, waits and top tenants over the last ``window_s`` seconds.

    Args:
        buckets: every bucket kept (also those before the window: backlogs start there).
        waiting_now: level -> (jobs waiting now, ready ms of the oldest), when known.
        weights: level -> weight (default 4/3/2/1).
    """
    weights = weights or {level.value: w for level, w in DEFAULT_FAIR_WEIGHTS.items()}
    ordered = sorted(buckets, key=lambda bucket: bucket.start_s)
    window_start_s = (now_ms // 1000 - window_s) // BUCKET_S * BUCKET_S + BUCKET_S
    if waiting_now:
        ordered = _with_waiting(ordered, waiting_now, now_ms=now_ms)
    totals = _Totals()
    for bucket, backlog in zip(ordered, backlogs(ordered), strict=True):
        if bucket.start_s >= window_start_s:
            totals.add(bucket, backlog, weights)
    served = totals.served
    known = sum(served[level] for level in LEVEL_NAMES)
    everything = known + served[UNKNOWN]
    top = sorted(totals.tenants.items(), key=lambda item: (-item[1], item[0]))[:top_tenants]
    observed_ms = window_s * 1000
    return {
        "window_s": window_s,
        "bucket_s": BUCKET_S,
        "max_wait_ms": max_wait_ms,
        "served_total": everything,
        "unknown": served[UNKNOWN],
        "retried": totals.retried,
        "gap_ms": totals.gap_ms,
        "coverage": max(0.0, 1 - totals.gap_ms / observed_ms) if observed_ms else None,
        "levels": totals.level_rows(weights, known),
        "tenants": [
            {
                "level": level,
                "tenant": tenant,
                "served": count,
                "share": count / everything if everything else None,
            }
            for (level, tenant), count in top
        ],
        "series": totals.series,
    }


def _level_counts() -> dict[str, int]:
    return dict.fromkeys(LEVEL_NAMES, 0)


@dataclass(slots=True)
class _Totals:
    """What the buckets of a window add up to, per level."""

    served: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys((*LEVEL_NAMES, UNKNOWN), 0)
    )
    entitled: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LEVEL_NAMES, 0.0))
    over: dict[str, int] = field(default_factory=_level_counts)
    worker_ms: dict[str, int] = field(default_factory=_level_counts)
    restarts: dict[str, int] = field(default_factory=_level_counts)
    waits: dict[str, dict[int, int]] = field(
        default_factory=lambda: {level: {} for level in LEVEL_NAMES}
    )
    tenants: dict[tuple[str, str], int] = field(default_factory=dict)
    retried: int = 0
    gap_ms: int = 0
    series: list[dict[str, Any]] = field(default_factory=list)

    def add(
        self, bucket: Bucket, backlog: Mapping[str, float], weights: Mapping[str, float]
    ) -> None:
        """One bucket of the window; ``backlog``: each level's backlog at its start."""
        served = self.served
        for level, count in bucket.served.items():
            served[level if level in served else UNKNOWN] += count
        capacity = sum(bucket.served.get(level, 0) for level in LEVEL_NAMES)
        demands = {level: backlog[level] + bucket.arrived.get(level, 0) for level in LEVEL_NAMES}
        for level, share in max_min(capacity, demands, weights).items():
            self.entitled[level] += share
        for level in LEVEL_NAMES:
            self.over[level] += bucket.over.get(level, 0)
            self.worker_ms[level] += bucket.worker_ms.get(level, 0)
            self.restarts[level] += bucket.restarts.get(level, 0)
            waits = self.waits[level]
            for index, count in bucket.waits.get(level, {}).items():
                waits[index] = waits.get(index, 0) + count
        for key, count in bucket.tenants.items():
            self.tenants[key] = self.tenants.get(key, 0) + count
        self.retried += bucket.retried
        self.gap_ms += bucket.gap_ms
        self.series.append(
            {
                "start_s": bucket.start_s,
                "served": {level: bucket.served.get(level, 0) for level in LEVEL_NAMES},
                "gap_ms": bucket.gap_ms,
            }
        )

    def level_rows(self, weights: Mapping[str, float], known: int) -> dict[str, dict[str, Any]]:
        """Per level: its weight, what it was served and entitled to, its waits."""
        worked_ms = sum(self.worker_ms.values())
        total_weight = sum(weights[level] for level in LEVEL_NAMES)
        levels = {}
        for level in LEVEL_NAMES:
            p50 = percentile(self.waits[level], 0.5)
            p99 = percentile(self.waits[level], 0.99)
            served, entitled = self.served[level], self.entitled[level]
            levels[level] = {
                "weight": weights[level],
                "weight_share": weights[level] / total_weight,
                "served": served,
                "share": served / known if known else None,
                "entitled": round(entitled, 1),
                "entitled_share": entitled / known if known else None,
                "p50_ms": None if p50 is None else round(p50, 1),
                "p99_ms": None if p99 is None else round(p99, 1),
                "over_bound": self.over[level],
                "waits_recorded": sum(self.waits[level].values()),
                # What fairness by time shares out: the workers' time on the level's attempts.
                "worker_s": round(self.worker_ms[level] / 1000, 1),
                "time_share": self.worker_ms[level] / worked_ms if worked_ms else None,
                "retries": self.restarts[level],
            }
        return levels


def _with_waiting(
    ordered: list[Bucket], waiting_now: Mapping[str, tuple[int, int | None]], *, now_ms: int
) -> list[Bucket]:
    """``ordered`` with the jobs still waiting added as arrivals at their level's oldest
    waiting job (in a copy of that bucket, or a new one)."""
    by_start = {bucket.start_s: bucket for bucket in ordered}
    for level, (count, oldest_ms) in waiting_now.items():
        if level not in LEVEL_NAMES or count <= 0:
            continue
        ready_s = (oldest_ms if oldest_ms is not None else now_ms) // 1000
        start_s = max(ready_s // BUCKET_S * BUCKET_S, ordered[0].start_s if ordered else 0)
        bucket = by_start.get(start_s)
        if bucket is None:
            bucket = by_start[start_s] = Bucket(start_s=start_s)
        else:
            bucket = by_start[start_s] = Bucket(
                start_s=bucket.start_s,
                served=bucket.served,
                arrived=dict(bucket.arrived),
                waits=bucket.waits,
                over=bucket.over,
                retried=bucket.retried,
                gap_ms=bucket.gap_ms,
                tenants=bucket.tenants,
            )
        bucket.arrived[level] = bucket.arrived.get(level, 0) + count
    return sorted(by_start.values(), key=lambda bucket: bucket.start_s)


def tenant_window(
    tenant_buckets: Mapping[int, Mapping[str, str]],
    level_buckets: Iterable[Bucket],
    *,
    now_s: int,
    minutes: int,
    bucket_s: int,
) -> dict[str, Any]:
    """One tenant's waits and worker time in one queue over the last ``minutes``: the
    ``bucket_s`` buckets that start within them (so the window reaches back ``minutes``
    whole buckets, the current one included), and its share of each of its levels' worker
    time over the same span.

    Args:
        tenant_buckets: start second -> the tenant's bucket fields (``<bin>`` -> first
            attempts started, ``s:<level>`` -> attempts started, ``t:<level>`` -> worker
            ms), as the loop records them.
        level_buckets: the queue's buckets (their ``served`` and ``worker_ms`` per level).

    Returns p50_ms/p99_ms (``None`` with no wait recorded), the waits counted, per level
    its attempts started, the level's and its share, and per level its worker ms, the
    level's and its share (a share is ``None`` when the level had none).
    """
    first = (now_s // bucket_s - minutes + 1) * bucket_s
    waits: dict[int, int] = {}
    mine: dict[str, int] = {}
    started: dict[str, int] = {}
    for start, fields in tenant_buckets.items():
        if start < first:
            continue
        for name, raw in fields.items():
            if not str(raw).isdigit():
                continue
            if str(name).isdigit():
                waits[int(name)] = waits.get(int(name), 0) + int(raw)
            elif str(name).startswith("t:"):
                mine[name[2:]] = mine.get(name[2:], 0) + int(raw)
            elif str(name).startswith("s:"):
                started[name[2:]] = started.get(name[2:], 0) + int(raw)
    level_ms = dict.fromkeys(mine, 0)
    level_started = dict.fromkeys(started, 0)
    for bucket in level_buckets:
        if bucket.start_s >= first:
            for level in level_ms:
                level_ms[level] += bucket.worker_ms.get(level, 0)
            for level in level_started:
                level_started[level] += bucket.served.get(level, 0)
    return {
        "minutes": minutes,
        "waits": sum(waits.values()),
        "p50_ms": percentile(waits, 0.5),
        "p99_ms": percentile(waits, 0.99),
        "started": {
            level: {"count": count, "level_count": total, "share": _part(count, total)}
            for level, (count, total) in _by_level(started, level_started).items()
        },
        "worker": {
            level: {"ms": ms, "level_ms": total, "share": _part(ms, total)}
            for level, (ms, total) in _by_level(mine, level_ms).items()
        },
    }


def _by_level(mine: Mapping[str, int], totals: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """Level -> (the tenant's, the level's), in rank order, for the levels it has."""
    return {level: (mine[level], totals[level]) for level in LEVEL_NAMES if level in mine}


def _part(part: int, whole: int) -> float | None:
    return part / whole if whole else None
