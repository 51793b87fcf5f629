"""Fairness under load: plain BullMQ priorities, seed 1's occupancy policy and fairqueue,
side by side in one run, on a real Redis with a real (stock) BullMQ worker.

Schedulers (same workload, same worker, one after the other, each in its own prefix):

* ``plain``     - ``bullmq.Queue.addBulk`` with seed 2's numbers (critical=1, high=3,
  normal=5, low=10) and nothing else: BullMQ's strict priority ladder, FIFO within.
* ``occupancy`` - seed 1's literal policy: jobs enqueued with ``enqueue_jobs`` and, every
  interval, the whole waiting set ordered by ``scheduler.order_by_occupancy`` (largest
  waiting/weight first, overdue jobs first) and written with the broker's
  ``set_priorities`` into the window band, as fairqueue's own pass does (same priority
  plan, same writes). Only the ordering function differs from ``fairqueue``.
* ``fairqueue`` - ``enqueue_jobs`` plus ``rebalance.arebalance_queue`` every interval.

Scenarios (floods are closed-loop: a source keeps N jobs waiting, so its level stays
backlogged and the service shares show the scheduler, not the arrival rates):

* ``backlogged``   - all four levels backlogged with the same number of jobs each.
* ``flood``        - a large critical backlog and a little low work.
* ``trickle``      - one critical job always present (topped up as soon as it is
  taken), low backlogged.
* ``tenant-flood`` - one tenant keeps a large normal backlog; four quiet tenants of the
  same level send a few jobs a second.
* ``tenant-pair``  - two tenants keep equal normal backlogs (SPEC decision 8's "fewest
  waiting jobs first" rule between tenants that flood alike).

The level-share scenarios give each level a single tenant, so the tenant rule does not
mix into the level shares; the two tenant scenarios measure it on its own.

Everything is scaled down so the run takes a few minutes: jobs run ``--run-ms`` (3 ms),
the wait bound is ``--bound-ms`` (3 s instead of 5 min), passes run every
``--interval-ms`` (250 ms instead of 5 s), and backlogs are sized from the worker's
measured throughput so that fair waits stay well under the bound.

Reported per level: share of the worker's service against the fair share (weights
4:3:2:1 among the levels that had work waiting, computed per 1 s window by weighted
max-min and summed), p50/p99/max wait, jobs that waited longer than the bound, jobs
still waiting at the end and already older than the bound. Per scenario and scheduler:
Jain's fairness index over tenants, of each tenant's service divided by its fair share
(hierarchical weighted max-min: levels by weight, then tenants equally), averaged over
1 s windows - 1.0 is perfectly fair, 1/n is one tenant getting everything.

    python benchmarks/fairness.py [--seconds 15] [--scenario flood ...]
        [--interval-ms 250 --bound-ms 3000]

A pass restarts the virtual clock (the policy is stateless), so each pass the lightest
backlogged level can lose the fraction of a turn it was owed: at ~40 jobs a pass that
is visible (low ~9% instead of 10%), at ~200 a pass it is not (``--interval-ms 1000
--bound-ms 12000``: shares within 2%). Keep the bound at several intervals, or backlogs
sized for fair waits under the bound drain within one pass (a warning says so).

Writes ``benchmarks/out/fairness.png`` (cumulative service per level over time).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import REDIS_URL, delete_prefix  # noqa: E402

JOB_TYPE = "bench"
QUEUE = "bench"
LEVELS = ("critical", "high", "normal", "low")
WEIGHTS = {"critical": 4, "high": 3, "normal": 2, "low": 1}
PLAIN_PRIORITY = {"critical": 1, "high": 3, "normal": 5, "low": 10}
SCHEDULERS = ("plain", "occupancy", "fairqueue")
COLORS = {"critical": "tab:red", "high": "tab:orange", "normal": "tab:blue", "low": "tab:green"}
#: Producer tick: how soon a taken job is replaced in a closed-loop source.
TICK_S = 0.004
#: The first seconds (backlogs filling, first passes) are left out of the metrics.
WARMUP_S = 1.5
WINDOW_S = 1.0
UNBOUNDED = 1e12


# -- the worker (a separate process, no Django) -------------------------------------------


def started_key(prefix: str) -> str:
    return f"{prefix}:{QUEUE}:bench-started"


async def _worker_main(prefix: str, run_ms: float) -> None:
    """A stock bullmq Worker, concurrency 1. Each job bumps its source's counter (so the
    producer can keep closed-loop backlogs topped up) and then takes ``run_ms``."""
    import redis.asyncio as aioredis
    from bullmq import Worker

    client = aioredis.from_url(REDIS_URL)
    key = started_key(prefix)

    async def process(job: Any, token: str) -> None:
        await client.hincrby(key, job.data.get("src", "?"), 1)
        await asyncio.sleep(run_ms / 1000)

    worker = Worker(
        QUEUE,
        process,
        {"connection": REDIS_URL, "prefix": prefix, "concurrency": 1, "autorun": False},
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    run = asyncio.ensure_future(worker.run())
    # Ready once it blocks waiting for a job (the queue is empty until we say so), so a
    # slow start-up never counts against a scheduler.
    deadline = time.monotonic() + 20
    while worker.waiting is None and not run.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await stop.wait()
    await worker.close()
    await asyncio.gather(run, return_exceptions=True)
    await client.aclose()


WORKER_LOG = ROOT / "benchmarks" / "out" / "worker.log"


def start_worker(prefix: str, run_ms: float) -> subprocess.Popen[str]:
    WORKER_LOG.parent.mkdir(parents=True, exist_ok=True)
    with WORKER_LOG.open("a") as log:
        process = subprocess.Popen(
            [sys.executable, __file__, "--worker", prefix, "--run-ms", str(run_ms)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    if process.stdout is None or process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError(f"the benchmark worker did not start; see {WORKER_LOG}")
    return process


def stop_worker(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.returncode not in (0, -signal.SIGKILL):
        print(f"warning: the worker exited with {process.returncode}; see {WORKER_LOG}")


# -- workload -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A stream of jobs of one (level, tenant): keep ``backlog`` waiting, or add
    ``rate`` jobs a second."""

    level: str
    tenant: str
    backlog: int = 0
    rate: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.level}/{self.tenant}"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    sources: tuple[Source, ...]


