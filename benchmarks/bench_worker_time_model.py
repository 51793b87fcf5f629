"""Fairness by worker time in the model, with no machine noise: the placement rule
(``fairqueue.scheduling.fair_clock.FairClock``) and the history step's estimates and charges
(``fairqueue.scheduling.attempts.record_page``, a page every 250 ms) driving a
simulated pool of workers, deterministic (seeded), so a change of the rule shows as a
change of shares, not of the machine's load. The live benchmark
(``benchmarks/bench_attempts.py``, scenarios ``slow-tenant`` and ``slow-flood``) is the
same load with real parts, and noisy on a loaded machine.

Scenarios, two tenants of ``normal`` beside each other; the slow one's fair share is what
it asks, at most half the worker time (the quick one floods):

* ``slow-tenant``  - a quick flood at the pool's capacity, and a tenant whose jobs run 6x
  as long asking its own share twice over;
* ``slow-flood``   - the slow tenant (10x) floods too (whole run measured);
* ``slow-emptying`` - the slow tenant (6x) asks 0.8 of its share in jobs, so with run-time
  jitter and overhead its queue keeps emptying while it asks a little over half.

Each runs with the rule as it was, approximately (``before``: a settlement moves only its
flow's last tag, an attempt is charged against its flow's estimate at its start; the
first measurement as now) and as it is
(``now``: each attempt charged against what its job paid when placed, a settlement moving
its flow's waiting jobs at once both ways, ``FairClock.charge``); a cold flow's first
measurement places its waiting jobs again in both (``FairClock.recost``; now also when
it was measured cheaper than it paid).

    python benchmarks/bench_worker_time_model.py [--jitter 0.6] [--overhead-ms 8]
        [--lag-ms 0] [--seconds 20] [--seed N]

``--jitter`` is the sigma of a lognormal factor on each run time, ``--overhead-ms`` is
added to every run, ``--lag-ms`` is how far behind the stream the history step reads.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairqueue.scheduling.attempt_events import Event, Run, Start  # noqa: E402
from fairqueue.scheduling.attempts import record_page  # noqa: E402
from fairqueue.scheduling.fair_clock import FairClock  # noqa: E402
from fairqueue.scheduling.levels import PriorityLevel  # noqa: E402
from fairqueue.scheduling.order import (  # noqa: E402
    cost_turns,
    replaced_tag,
    turn_scale,
)

N = PriorityLevel.NORMAL
WORKERS = 4
BASE_MS = 10.0
PAGE_MS = 250.0


def simulate(
    flows: Sequence[tuple[str, float, float]],
    now_rule: bool,
    args: argparse.Namespace,
    window: tuple[float, float],
) -> dict[str, float]:
    """Worker-time shares in ``window`` (s) of ``flows`` (tenant, jobs/s, run time x)."""
    clock = FairClock()
    rng = random.Random(args.seed)
    state: dict[str, float] = {}
    # [tag, seq, tenant, run ms, paid cold, paid by estimate]: a re-placement moves the
    # tag and the paid
    waiting: list[list[Any]] = []
    running: list[tuple[float, str, str, float]] = []
    events: list[Event] = []
    starts: dict[str, Start | None] = {}
    runs: dict[str, Run] = {}
    next_arrival = dict.fromkeys((tenant for tenant, _, _ in flows), 0.0)
    used = dict.fromkeys(next_arrival, 0.0)
    free, seq, now, next_page = WORKERS, 0, 0.0, PAGE_MS
    while now < args.seconds * 1000:
        for tenant, rate, run_x in flows:
            while next_arrival[tenant] <= now:
                typical, estimate = state.get("typ"), state.get(f"c:normal\n{tenant}")
                scale = turn_scale(typical, state.get("unit"))
                paid = placed = None
                if typical and estimate is not None:
                    cost = cost_turns(estimate, typical) * scale
                    placed = cost if now_rule else None  # fqCost
                else:  # cold: one turn, and what it paid is kept for its charge
                    cost = paid = scale if typical else 1.0
                seq += 1
                tag = clock.place(N, tenant, cost=cost)
                heapq.heappush(waiting, [tag, seq, tenant, BASE_MS * run_x, paid, placed])
                clock.observe_head(waiting[0][0], N)
                next_arrival[tenant] += 1000.0 / rate
        while running and running[0][0] <= now:
            end, job_id, tenant, began = heapq.heappop(running)
            events.append(Event("end", job_id, int(end), ok=True))
            lo, hi = max(began, window[0] * 1000), min(end, window[1] * 1000)
            used[tenant] += max(0.0, hi - lo)
            free += 1
        while free and waiting:
            _, number, tenant, run_ms, paid, placed = heapq.heappop(waiting)
            if waiting:
                clock.observe_head(waiting[0][0], N)
            job_id = str(number)
            events.append(Event("start", job_id, int(now)))
            starts[job_id] = Start("normal", tenant, int(now), True, paid, placed)
            took = (run_ms + args.overhead_ms) * rng.lognormvariate(0, args.jitter)
            heapq.heappush(running, (now + took, job_id, tenant, now))
            free -= 1
        if now >= next_page:
            seen = [e for e in events if e.at_ms <= now - args.lag_ms]
            events = [e for e in events if e.at_ms > now - args.lag_ms]
            page_starts = {e.job_id: starts.pop(e.job_id) for e in seen if e.kind == "start"}
            page = record_page(
                seen,
                page_starts,
                runs,
                state,
                now_s=int(now / 1000),
                bucket_s=10,
                retention_s=3600,
                bound_ms=3000,
                by_time=True,
                wait_bin=lambda wait: 0,
            )
            for job_id in page.ended_runs:
                runs.pop(job_id, None)
            runs.update(page.started_runs)
            state.update({name: float(text) for name, text in page.state_writes.items()})
            moves = [
                (tenant, clock.charge(N, tenant, s.debt) if now_rule else _charge_tail(clock, s))
                for s in page.settlements
                for tenant in [s.member.split("\n", 1)[1]]
            ]
            moves += [
                (tenant, clock.recost(N, tenant, r.ratio, r.shift))
                for r in page.recosts
                for tenant in [r.member.split("\n", 1)[1]]
            ]
            for tenant, moved in moves:
                if moved is None:
                    continue
                anchor, ratio, shift, upto = moved
                for item in waiting:  # reweight_page.lua's pages, all at once
                    if item[2] == tenant and anchor < item[0] <= upto:
                        item[0] = replaced_tag(item[0], anchor, ratio, shift)
                        item[4] = item[4] * ratio if item[4] is not None else None
                heapq.heapify(waiting)
            next_page += PAGE_MS
        now += 1.0
    total = sum(used.values()) or 1.0
    return {tenant: ms / total for tenant, ms in used.items()}


def _charge_tail(clock: FairClock, settlement: Any) -> None:
    """The rule before: a settlement moved only its flow's last tag."""
    clock.charge(N, settlement.member.split("\n", 1)[1], settlement.debt)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--jitter", type=float, default=0.6)
    parser.add_argument("--overhead-ms", type=float, default=8.0)
    parser.add_argument("--lag-ms", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=7, help="of the run-time jitter")
    args = parser.parse_args(argv)
    capacity = WORKERS * 1000 / BASE_MS  # jobs/s of the base run time
    scenarios = {
        "slow-tenant": ([("quick", capacity, 1.0), ("slow", capacity / 6, 6.0)], (5.0, None)),
        "slow-flood": ([("quick", capacity, 1.0), ("slow", capacity / 2, 10.0)], (0.0, None)),
        "slow-emptying": (
            [("quick", capacity, 1.0), ("slow", 0.8 * capacity / 12, 6.0)],
            (5.0, None),
        ),
    }
    print(f"{'scenario':<16} {'rule':<7} {'quick':>7} {'slow':>7} {'fair':>6} {'slow/fair':>9}")
    for name, (flows, (begin, _)) in scenarios.items():
        # The slow tenant's max-min share beside a quick flood: what it asks (its rate
        # times its mean run time, of the pool's time), at most half.
        _, rate, run_x = flows[1]
        mean_ms = (BASE_MS * run_x + args.overhead_ms) * math.exp(args.jitter**2 / 2)
        fair = min(0.5, rate * mean_ms / (WORKERS * 1000))
        for label, now_rule in (("before", False), ("now", True)):
            shares = simulate(flows, now_rule, args, (begin, args.seconds))
            print(
                f"{name:<16} {label:<7} {shares['quick']:>7.1%} {shares['slow']:>7.1%} "
                f"{fair:>6.1%} {shares['slow'] / fair:>9.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
