"""What one page of a queue's history says about its attempts: plain data in, plain data out.

The loop reads BullMQ's events stream a page at a time (``fairqueue.broker.events``);
this module turns the page's starts and ends into what is recorded: per history bucket
the jobs started per level, the bucket each became ready in, their waits and those over
the bound, the most served tenants, worker time and retries (the dashboard's history);
and, with fairness by time (docs/design.md), the run-time estimates the add script
places jobs with and the balance a flow owes for attempts that ran beyond their turns.

Why here and not in Redis: Redis is the one shared, single-threaded part of a BullMQ
deployment. Reading a page into a Lua script cost Redis about 2 µs per stream entry and
the arithmetic as much again (a quarter of fairqueue's whole cost per job); done in the
loop's own process, Redis only serves the reads and applies the page's writes, which are
per bucket and per flow, not per job (``lua/history_commit.lua``, fenced by the leader
lock and the cursor the page was read from, so a page is recorded once or not at all).

The rules are those the Lua recorder applied (kept so the figures stay comparable):

* A start of a first attempt waits from its ready time (``fqReady``, or its timestamp
  plus its delay) to its ``active`` event; a start of a later attempt counts as started
  and retried, with no wait (its timestamp is its first add's).
* An attempt ends at its ``completed`` or ``failed`` event, or, when it failed with
  attempts left, at the ``waiting``/``delayed`` event that re-adds it (a retry). Its
  worker time is the time between its two events (Redis's clock).
* An attempt whose worker died (BullMQ's stalled-job check put the job back: the same
  ``waiting`` event as a retry's, followed by ``stalled``) ends *lost*: started, neither
  completed nor failed, no worker time (Redis learns of the death only when the
  worker's lock expires, up to its ``lockDuration`` later: a time it did not work),
  not a retry (:func:`fold_stalls`).
* With fairness by time each finished attempt, bounded to 1/16..16 times the queue's
  typical run time, moves its flow's estimate (a moving average, alpha 0.2) and the
  typical one (alpha 0.05), and what it used beyond the turns its flow paid at its
  start is the flow's balance, settled a whole turn at a time
  (:func:`fairqueue.scheduling.order.settle_debt`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fairqueue.scheduling.attempt_events import Event, Run, Start, g6
from fairqueue.scheduling.order import (
    MAX_COST_TURNS,
    MIN_COST_TURNS,
    cost_turns,
    turn_scale,
)
from fairqueue.scheduling.wire import flow_member

#: How fast a flow's estimate follows its own runs, and the queue's typical run time
#: (every flow's yardstick, so it moves slowly).
FLOW_ALPHA: Final = 0.2
TYPICAL_ALPHA: Final = 0.05
#: A flow's measured estimate and balance (``c:`` and ``d:`` fields of fq:state) are
#: dropped this long after its last attempt ended, so state does not grow with every
#: tenant that ever ran (a flow that comes back after that starts afresh, as a new one:
#: docs/design.md, "Service is worker time").
FLOW_STATE_IDLE_S: Final = 86_400
#: A flow's first measurement is a page's few runs: only a cost off what its cold jobs
#: paid by more than this factor, either way, places its waiting jobs again at once
#: (equal flows measured on noise would be moved apart); less is left to its charges.
RECOST_BAND: Final = 2**0.5
#: A flow measured first is priced against its peers' runs on the same page (their time
#: per turn they paid, as its own) once there are this many; with fewer, against the
#: typical time as the page found it.
PEER_RUNS: Final = 4
#: The level of a start whose job could not be read (the dashboard shows it as such).
UNKNOWN: Final = "?"


@dataclass(frozen=True, slots=True)
class Settlement:
    """A flow's balance of whole turns to charge now (positive: it ran longer), in tags
    as jobs are placed now (turns times :func:`~fairqueue.scheduling.order.turn_scale`)."""

    member: str
    level: str
    debt: float


@dataclass(frozen=True, slots=True)
class Recost:
    """A flow measured for the first time, whose measured cost is off what its jobs paid
    cold by more than the dead band: its waiting jobs are placed again at ``ratio``
    (measured cost over the cold one, both in tags as placed now), ``shift`` (turns)
    later: the page's settlements of it, paid at once instead of behind its backlog
    (docs/design.md, "Service is worker time"). Also (``ratio`` 1) a flow measured before
    whose cold runs ended on the page with an overrun to settle."""

    member: str
    level: str
    ratio: float
    shift: float


@dataclass(slots=True)
class PageRecord:
    """What a page adds to the history and the scheduling state."""

    recorded: int = 0
    unknown: int = 0
    #: bucket start second -> field -> increment
    buckets: dict[int, dict[str, int]] = field(default_factory=dict)
    #: bucket start second -> '<level>\n<tenant>' -> starts
    tenants: dict[int, dict[str, int]] = field(default_factory=dict)
    started_by_level: dict[str, int] = field(default_factory=dict)
    #: (level, wait ms) of the first attempts started, in stream order
    waits: list[tuple[str, int]] = field(default_factory=list)
    #: level -> (worker ms, retries) of the attempts the page finished
    served: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: runs to forget (ended), then runs to remember (started and not seen to end)
    ended_runs: list[str] = field(default_factory=list)
    started_runs: dict[str, Run] = field(default_factory=dict)
    #: fq:state fields to write (as text), and the flows' charges in order
    state_writes: dict[str, str] = field(default_factory=dict)
    settlements: list[Settlement] = field(default_factory=list)
    #: flows measured for the first time, to be placed again (their settlements moved here)
    recosts: list[Recost] = field(default_factory=list)
    #: tenant bucket (:func:`tenant_bucket`) -> field -> increment: the tenant's waits
    #: (``<bin>`` -> first attempts started), attempts started (``s:<level>``) and worker
    #: time (``t:<level>`` -> ms)
    tenant_rows: dict[str, dict[str, int]] = field(default_factory=dict)


#: Width of a tenant's wait and worker-time buckets (docs/dashboard.md, "The tenant
#: page"): one small hash per tenant and minute in which its jobs started or ran.
TENANT_BUCKET_S: Final = 60


def tenant_bucket(start_s: int, tenant: str) -> str:
    """The name (under the history's key prefix) of a tenant's bucket starting at
    ``start_s``."""
    return f"tw:{start_s}:{tenant}"


def bucket_of(ms: int, bucket_s: int) -> int:
    """The start second of the bucket a moment (ms) falls in."""
    return math.floor(ms / 1000 / bucket_s) * bucket_s


def oldest_bucket(now_s: int, bucket_s: int, retention_s: int) -> int:
    """The oldest bucket still kept at ``now_s``: older ones are not written."""
    return math.floor((now_s - retention_s) / bucket_s) * bucket_s + bucket_s


def gap_buckets(
    from_ms: int, to_ms: int, *, oldest_s: int, since_ms: int, bucket_s: int
) -> dict[int, int]:
    """Milliseconds unobserved per bucket between ``from_ms`` and ``to_ms`` (entries
    trimmed from the stream before the loop read them: their span, never a guess)."""
    from_ms = max(from_ms, oldest_s * 1000, since_ms)
    out: dict[int, int] = {}
    b = bucket_of(from_ms, bucket_s)
    while to_ms > from_ms and b * 1000 < to_ms:
        lo, hi = max(from_ms, b * 1000), min(to_ms, (b + bucket_s) * 1000)
        if hi > lo:
            out[b] = out.get(b, 0) + hi - lo
        b += bucket_s
    return out


def record_page(
    events: Sequence[Event],
    starts: Mapping[str, Start | None],
    runs: Mapping[str, Run],
    state: Mapping[str, float],
    *,
    now_s: int,
    bucket_s: int,
    retention_s: int,
    bound_ms: int,
    by_time: bool,
    wait_bin: Callable[[int], int],
) -> PageRecord:
    """What ``events`` (one page, in stream order) record.

    Args:
        starts: job id -> what its hash said when the page was read (``None``: gone or
            unreadable: counted as started at an unknown level).
        runs: job id -> its run remembered from earlier pages.
        state: the fq:state fields :func:`state_fields` names, as numbers (absent:
            never measured).
        wait_bin: the histogram bin of a wait in ms.
    """
    page = _PageWork(
        runs=runs,
        found=(state.get("typ"), state.get("unit")),
        oldest=oldest_bucket(now_s, bucket_s, retention_s),
        bucket_s=bucket_s,
        bound_ms=bound_ms,
        by_time=by_time,
        wait_bin=wait_bin,
        cache=dict(state),
        typical=state.get("typ"),
    )
    for event in events:
        if event.kind == "start":
            page.started(event, starts.get(event.job_id))
        elif event.kind == "lost":
            page.run_of(event.job_id)  # its worker died: no time, no retry, no charge
        elif event.kind != "stalled":
            page.finished(event.job_id, event.at_ms, event.kind == "retry")
    return page.result()


@dataclass(slots=True)
class _PageWork:
    """:func:`record_page`'s work in progress, one event at a time."""

    runs: Mapping[str, Run]
    #: the typical time and the unit as the page found them (what a cold job paid)
    found: tuple[float | None, float | None]
    oldest: int
    bucket_s: int
    bound_ms: int
    by_time: bool
    wait_bin: Callable[[int], int]
    #: fq:state as read, with what this page wrote so far
    cache: dict[str, float | None]
    typical: float | None
    typical_dirty: bool = False
    out: PageRecord = field(default_factory=PageRecord)
    #: runs started on this page and not seen to end
    pending: dict[str, Run] = field(default_factory=dict)
    ended: dict[str, None] = field(default_factory=dict)
    #: level -> [worker ms, retries]
    served: dict[str, list[int]] = field(default_factory=dict)
    #: flows this page measured for the first time -> [level, runs, their bounded ms,
    #: the turns they paid]
    first: dict[str, list[Any]] = field(default_factory=dict)
    #: flows measured before whose cold runs ended on this page -> their level
    cold_ends: dict[str, str] = field(default_factory=dict)
    #: flow -> the turns its settlements on this page add up to
    settled: dict[str, float] = field(default_factory=dict)
    #: the runs on this page of flows measured before: [their bounded ms, the turns they
    #: paid, how many] (what a turn paid buys now)
    peers: list[float] = field(default_factory=lambda: [0.0, 0.0, 0])

    def add(self, bucket: int, name: str, n: int) -> None:
        if bucket < self.oldest:
            return
        row = self.out.buckets.setdefault(bucket, {})
        row[name] = row.get(name, 0) + n

    def add_tenant(self, at_ms: int, tenant: str, name: str, n: int) -> None:
        """Count into a tenant's bucket (kept like the others: none older than the
        retention)."""
        start = bucket_of(at_ms, TENANT_BUCKET_S)
        if start + TENANT_BUCKET_S <= self.oldest:
            return
        row = self.out.tenant_rows.setdefault(tenant_bucket(start, tenant), {})
        row[name] = row.get(name, 0) + n

    def set_state(self, name: str, value: float) -> None:
        text = g6(value)
        self.cache[name] = float(text)
        self.out.state_writes[name] = text

    def run_of(self, job_id: str) -> Run | None:
        """The run an attempt that ended belongs to, once (a second end is ignored)."""
        run = self.pending.pop(job_id, None)
        if run is not None:
            self.ended[job_id] = None
            return run
        if job_id in self.ended:
            return None
        run = self.runs.get(job_id)
        if run is not None:
            self.ended[job_id] = None
        return run

    def started(self, event: Event, start: Start | None) -> None:
        """An attempt started: counted per level and tenant, its wait if it is the
        job's first, and its run remembered with the turns its flow paid for it."""
        out = self.out
        start_b = bucket_of(event.at_ms, self.bucket_s)
        if start is None or start.level is None:
            out.unknown += 1
            self.add(start_b, f"s:{UNKNOWN}", 1)
            return
        level = start.level
        out.recorded += 1
        self.add(start_b, f"s:{level}", 1)
        self.add_tenant(event.at_ms, start.tenant, f"s:{level}", 1)
        out.started_by_level[level] = out.started_by_level.get(level, 0) + 1
        member = flow_member(level, start.tenant)
        if start_b >= self.oldest:
            counts = out.tenants.setdefault(start_b, {})
            counts[member] = counts.get(member, 0) + 1
        turns, cold = 1.0, False
        if self.by_time and self.typical:
            paid = start.paid if start.paid is not None else start.placed
            if paid is not None and start.first_attempt:
                # Charged against what it paid when placed, in turns of the typical now
                # (not against a later estimate: what a young estimate missed is owed).
                turns = paid / turn_scale(self.typical, self.cache.get("unit"))
                cold = start.paid is not None
            else:
                turns = cost_turns(self.cache.get(f"c:{member}"), self.typical)
        self.pending[event.job_id] = Run(level, start.tenant, event.at_ms, float(g6(turns)), cold)
        if not start.first_attempt:
            self.add(start_b, "r", 1)
            self.add(start_b, f"a:{level}", 1)
            return
        ready = min(start.ready_ms, event.at_ms)
        wait = event.at_ms - ready
        out.waits.append((level, wait))
        self.add(max(bucket_of(ready, self.bucket_s), self.oldest), f"a:{level}", 1)
        self.add(start_b, f"w:{level}:{self.wait_bin(wait)}", 1)
        self.add_tenant(event.at_ms, start.tenant, str(self.wait_bin(wait)), 1)
        if wait > self.bound_ms:
            self.add(start_b, f"o:{level}", 1)

    def finished(self, job_id: str, end_ms: int, retried: bool) -> None:
        """An attempt ended: its worker time per level, a retry counted, and (fairness
        by time) its flow charged."""
        run = self.run_of(job_id)
        if run is None:
            return
        used = max(0, end_ms - run.start_ms)
        self.add(bucket_of(end_ms, self.bucket_s), f"t:{run.level}", used)
        self.add_tenant(end_ms, run.tenant, f"t:{run.level}", used)
        row = self.served.setdefault(run.level, [0, 0])
        row[0] += used
        if retried:
            self.add(bucket_of(end_ms, self.bucket_s), f"R:{run.level}", 1)
            row[1] += 1
        if self.by_time:
            self.charge(run, used)

    def charge(self, run: Run, used: int) -> None:
        """Move the flow's balance by what the attempt used beyond the turns it paid
        (a whole turn or more is settled now), and the estimates on."""
        member = flow_member(run.level, run.tenant)
        typical = self.typical
        bounded: float = used
        if typical:
            bounded = min(max(used, typical * MIN_COST_TURNS), typical * MAX_COST_TURNS)
            debt = (self.cache.get(f"d:{member}") or 0) + bounded / typical - run.turns
            if abs(debt) >= 1:
                # In tags as the add script places now: turns of the typical time now.
                scale = turn_scale(typical, self.cache.get("unit"))
                self.out.settlements.append(Settlement(member, run.level, debt * scale))
                self.settled[member] = self.settled.get(member, 0.0) + debt
                debt = 0
            self.set_state(f"d:{member}", debt)
            self.typical = typical + TYPICAL_ALPHA * (bounded - typical)
        else:
            self.typical = max(bounded, 1)
        self.typical_dirty = True
        estimate = self.cache.get(f"c:{member}")
        first = self.first.get(member)
        if estimate is None:
            first = self.first[member] = [run.level, 0, 0.0, 0.0]
        if first is not None:
            first[1] += 1
            first[2] += bounded
            first[3] += run.turns
        else:
            if typical:
                self.peers[0] += bounded
                self.peers[1] += run.turns
                self.peers[2] += 1
            if run.cold:
                self.cold_ends[member] = run.level
        estimate = bounded if estimate is None else estimate + FLOW_ALPHA * (bounded - estimate)
        self.set_state(f"c:{member}", estimate)

    def whole(self, merged: Settlement) -> Settlement:
        """A flow's settlements of this page as one that moves whole turns: an overrun
        and an underrun that nearly cancel leave their remainder in its balance instead
        (the balance carries under one turn either way), and a remainder that takes the
        balance to a turn or more is settled with it, at the turn's length now."""
        turns = self.settled.get(merged.member, 0.0)
        if abs(turns) >= 1:
            return merged
        balance = (self.cache.get(f"d:{merged.member}") or 0) + turns
        if abs(balance) < 1:
            self.set_state(f"d:{merged.member}", balance)
            return Settlement(merged.member, merged.level, 0.0)
        self.set_state(f"d:{merged.member}", 0)
        scale = turn_scale(self.typical or 1.0, self.cache.get("unit"))
        return Settlement(merged.member, merged.level, merged.debt + (balance - turns) * scale)

    def result(self) -> PageRecord:
        out = self.out
        out.ended_runs = list(self.ended)
        out.started_runs = self.pending
        if self.typical_dirty and self.typical is not None:
            out.state_writes["typ"] = g6(self.typical)
            if self.cache.get("unit") is None:  # the first measurement: a turn's length
                out.state_writes["unit"] = out.state_writes["typ"]
        out.served = {level: (row[0], row[1]) for level, row in self.served.items()}
        # One settlement a flow a page: each moves its waiting jobs (history_commit.lua),
        # one move at a time.
        merged: dict[str, Settlement] = {}
        for s in out.settlements:
            was = merged.get(s.member)
            merged[s.member] = Settlement(s.member, s.level, s.debt + (was.debt if was else 0))
        out.settlements = [self.whole(s) for s in merged.values()]
        out.settlements = [s for s in out.settlements if s.debt]
        if self.first and self.typical:
            self.recost(out, self.typical)
        for member, level in self.cold_ends.items():
            # A cold run that ended after its flow's first measurement (the history's lag):
            # its overrun is paid at once too, by shifting the flow's waiting jobs.
            shift = sum(s.debt for s in out.settlements if s.member == member)
            if shift > 0:
                out.settlements = [s for s in out.settlements if s.member != member]
                out.recosts.append(Recost(member, level, 1.0, shift))
        return out

    def recost(self, out: PageRecord, typical: float) -> None:
        """The flows measured first on this page whose cost is off the cold one: a
        :class:`Recost` each, with the page's settlements of them folded in. The cold
        cost is a turn as long as the page found it (a job placed cold paid that, as
        long as a turn was then: the typical time moves 5% a run), or one turn when the
        queue had nothing measured (the unit is then the first typical time)."""
        was = self.found
        paid = turn_scale(was[0], was[1]) if was[0] else 1.0
        unit = self.cache.get("unit")
        now = turn_scale(typical, unit if unit is not None else typical)
        peer_ms, peer_turns, peer_runs = self.peers
        for member, (level, n, total_ms, turns) in self.first.items():
            # the mean of its runs on the page, not the moving average seeded by the first
            if peer_runs >= PEER_RUNS and peer_turns > 0 and turns > 0:
                # its time per turn paid against its peers': their jobs waiting paid in
                # the same currency as its cold ones, so a drift of every run time (the
                # machine's load) moves it no more than them
                ratio = cost_turns(total_ms / turns, peer_ms / peer_turns)
            else:
                ratio = cost_turns(total_ms / n, typical) * now / paid
            if 1 / RECOST_BAND < ratio < RECOST_BAND:
                continue  # within the noise: its runs' charges settle it, as any flow's
            shift = sum(s.debt for s in out.settlements if s.member == member)
            out.settlements = [s for s in out.settlements if s.member != member]
            out.recosts.append(Recost(member, level, float(g6(ratio)), shift))