def build_scenarios(throughput: float, bound_s: float) -> dict[str, Scenario]:
    """Backlogs sized from the measured ``throughput`` (jobs/s).

    A backlog of ``throughput * share * t`` jobs waits about ``t`` under fair service. The
    level-share scenarios give each level one tenant (the tenant rule is measured on its
    own, in ``tenant-flood`` and ``tenant-pair``) and keep fair waits at 0.4-0.5 of the
    bound, and every flooded level holds a few passes' worth of its share, so a pass
    never runs out of any level before the next one.
    """

    def jobs(share: float, wait_s: float) -> int:
        return max(2, round(throughput * share * wait_s))

    # Backlogged: the same backlog on every level. Under 4:3:2:1, low (10% of the
    # worker) waits about half the bound and critical an eighth of it.
    per_level = jobs(0.1, 0.5 * bound_s)
    backlogged = tuple(Source(level, level[:1] + "1", backlog=per_level) for level in LEVELS)
    flood = (
        Source("critical", "c1", backlog=jobs(0.8, 0.4 * bound_s)),
        Source("low", "l1", backlog=jobs(0.2, 0.25 * bound_s)),
    )
    trickle = (
        Source("critical", "c1", backlog=1),
        Source("low", "l1", backlog=jobs(1.0, 0.25 * bound_s)),
    )
    tenant_flood = (
        Source("normal", "flood", backlog=jobs(1.0, 0.3 * bound_s)),
        *(Source("normal", f"quiet{i}", rate=throughput * 0.02) for i in range(1, 5)),
    )
    tenant_pair = (
        Source("normal", "t1", backlog=jobs(0.5, 0.3 * bound_s)),
        Source("normal", "t2", backlog=jobs(0.5, 0.3 * bound_s)),
    )
    return {
        s.name: s
        for s in (
            Scenario("backlogged", "all four levels backlogged, equal backlogs", backlogged),
            Scenario("flood", "sustained critical flood, a little low work", flood),
            Scenario("trickle", "one critical job always present, low backlogged", trickle),
            Scenario(
                "tenant-flood", "one tenant floods normal, 4 quiet tenants send a few", tenant_flood
            ),
            Scenario("tenant-pair", "two tenants flood normal equally", tenant_pair),
        )
    }


