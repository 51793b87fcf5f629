"""What tenants consume, live: attempts and worker time, plain BullMQ against fairqueue
with its loop, side by side in one run (SPEC decisions 11 and 12).

The parts are those of ``benchmarks/fairness.py``: Redis, a stock Node BullMQ 6.7 worker
(``benchmarks/fairness_worker.mjs``, which runs each job ``data.runMs`` and fails its
first ``data.failTimes`` attempts), open-loop Python producers, and for ``fairqueue`` the
real ``manage.py rebalance_fair`` loop. ``plain`` is BullMQ's priority ladder with seed
2's numbers and the same job options (``attempts``, ``backoff``).

Scenarios (every flow backlogged, so the shares are the schedulers' choice):

1. ``retry-storm``          - critical c1, normal ``healthy`` and ``failing`` (each job
   fails 3 times, ``attempts=4``, no backoff): every flow's share of the *attempts* run
   against its weight share (critical 4/6, each normal tenant 1/6).
2. ``retry-storm-backoff``  - the same with ``backoff={"type": "exponential", "delay": 20}``.
3. ``retry-storm-ok``       - the same load, the failing tenant's jobs succeeding at once:
   the healthy tenant's wait here is what the storm's is held against.
4. ``slow-tenant``          - normal ``quick`` and ``slow`` (jobs 10x as long), each asking
   for twice its share of the workers' time: shares of the *worker time* (target 50/50).
5. ``slow-flood``           - the same, the slow tenant asking for ten times its share of
   *jobs* as well: fairness by time keeps 50/50 of the time, ``fairqueue-jobs``
   (``FAIRNESS_BY="jobs"``) 50/50 of the attempts (so ~91% of the time to the slow one).
6. ``mixed-levels``         - four levels with job lengths 1x, 3x, 0.5x, 2x, each asking
   for twice its share: worker-time shares against 40/30/20/10.

Measured over the window [start + ``--warmup-s``, end of arrivals]: attempts started
(the worker's ``processedOn``) and worker time (``finishedOn - processedOn``) per flow;
waits of first attempts (``processedOn - timestamp``) per flow, p50/p99.

    python benchmarks/attempts.py [--scenario retry-storm ...] [--seconds 20]
        [--run-ms 10] [--concurrency 4] [--warmup-s 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import REDIS_URL, delete_prefix  # noqa: E402
from benchmarks.fairness import (  # noqa: E402
    JOB_TYPE,
    LOG,
    OUT,
    PLAIN_PRIORITY,
    QUEUE,
    TICK_S,
    WEIGHTS,
    NodeWorker,
    _stop_process,
    calibrate,
    fair_env,
    setup_django,
    start_loop,
    wait_for_loop,
)

#: "fairqueue-jobs" is fairqueue with FAIRNESS_BY="jobs" (seed 1's job count), the loop
#: and the producer alike: with it the slow tenant gets equal *jobs*, not equal time.
SCHEDULERS = ("plain", "fairqueue", "fairqueue-jobs")
FAIRNESS_BY = {"fairqueue": "time", "fairqueue-jobs": "jobs"}


@dataclass(frozen=True)
class Flow:
    """An open-loop stream of ``rate`` jobs a second of one (level, tenant), each running
    ``run_x`` times the base run time and failing its first ``fail_times`` attempts."""

    level: str
    tenant: str
    rate: float
    run_x: float = 1.0
    fail_times: int = 0

    @property
    def key(self) -> str:
        return f"{self.level}/{self.tenant}"


@dataclass(frozen=True)
class Scenario:
    name: str
    flows: tuple[Flow, ...]
    measure: str  # "attempts" or "time"
    attempts: int | None = None
    backoff: dict[str, Any] | None = None


def build_scenarios(capacity: float) -> dict[str, Scenario]:
    c = capacity
    storm = (
        Flow("critical", "c1", 1.0 * c),
        Flow("normal", "healthy", 0.5 * c),
        Flow("normal", "failing", 0.5 * c, fail_times=3),
    )
    ok = tuple(Flow(f.level, f.tenant, f.rate) for f in storm)
    lengths = {"critical": 1.0, "high": 3.0, "normal": 0.5, "low": 2.0}
    scenarios = (
        Scenario("retry-storm", storm, "attempts", attempts=4),
        Scenario(
            "retry-storm-backoff",
            storm,
            "attempts",
            attempts=4,
            backoff={"type": "exponential", "delay": 20},
        ),
        Scenario("retry-storm-ok", ok, "attempts", attempts=4),
        # Each flow asks for twice its share of the workers' time: every flow backlogged,
        # and backlogs that grow slowly enough for the window to see placements made with
        # measured costs (at 4x overload it would mostly see the cold start's).
        Scenario(
            "slow-tenant",
            (
                Flow("normal", "quick", 2 * 0.5 * c),
                Flow("normal", "slow", 2 * 0.5 * c / 10, run_x=10.0),
            ),
            "time",
        ),
        # The slow tenant asks for ten times its share of jobs too: with FAIRNESS_BY="jobs"
        # (seed 1's count) both flows get equal attempts, so the slow one most of the time.
        Scenario(
            "slow-flood",
            (
                Flow("normal", "quick", 2 * 0.5 * c),
                Flow("normal", "slow", 0.5 * c, run_x=10.0),
            ),
            "time",
        ),
        Scenario(
            "mixed-levels",
            tuple(
                Flow(
                    level,
                    f"{level[0]}1",
                    2 * WEIGHTS[level] / 10 * c / lengths[level],
                    run_x=lengths[level],
                )
                for level in lengths
            ),
            "time",
        ),
    )
    return {s.name: s for s in scenarios}


def entitled(scenario: Scenario) -> dict[str, float]:
    """Each flow's weight share: its level's weight, split equally among the level's
    flows (every flow is backlogged)."""
    per_level: dict[str, int] = defaultdict(int)
    for flow in scenario.flows:
        per_level[flow.level] += 1
    total = sum(WEIGHTS[level] for level in per_level)
    return {f.key: WEIGHTS[f.level] / total / per_level[f.level] for f in scenario.flows}


# -- one run ------------------------------------------------------------------------------


@dataclass
class Result:
    scheduler: str
    scenario: Scenario
    attempts: dict[str, int] = field(default_factory=dict)
    worker_ms: dict[str, float] = field(default_factory=dict)
    waits: dict[str, list[int]] = field(default_factory=dict)
    runs: int = 0
    duplicates: int = 0

    def share(self, key: str) -> float:
        values = self.attempts if self.scenario.measure == "attempts" else self.worker_ms
        total = sum(values.values())
        return values.get(key, 0) / total if total else 0.0


class Producer:
    def __init__(self, scheduler: str, scenario: Scenario, args: argparse.Namespace, db) -> None:
        self.scheduler, self.scenario, self.args, self.db = scheduler, scenario, args, db
        self.flow_of: dict[str, str] = {}

    def _data(self, flow: Flow) -> dict[str, Any]:
        data: dict[str, Any] = {"runMs": round(self.args.run_ms * flow.run_x, 3)}
        if flow.fail_times:
            data["failTimes"] = flow.fail_times
        return data

    async def run(self, prefix: str) -> None:
        queue = None
        if self.scheduler == "plain":
            from bullmq import Queue

            queue = Queue(QUEUE, {"connection": REDIS_URL, "prefix": prefix})
        flows = self.scenario.flows
        sent = [0] * len(flows)
        start = time.monotonic()
        try:
            while (elapsed := time.monotonic() - start) < self.args.seconds:
                for index, flow in enumerate(flows):
                    count = min(int(flow.rate * elapsed) + 1 - sent[index], 1000)
                    if count > 0:
                        ids = await self._add(queue, flow, count)
                        sent[index] += count
                        for job_id in ids:
                            self.flow_of[job_id] = flow.key
                await asyncio.sleep(TICK_S)
        finally:
            if queue is not None:
                await queue.close()

    async def _add(self, queue: Any, flow: Flow, count: int) -> list[str]:
        options: dict[str, Any] = {}
        if self.scenario.attempts:
            options["attempts"] = self.scenario.attempts
        if self.scenario.backoff:
            options["backoff"] = self.scenario.backoff
        if queue is not None:
            data = {"tenantId": flow.tenant, "priorityLevel": flow.level, **self._data(flow)}
            opts = {"priority": PLAIN_PRIORITY[flow.level], **options}
            jobs = await queue.addBulk(
                [{"name": JOB_TYPE, "data": data, "opts": opts} for _ in range(count)]
            )
            return [str(job.id) for job in jobs]

        def add() -> list[str]:
            from fairqueue import enqueue_jobs

            return [
                job.job_id
                for job in enqueue_jobs(
                    JOB_TYPE,
                    [self._data(flow)] * count,
                    tenant_id=flow.tenant,
                    priority_level=flow.level,
                    **options,
                )
            ]

        return await asyncio.get_running_loop().run_in_executor(self.db, add)


def run_one(scheduler: str, scenario: Scenario, args: argparse.Namespace, db) -> Result:
    from django.conf import settings

    from fairqueue import conf
    from fairqueue.broker import close_brokers

    prefix = f"fqbench-{uuid.uuid4().hex[:12]}"
    os.environ.update(fair_env(prefix, args))
    fairness_by = FAIRNESS_BY.get(scheduler, "time")
    os.environ["FQBENCH_FAIRNESS_BY"] = fairness_by  # the loop's (fairness_settings)
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "FAIRNESS_BY": fairness_by}  # the producer's
    db.submit(conf.reload_settings).result()
    worker = loop = None
    OUT.mkdir(parents=True, exist_ok=True)
    result = Result(scheduler, scenario)
    with LOG.open("a") as log:
        log.write(f"--- attempts {scenario.name} / {scheduler} ({prefix})\n")
        log.flush()
        try:
            if scheduler in FAIRNESS_BY:
                loop = start_loop(prefix, args, log)
            worker = NodeWorker(prefix, args, log)
            if loop is not None and not wait_for_loop(prefix, loop):
                raise SystemExit(f"the rebalance loop did not take its lock; see {LOG}")
            producer = Producer(scheduler, scenario, args, db)
            t0 = time.time() * 1000
            asyncio.run(producer.run(prefix))
            t_end = time.time() * 1000
            worker.stop()
            window = (t0 + args.warmup_s * 1000, t_end)
            seen: dict[tuple[str, int], int] = defaultdict(int)
            for record in worker.records:
                key = producer.flow_of.get(str(record["id"]))
                started, finished = record.get("p"), record.get("f")
                if key is None or started is None or finished is None:
                    continue
                seen[(str(record["id"]), int(record.get("a", 0)))] += 1
                if not window[0] <= started <= window[1]:
                    continue
                result.runs += 1
                result.attempts[key] = result.attempts.get(key, 0) + 1
                result.worker_ms[key] = result.worker_ms.get(key, 0.0) + (finished - started)
                if int(record.get("a", 0)) == 0:
                    result.waits.setdefault(key, []).append(started - record["ts"])
            result.duplicates = sum(1 for n in seen.values() if n > 1)
        finally:
            if worker is not None:
                worker.stop()
            if loop is not None:
                _stop_process(loop)
            db.submit(close_brokers).result()
            close_brokers()
            delete_prefix(prefix)
    return result


# -- report -------------------------------------------------------------------------------


def _p(values: Sequence[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_results(results: dict[str, dict[str, Result]]) -> None:
    print()
    print(
        f"{'scenario':<20} {'flow':<18} {'target':>7} "
        + " ".join(f"{s + ' share':>16} {'ratio':>6} {'p99 wait ms':>11}" for s in SCHEDULERS)
    )
    for name, by_scheduler in results.items():
        scenario = next(iter(by_scheduler.values())).scenario
        target = entitled(scenario)
        what = "attempts" if scenario.measure == "attempts" else "worker time"
        print(f"{name} ({what})")
        for flow in scenario.flows:
            cells = []
            for scheduler in SCHEDULERS:
                result = by_scheduler.get(scheduler)
                if result is None:
                    cells.append(f"{'-':>16} {'-':>6} {'-':>11}")
                    continue
                share = result.share(flow.key)
                p99 = _p(result.waits.get(flow.key, []), 0.99)
                cells.append(
                    f"{share:>16.1%} {share / target[flow.key]:>6.2f} "
                    f"{'-' if p99 is None else f'{p99:.0f}':>11}"
                )
            print(f"{'':<20} {flow.key:<18} {target[flow.key]:>7.1%} " + " ".join(cells))
        for scheduler in SCHEDULERS:
            result = by_scheduler.get(scheduler)
            if result is not None:
                print(
                    f"{'':<20} {scheduler}: {result.runs} attempts in the window, "
                    f"{result.duplicates} attempts reported twice"
                )
                if scenario.measure == "time":
                    counts = sum(result.attempts.values()) or 1
                    print(
                        f"{'':<20} {scheduler}: attempt shares "
                        + ", ".join(
                            f"{f.key} {result.attempts.get(f.key, 0) / counts:.1%}"
                            for f in scenario.flows
                        )
                    )
    storm, ok = results.get("retry-storm"), results.get("retry-storm-ok")
    if storm and ok and "fairqueue" in storm and "fairqueue" in ok:
        p99_storm = _p(storm["fairqueue"].waits.get("normal/healthy", []), 0.99)
        p99_ok = _p(ok["fairqueue"].waits.get("normal/healthy", []), 0.99)
        if p99_storm is not None and p99_ok:
            print(
                f"\nfairqueue: the healthy tenant's p99 wait in the storm is "
                f"{p99_storm / p99_ok:.2f}x what it is when the failing tenant's jobs succeed"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="arrivals per run (s)")
    parser.add_argument("--run-ms", type=float, default=10.0, help="the base job run time")
    parser.add_argument("--concurrency", type=int, default=4, help="the Node worker's")
    parser.add_argument("--interval-ms", type=int, default=250, help="rebalance interval")
    parser.add_argument("--bound-ms", type=int, default=60_000, help="QUEUE_FAIR_MAX_WAIT_MS")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="left out of the window")
    parser.add_argument("--scenario", action="append", help="run only these (repeatable)")
    parser.add_argument("--scheduler", action="append", choices=SCHEDULERS)
    args = parser.parse_args(argv)
    if args.seconds <= args.warmup_s + 1:
        parser.error("--seconds must be more than --warmup-s + 1")
    names = args.scenario or list(build_scenarios(1.0))
    unknown = sorted(set(names) - set(build_scenarios(1.0)))
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}: expected {sorted(build_scenarios(1.0))}")
    db: ThreadPoolExecutor = setup_django()
    capacity, alone, _ = calibrate(args, db)
    print(f"capacity: {capacity:.0f} jobs/s at {args.run_ms:g} ms (alone {alone:.0f})")
    scenarios = build_scenarios(capacity)
    results: dict[str, dict[str, Result]] = {}
    for name in names:
        for scheduler in args.scheduler or SCHEDULERS:
            print(f"running {name} / {scheduler} ...", flush=True)
            results.setdefault(name, {})[scheduler] = run_one(scheduler, scenarios[name], args, db)
    print_results(results)
    spread = [
        abs(r.share(f.key) / entitled(r.scenario)[f.key] - 1)
        for by in results.values()
        for s, r in by.items()
        if s == "fairqueue" and r.scenario.name != "retry-storm-ok"
        for f in r.scenario.flows
    ]
    if spread:
        print(
            f"fairqueue: the worst flow is {max(spread):.1%} from its share (median "
            f"{statistics.median(spread):.1%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