def warn_if_drained(
    scenarios: Mapping[str, Scenario], throughput: float, interval_s: float
) -> None:
    """Warn where a flooded level's backlog is smaller than what fair service takes from
    it in one pass: a pass then runs out of that level, and the backlog sizes, not the
    scheduler, set the shares. (Raise ``--bound-ms`` with ``--interval-ms``.)"""
    for scenario in scenarios.values():
        flooded = {s.level for s in scenario.sources if s.backlog > 1}
        weight = sum(WEIGHTS[level] for level in flooded) or 1
        for source in scenario.sources:
            per_pass = throughput * interval_s * WEIGHTS[source.level] / weight
            if source.backlog > 1 and source.backlog < 1.5 * per_pass:
                print(
                    f"warning: {scenario.name}: {source.key} keeps {source.backlog} jobs "
                    f"waiting but fair service takes ~{per_pass:.0f} per pass; raise --bound-ms"
                )


# -- one run ------------------------------------------------------------------------------


@dataclass
class JobRecord:
    level: str
    tenant: str
    enqueued_ms: int
    started_ms: int | None


@dataclass
class Run:
    scheduler: str
    scenario: Scenario
    t0_ms: int
    t_end_ms: int
    jobs: list[JobRecord]
    passes: list[float] = field(default_factory=list)


class Producer:
    """Keeps every source of a scenario supplied, through the scheduler's enqueue path."""

    def __init__(
        self,
        scheduler: str,
        scenario: Scenario,
        prefix: str,
        executor: ThreadPoolExecutor | None,
    ) -> None:
        self.scheduler = scheduler
        self.sources = scenario.sources
        self.prefix = prefix
        self.executor = executor
        self.enqueued: Counter[str] = Counter()
        self.credit: dict[str, float] = defaultdict(float)
        self.job_ids: list[str] = []

    async def run(self, stop: asyncio.Event) -> None:
        import redis.asyncio as aioredis
        from bullmq import Queue

        client = aioredis.from_url(REDIS_URL, decode_responses=True)
        queue = Queue(QUEUE, {"connection": REDIS_URL, "prefix": self.prefix})
        last = time.monotonic()
        try:
            while not stop.is_set():
                started = {
                    k: int(v) for k, v in (await client.hgetall(started_key(self.prefix))).items()
                }
                now = time.monotonic()
                for source in self.sources:
                    if source.backlog:
                        count = source.backlog - (
                            self.enqueued[source.key] - started.get(source.key, 0)
                        )
                    else:
                        self.credit[source.key] += source.rate * (now - last)
                        count = int(self.credit[source.key])
                        self.credit[source.key] -= count
                    if count > 0:
                        await self._add(queue, source, min(count, 1000))
                last = now
                await asyncio.sleep(TICK_S)
        finally:
            await queue.close()
            await client.aclose()

    async def _add(self, queue: Any, source: Source, count: int) -> None:
        data = {"src": source.key}
        if self.scheduler == "plain":
            jobs = await queue.addBulk(
                [
                    {
                        "name": JOB_TYPE,
                        "data": {**data, "tenantId": source.tenant, "priorityLevel": source.level},
                        "opts": {"priority": PLAIN_PRIORITY[source.level]},
                    }
                    for _ in range(count)
                ]
            )
            ids = [str(job.id) for job in jobs]
        else:
            from fairqueue.services import enqueue_jobs

            enqueue = functools.partial(
                enqueue_jobs,
                JOB_TYPE,
                [data] * count,
                tenant_id=source.tenant,
                priority_level=source.level,
                source="benchmarks/fairness.py",
            )
            results = await asyncio.get_running_loop().run_in_executor(self.executor, enqueue)
            ids = [result.job_id for result in results]
        self.enqueued[source.key] += count
        self.job_ids.extend(ids)


async def occupancy_pass(broker: Any, *, bound_ms: int) -> None:
    """Seed 1's literal policy through fairqueue's pass mechanics: read the whole waiting
    set, order it with ``order_by_occupancy``, write the changed priorities."""
    from fairqueue.broker import WINDOW_BAND_TOP
    from fairqueue.rebalance import pending_from_job, plan_priorities
    from fairqueue.scheduler import order_by_occupancy

    snapshot = await broker.read_head(QUEUE, window=100_000, max_window_band=100_000)
    pending, unparsed = [], []
    for job in snapshot.jobs:
        parsed = pending_from_job(job)
        (pending if parsed is not None else unparsed).append(parsed or job)
    order = order_by_occupancy(pending, now_ms=now_ms(), max_wait_ms=bound_ms)
    by_id = {job.job_id: job for job in snapshot.jobs}
    sequence = [by_id[item.job_id] for item in order] + unparsed
    current = [0 if job.in_wait_list else job.priority for job in sequence]
    planned = plan_priorities(current, upper=min(snapshot.upper_bound, WINDOW_BAND_TOP))
    changes = [
        (job.job_id, new)
        for job, old, new in zip(sequence, current, planned, strict=True)
        if new != old
    ]
    if changes:
        await broker.set_priorities(QUEUE, changes)


async def rebalance_loop(
    scheduler: str,
    broker: Any,
    stop: asyncio.Event,
    *,
    interval_ms: int,
    bound_ms: int,
    durations: list[float],
) -> None:
    from fairqueue.rebalance import arebalance_queue

    while not stop.is_set():
        started = time.perf_counter()
        if scheduler == "fairqueue":
            await arebalance_queue(JOB_TYPE, broker=broker)
        else:
            await occupancy_pass(broker, bound_ms=bound_ms)
        elapsed = time.perf_counter() - started
        durations.append(elapsed * 1000)
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, interval_ms / 1000 - elapsed))
        except TimeoutError:
            pass


def now_ms() -> int:
    return int(time.time() * 1000)


async def drive(
    scheduler: str,
    scenario: Scenario,
    prefix: str,
    args: argparse.Namespace,
    executor: ThreadPoolExecutor | None,
    worker: subprocess.Popen[str],
) -> Run:
    import redis.asyncio as aioredis

    from fairqueue.broker import Broker

    broker = Broker(REDIS_URL, prefix)
    producer = Producer(scheduler, scenario, prefix, executor)
    stop = asyncio.Event()
    durations: list[float] = []
    t0 = now_ms()
    tasks = [asyncio.ensure_future(producer.run(stop))]
    if scheduler != "plain":
        tasks.append(
            asyncio.ensure_future(
                rebalance_loop(
                    scheduler,
                    broker,
                    stop,
                    interval_ms=args.interval_ms,
                    bound_ms=args.bound_ms,
                    durations=durations,
                )
            )
        )
    await asyncio.sleep(args.seconds)
    t_end = now_ms()
    stop.set()
    await asyncio.gather(*tasks)
    await asyncio.get_running_loop().run_in_executor(None, stop_worker, worker)

    client = aioredis.from_url(REDIS_URL, decode_responses=True)
    records: list[JobRecord] = []
    ids = producer.job_ids
    for start in range(0, len(ids), 2000):
        async with client.pipeline(transaction=False) as pipe:
            for job_id in ids[start : start + 2000]:
                pipe.hmget(f"{prefix}:{QUEUE}:{job_id}", "data", "timestamp", "processedOn")
            rows = await pipe.execute()
        for data, timestamp, processed in rows:
            payload = json.loads(data)
            started = int(processed) if processed is not None else None
            records.append(
                JobRecord(
                    level=payload["priorityLevel"],
                    tenant=payload["tenantId"],
                    enqueued_ms=int(timestamp),
                    started_ms=started if started is not None and started <= t_end else None,
                )
            )
    await client.aclose()
    await broker.close()
    return Run(scheduler, scenario, t0, t_end, records, durations)


def run_one(
    scheduler: str,
    scenario: Scenario,
    args: argparse.Namespace,
    executor: ThreadPoolExecutor | None,
) -> Run:
    """One scheduler on one scenario, under a fresh prefix that is deleted afterwards."""
    from django.test.utils import override_settings

    from fairqueue import conf
    from fairqueue.broker import close_brokers

    prefix = f"fqbench-{uuid.uuid4().hex[:12]}"
    fairqueue_settings = {
        "PREFIX": prefix,
        "QUEUES": {JOB_TYPE: QUEUE},
        "REDIS_URL": REDIS_URL,
        "MAX_WAIT_MS": args.bound_ms,
        "REBALANCE_INTERVAL_MS": args.interval_ms,
    }
    try:
        with override_settings(FAIRQUEUE=fairqueue_settings):
            conf.reload_settings()
            worker = start_worker(prefix, args.run_ms)
            try:
                return asyncio.run(drive(scheduler, scenario, prefix, args, executor, worker))
            finally:
                if worker.poll() is None:
                    stop_worker(worker)
                if executor is not None:
                    executor.submit(close_brokers).result()
                close_brokers()
                delete_prefix(prefix)
    finally:
        conf.reload_settings()


def calibrate(args: argparse.Namespace) -> tuple[float, list[int]]:
    """The worker's throughput (jobs/s) on a plain closed-loop backlog, with the
    benchmark's own producer running: the budget backlogs are sized from.

    Two short runs, the higher median of their 1 s rates: on a shared machine a burst of
    someone else's load must not shrink every backlog (too small a backlog drains within
    one pass and then the backlog sizes, not the scheduler, decide the shares).
    """
    scenario = Scenario("calibrate", "", (Source("normal", "t", backlog=300),))
    seconds = args.seconds
    args.seconds = 4.0
    medians, all_rates = [], []
    try:
        for _ in range(2):
            run = run_one("plain", scenario, args, None)
            starts = sorted(j.started_ms for j in run.jobs if j.started_ms is not None)
            if len(starts) < 10:
                raise RuntimeError("calibration: the worker served almost nothing")
            rates = []
            a = starts[0] + 500
            while a + 1000 <= run.t_end_ms:
                rates.append(sum(1 for t in starts if a <= t < a + 1000))
                a += 1000
            all_rates.extend(rates)
            medians.append(statistics.median(rates) if rates else len(starts) / 3.5)
    finally:
        args.seconds = seconds
    return float(max(medians)), all_rates


# -- metrics ------------------------------------------------------------------------------


def max_min(
    capacity: float, demands: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, float]:
    """Weighted max-min fair allocation (water-filling) of ``capacity``."""
    alloc = dict.fromkeys(demands, 0.0)
    active = {k for k, d in demands.items() if d > 0}
    remaining = capacity
    while active and remaining > 1e-9:
        unit = remaining / sum(weights[k] for k in active)
        done = {k for k in active if demands[k] - alloc[k] <= unit * weights[k] + 1e-12}
        if not done:
            for k in active:
                alloc[k] += unit * weights[k]
            break
        for k in done:
            remaining -= demands[k] - alloc[k]
            alloc[k] = demands[k]
        active -= done
    return alloc


@dataclass
class LevelStats:
    share: float
    fair: float
    p50: float | None
    p99: float | None
    max_wait: float | None
    over_bound: int
    starved: int
    served: int


@dataclass
class RunStats:
    levels: dict[str, LevelStats]
    jain: float
    throughput: float
    passes: int
    pass_ms: float | None
    max_wait_s: float
    tenant_p99: dict[str, float | None]
    tenant_max: dict[str, float | None]


def analyse(run: Run, bound_ms: int) -> RunStats:
    start = run.t0_ms + int(WARMUP_S * 1000)
    end = run.t_end_ms
    windows = []
    a = start
    while a + WINDOW_S * 1000 <= end:
        windows.append((a, a + int(WINDOW_S * 1000)))
        a += int(WINDOW_S * 1000)
    # A closed-loop source replaces each job as soon as it is taken: it is backlogged all
    # the time, so its demand is unbounded (counting only the jobs it happened to have
    # would let a scheduler that serves it slowly look fair because it asked for little).
    backlogged = {(s.level, s.tenant) for s in run.scenario.sources if s.backlog}
    served_level: Counter[str] = Counter()
    fair_level: Counter[str] = Counter()
    jains = []
    for a, b in windows:
        demand: Counter[tuple[str, str]] = Counter()
        served: Counter[tuple[str, str]] = Counter()
        for job in run.jobs:
            if job.enqueued_ms < b and (job.started_ms is None or job.started_ms >= a):
                demand[(job.level, job.tenant)] += 1
                if job.started_ms is not None and job.started_ms < b:
                    served[(job.level, job.tenant)] += 1
        for key in backlogged:
            demand[key] = UNBOUNDED
        total = sum(served.values())
        level_demand = {lv: sum(d for (l2, _), d in demand.items() if l2 == lv) for lv in LEVELS}
        level_alloc = max_min(total, level_demand, WEIGHTS)
        x = []
        for level in LEVELS:
            served_level[level] += sum(s for (l2, _), s in served.items() if l2 == level)
            fair_level[level] += level_alloc[level]
            tenants = {t: d for (l2, t), d in demand.items() if l2 == level}
            tenant_alloc = max_min(level_alloc[level], tenants, dict.fromkeys(tenants, 1.0))
            for tenant, alloc in tenant_alloc.items():
                if alloc > 1e-9:
                    x.append(served[(level, tenant)] / alloc)
        if x and sum(v * v for v in x) > 0:
            jains.append(sum(x) ** 2 / (len(x) * sum(v * v for v in x)))
        elif x:
            jains.append(1 / len(x))
    total_served = sum(served_level.values()) or 1
    levels = {}
    max_overall = 0.0
    for level in LEVELS:
        level_jobs = [j for j in run.jobs if j.level == level]
        if not level_jobs:
            continue
        waits = sorted(
            (j.started_ms - j.enqueued_ms) / 1000
            for j in level_jobs
            if j.started_ms is not None and start <= j.started_ms <= end
        )
        left = [(end - j.enqueued_ms) / 1000 for j in level_jobs if j.started_ms is None]
        max_wait = max(waits + left, default=None)
        max_overall = max(max_overall, max_wait or 0.0)
        levels[level] = LevelStats(
            share=served_level[level] / total_served,
            fair=fair_level[level] / total_served,
            p50=_quantile(waits, 0.5),
            p99=_quantile(waits, 0.99),
            max_wait=max_wait,
            over_bound=sum(1 for w in waits if w * 1000 > bound_ms),
            starved=sum(1 for w in left if w * 1000 > bound_ms),
            served=served_level[level],
        )
    tenant_p99, tenant_max = {}, {}
    for tenant in sorted({j.tenant for j in run.jobs}):
        waits = sorted(
            (j.started_ms - j.enqueued_ms) / 1000
            for j in run.jobs
            if j.tenant == tenant and j.started_ms is not None and start <= j.started_ms <= end
        )
        tenant_p99[tenant] = _quantile(waits, 0.99)
        tenant_max[tenant] = waits[-1] if waits else None
    return RunStats(
        levels=levels,
        jain=statistics.fmean(jains) if jains else float("nan"),
        throughput=sum(served_level.values()) / max(1e-9, len(windows) * WINDOW_S),
        passes=len(run.passes),
        pass_ms=statistics.median(run.passes) if run.passes else None,
        max_wait_s=max_overall,
        tenant_p99=tenant_p99,
        tenant_max=tenant_max,
    )


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


# -- report -------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(
    results: list[tuple[Run, RunStats]], args: argparse.Namespace, throughput: float
) -> list[str]:
    limit_s = (args.bound_ms + args.interval_ms + args.run_ms) / 1000
    misses: list[str] = []
    print(
        f"\nScaled settings: job run time {args.run_ms:g} ms on one stock bullmq Worker "
        f"(concurrency 1, measured {throughput:.0f} jobs/s), wait bound {args.bound_ms} ms "
        f"(production default 300000), rebalance interval {args.interval_ms} ms (default 5000), "
        f"{args.seconds:g} s per run, first {WARMUP_S:g} s not measured."
    )
    print(
        "share = the worker's service; fair = weighted max-min share (4:3:2:1 among levels "
        "with work waiting) per 1 s window; waits in s; >bound = served after waiting "
        f"longer than the bound; starved = still waiting at the end, older than the bound. "
        f"Target for every job: wait <= bound + interval + run time = {limit_s:.3f} s."
    )
    by_scenario: dict[str, list[tuple[Run, RunStats]]] = defaultdict(list)
    for run, stats in results:
        by_scenario[run.scenario.name].append((run, stats))
    for name, runs in by_scenario.items():
        print(f"\n== {name}: {runs[0][0].scenario.description}")
        print(
            f"{'scheduler':<10} {'level':<8} {'share':>6} {'fair':>6} {'ratio':>6} "
            f"{'p50':>6} {'p99':>6} {'max':>6} {'>bound':>7} {'starved':>8}"
        )
        for run, stats in runs:
            for level, ls in stats.levels.items():
                ratio = ls.share / ls.fair if ls.fair > 0 else float("nan")
                print(
                    f"{run.scheduler:<10} {level:<8} {ls.share:>6.1%} {ls.fair:>6.1%} "
                    f"{ratio:>6.2f} {_s(ls.p50):>6} {_s(ls.p99):>6} {_s(ls.max_wait):>6} "
                    f"{ls.over_bound:>7} {ls.starved:>8}"
                )
        for run, stats in runs:
            passes = (
                f", {stats.passes} passes (median {stats.pass_ms:.1f} ms)"
                if stats.pass_ms is not None
                else ""
            )
            tenants = ""
            if name == "tenant-flood":
                quiet = [
                    v
                    for t, v in stats.tenant_p99.items()
                    if t.startswith("quiet") and v is not None
                ]
                tenants = (
                    f", p99 wait: flooding tenant {_s(stats.tenant_p99.get('flood'))} s, "
                    f"quiet tenants {_s(max(quiet, default=None))} s"
                )
            elif name == "tenant-pair":
                tenants = ", p99/max wait: " + ", ".join(
                    f"{t} {_s(stats.tenant_p99[t])}/{_s(stats.tenant_max[t])} s"
                    for t in sorted(stats.tenant_p99)
                )
            print(
                f"  {run.scheduler:<10} Jain (tenants) {stats.jain:.3f}, "
                f"{stats.throughput:.0f} jobs/s{passes}{tenants}"
            )
        for run, stats in runs:
            checks = [
                (
                    f"max wait <= {limit_s:.3f} s",
                    stats.max_wait_s <= limit_s,
                    f"{stats.max_wait_s:.2f} s",
                )
            ]
            if name == "backlogged":
                worst = max(
                    abs(ls.share / (WEIGHTS[lv] / 10) - 1) for lv, ls in stats.levels.items()
                )
                checks.append(
                    ("shares within 10% of 4:3:2:1", worst <= 0.10, f"worst {worst:.0%} off")
                )
            if name == "flood":
                low = stats.levels["low"].share / 0.2
                checks.append(("low >= 90% of its 20% weight share", low >= 0.9, f"{low:.0%}"))
            for label, ok, value in checks:
                print(f"  {run.scheduler:<10} {'PASS' if ok else 'MISS'} {label}: {value}")
                if not ok and run.scheduler == "fairqueue":
                    misses.append(f"{name}: {label} ({value})")
    return misses


def plot(results: list[tuple[Run, RunStats]], path: Path) -> None:
    """Cumulative jobs served over time: one panel per scenario and scheduler, a line per
    level (per tenant in the tenant scenarios, where there is one level)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    scenarios = list(dict.fromkeys(run.scenario.name for run, _ in results))
    schedulers = [s for s in SCHEDULERS if any(run.scheduler == s for run, _ in results)]
    fig, axes = plt.subplots(
        len(scenarios),
        len(schedulers),
        figsize=(5 * len(schedulers), 3.2 * len(scenarios)),
        squeeze=False,
        sharex=True,
    )
    for run, _ in results:
        ax = axes[scenarios.index(run.scenario.name)][schedulers.index(run.scheduler)]
        by_tenant = len({s.level for s in run.scenario.sources}) == 1
        groups: dict[str, list[float]] = defaultdict(list)
        for job in run.jobs:
            if job.started_ms is not None:
                groups[job.tenant if by_tenant else job.level].append(
                    (job.started_ms - run.t0_ms) / 1000
                )
        for name in sorted(groups, key=lambda g: (LEVELS.index(g) if g in LEVELS else 9, g)):
            starts = sorted(groups[name])
            ax.step(
                starts,
                range(1, len(starts) + 1),
                where="post",
                color=COLORS.get(name),
                label=name,
            )
        if by_tenant:
            ax.legend(loc="upper left", fontsize=7, ncol=2)
        ax.set_title(f"{run.scenario.name} - {run.scheduler}", fontsize=10)
        ax.grid(alpha=0.3)
        if run.scheduler == schedulers[0]:
            ax.set_ylabel("jobs served (cumulative)")
    for ax in axes[-1]:
        ax.set_xlabel("seconds")
    fig.legend(
        [Line2D([], [], color=COLORS[level]) for level in LEVELS],
        LEVELS,
        loc="upper center",
        ncol=len(LEVELS),
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------


def setup_django() -> ThreadPoolExecutor:
    """Django with an in-memory SQLite database (enqueue_jobs audits explicit levels)
    used from one thread only, so every call sees the same migrated database."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ["DATABASE_URL"] = "sqlite://:memory:"
    import django

    django.setup()
    from django.core.management import call_command

    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fqbench-db")
    executor.submit(call_command, "migrate", verbosity=0).result()
    return executor


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each run")
    parser.add_argument("--run-ms", type=float, default=3.0, help="each job's run time")
    parser.add_argument("--bound-ms", type=int, default=3000, help="scaled QUEUE_FAIR_MAX_WAIT_MS")
    parser.add_argument("--interval-ms", type=int, default=250, help="scaled rebalance interval")
    parser.add_argument("--scenario", action="append", help="run only these scenarios")
    parser.add_argument("--scheduler", action="append", choices=SCHEDULERS)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "fairness.png")
    parser.add_argument("--worker", metavar="PREFIX", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(_worker_main(args.worker, args.run_ms))
        return 0

    executor = setup_django()
    WORKER_LOG.unlink(missing_ok=True)
    started = time.monotonic()
    throughput, rates = calibrate(args)
    print(
        f"worker throughput: {throughput:.0f} jobs/s ({args.run_ms:g} ms jobs; 1 s rates {rates})",
        flush=True,
    )
    scenarios = build_scenarios(throughput, args.bound_ms / 1000)
    warn_if_drained(scenarios, throughput, args.interval_ms / 1000)
    names = args.scenario or list(scenarios)
    unknown = sorted(set(names) - set(scenarios))
    if unknown:
        parser.error(f"unknown scenario {unknown}: choose from {sorted(scenarios)}")
    results = []
    for name in names:
        for scheduler in args.scheduler or SCHEDULERS:
            run = run_one(scheduler, scenarios[name], args, executor)
            stats = analyse(run, args.bound_ms)
            results.append((run, stats))
            print(
                f"  ran {name:<13} {scheduler:<10} {len(run.jobs):>6} jobs enqueued, "
                f"{sum(ls.served for ls in stats.levels.values()):>5} served in the window",
                flush=True,
            )
    misses = report(results, args, throughput)
    plot(results, args.out)
    print(f"\nplot: {args.out}")
    print(f"total time {time.monotonic() - started:.0f} s")
    if misses:
        print("fairqueue missed: " + "; ".join(misses))
    executor.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
