"""Fairness under live load: plain BullMQ priorities, fairqueue without its loop and
fairqueue with the real ``rebalance_fair`` loop, side by side in one run.

Everything is real: Redis, a stock Node BullMQ 6.7 ``Worker`` consuming
(``benchmarks/live_worker.mjs``, no fairqueue code; ``--concurrency`` jobs at a time,
each "running" ``--run-ms``), Python producers enqueuing, and for ``fairqueue`` the
``manage.py rebalance_fair --interval-ms`` loop as a subprocess.

Schedulers (same workload and worker, one after the other, each under its own prefix):

* ``plain``            - ``bullmq.Queue.addBulk`` with BullMQ priority numbers (critical=1,
  high=3, normal=5, low=10): BullMQ's strict priority ladder, FIFO within a priority.
* ``fairqueue-noloop`` - ``fairqueue.enqueue.api.enqueue_jobs(priority_level=, tenant_id=)``
  and nothing else: the order the enqueue path gives.
* ``fairqueue``        - the same enqueue plus ``manage.py rebalance_fair`` (with
  ``QUEUE_FAIR_MAX_WAIT_MS=--bound-ms``, ``FAIRQUEUE_PREFIX`` and the producer's
  settings, ``benchmarks/live_settings.py``), started before the arrivals and
  waited for until it holds its leader lock.

(The former ``occupancy`` column is gone: it needed a pass of its own, not cheap
to keep beside a real loop; ``bench_policy.py`` still times ``order_by_occupancy``.)

First a calibration: the same worker on a plain backlog, alone and then while a
fairqueue producer enqueues at twice that rate on this same two-core machine (every
scenario has producers beside the worker, and they cost the worker CPU); the loaded
median 1 s completion rate is the *capacity* C the arrival rates are scaled from, so a
source sized at its share (low at 0.2 C in ``flood``) is at it, not a little over.
Arrivals are open-loop and evenly spaced (a source of rate r has sent floor(r*t)+1
jobs at time t; the producer ticks every 5 ms and enqueues what is due in one call per
source), so a slow
scheduler cannot slow its own arrivals down. Scenarios (``--seconds`` of arrivals each):

1. ``backlogged``      - each level at 1.0 C (4 C in all): served shares vs 40/30/20/10.
2. ``flood``           - critical at 2 C, low at 0.2 C: low's served rate against its
   entitlement, low's wait.
3. ``trickle``         - critical 1 job / 50 ms beside normal at 1.25 C: critical's wait.
   Normal's backlog passes the wait bound after a few seconds, so this also checks that
   overdue jobs of an overloaded level do not take a conforming level's turns
   (docs/design.md, "The wait bound").
4. ``tenant-pair``     - normal: tenants A and B at 1 C each, tenant ``sparse`` 1 job /
   200 ms: Jain's index of A and B per 5 s window, the sparse tenant's wait.
5. ``tenant-weighted`` - normal: ``heavy`` (``tenant_weight=3``) and ``light`` (weight 1)
   at 1 C each: heavy/light service ratio (target 3). Needs ``enqueue_jobs(...,
   tenant_weight=)``: where fairqueue has no such argument only ``plain`` runs (it has no
   weights; its producer sends none) and the target says "not measured".
6. ``overload``        - each level at 0.75 C (3 C in all): each level's share / its
   weight share; also the throughput comparison (loop vs no loop).
7. ``underload``       - each level at 0.175 C (0.7 C in all): jobs over the bound.
8. ``bursts``          - normal: ten tenants each send one burst of 1 C jobs, one burst
   after another, 50 ms apart (a cron at the top of the hour in every tenant): each
   tenant's share of the jobs taken in each second once all have arrived, while all
   have jobs waiting (equal: 10%).
9. ``overload-emptying`` - high, normal and low at 0.95 C each beside a small critical
   tenant at 0.15 C (within its share), its jobs sent one at a time, so its queue keeps
   emptying and its flow rejoining: each level's service / its max-min share.

After the arrivals, a drain phase (at most ``--drain-s``) lets the worker work on; then
the worker is stopped (active jobs finish) and the loop after it.

Measured (times from this one machine's clocks: the producer's ``job.timestamp``, the
worker's ``processedOn``/``finishedOn``):

* window W = [start + 2 s warm-up, end of arrivals]. The warm-up leaves out the start,
  where backlogs are still building and the loop's first pass is not done yet.
* served: jobs the worker *took* (``processedOn``) in W, per level / tenant; share =
  served / all served in W.
* entitlement: hierarchical weighted max-min of the *arrival* rates in W (levels 4:3:2:1,
  tenants by weight inside a level), of the capacity actually used in W (all served);
  ratio = served / entitlement (1.0 = exactly fair).
* wait = processedOn - timestamp, for jobs that *arrived* in W; a job not taken by the end
  of the drain counts with its age then (a lower bound, shown as ``>=``). p50/p99/max;
  ``>bound`` = waits over ``--bound-ms``.
* throughput: median of the 1 s completion (``finishedOn``) counts in W.
* exactly once: ``dup`` = jobs the worker reported twice or more; ``lost`` = jobs enqueued,
  never reported, and no longer waiting in Redis; ``left`` = still waiting at the end
  (expected under overload: not an error).

The last table checks the issue's "done when" criteria on ``fairqueue`` (loop running),
with ``fairqueue-noloop`` and ``plain`` beside it as baselines. Absolute numbers move
with the machine's load; the criteria are ratios, or waits measured against job run
times. Writes ``benchmarks/out/fairness.png`` (cumulative service per level or tenant
over time, per scenario and scheduler); ``--json`` dumps the numbers.

    python benchmarks/bench_fairness.py [--scenario trickle ...] [--seconds 20] [--run-ms 10]
        [--concurrency 2] [--interval-ms 250] [--bound-ms 3000] [--drain-s 3]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.breaker_watch import BreakerCount  # noqa: E402
from benchmarks.common import (  # noqa: E402
    REDIS_URL,
    delete_prefix,
    loop_process,
    stop_process,
)

JOB_TYPE = "bench"
QUEUE = "bench"
SETTINGS_MODULE = "benchmarks.live_settings"
LEVELS = ("critical", "high", "normal", "low")
WEIGHTS = {"critical": 4, "high": 3, "normal": 2, "low": 1}
WEIGHT_SHARE = {level: w / sum(WEIGHTS.values()) for level, w in WEIGHTS.items()}
PLAIN_PRIORITY = {"critical": 1, "high": 3, "normal": 5, "low": 10}
SCHEDULERS = ("plain", "fairqueue-noloop", "fairqueue")
COLORS = {"critical": "tab:red", "high": "tab:orange", "normal": "tab:blue", "low": "tab:green"}
WORKER_JS = ROOT / "benchmarks" / "live_worker.mjs"
OUT = ROOT / "benchmarks" / "out"
LOG = OUT / "fairness.log"
TICK_S = 0.005
WARMUP_S = 2.0
JAIN_WINDOW_S = 5.0
MAX_BATCH = 1000
BURST_TENANTS = 10


# -- workload -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """An open-loop stream of ``rate`` jobs a second of one (level, tenant)."""

    level: str
    tenant: str
    rate: float
    weight: int | None = None
    #: A burst: ``burst`` jobs sent at once ``burst_at_s`` after the start (``rate`` unused).
    burst: int = 0
    burst_at_s: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.level}/{self.tenant}"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    sources: tuple[Source, ...]
    by_tenant: bool = False
    jain_tenants: tuple[str, ...] = ()
    needs_weights: bool = False


def build_scenarios(capacity: float) -> dict[str, Scenario]:
    c = capacity

    def per_level(factor: float) -> tuple[Source, ...]:
        return tuple(Source(level, f"{level[0]}1", factor * c) for level in LEVELS)

    scenarios = (
        Scenario("backlogged", "each level at 1.0x capacity", per_level(1.0)),
        Scenario(
            "flood",
            "critical at 2x capacity, low at 0.2x",
            (Source("critical", "c1", 2.0 * c), Source("low", "l1", 0.2 * c)),
        ),
        Scenario(
            "trickle",
            "critical 1 job / 50 ms beside normal at 1.25x capacity",
            (Source("critical", "c1", 20.0), Source("normal", "n1", 1.25 * c)),
        ),
        Scenario(
            "tenant-pair",
            "normal: tenants A, B at 1x capacity each, sparse 1 job / 200 ms",
            (
                Source("normal", "A", 1.0 * c),
                Source("normal", "B", 1.0 * c),
                Source("normal", "sparse", 5.0),
            ),
            by_tenant=True,
            jain_tenants=("A", "B"),
        ),
        Scenario(
            "tenant-weighted",
            "normal: heavy (weight 3) and light (weight 1) at 1x capacity each",
            (
                Source("normal", "heavy", 1.0 * c, weight=3),
                Source("normal", "light", 1.0 * c, weight=1),
            ),
            by_tenant=True,
            needs_weights=True,
        ),
        Scenario("overload", "each level at 0.75x capacity (3x in all)", per_level(0.75)),
        Scenario("underload", "each level at 0.175x capacity (0.7x in all)", per_level(0.175)),
        Scenario(
            "bursts",
            "normal: ten tenants' bursts of 1x capacity, one after another, 50 ms apart",
            tuple(
                Source("normal", f"b{n}", 0.0, burst=max(50, int(c)), burst_at_s=0.05 * n)
                for n in range(BURST_TENANTS)
            ),
            by_tenant=True,
        ),
        Scenario(
            "overload-emptying",
            "high, normal, low at 0.95x capacity; critical at 0.15x, one job at a time",
            (
                Source("critical", "c-small", 0.15 * c),
                *(Source(level, f"{level[0]}1", 0.95 * c) for level in LEVELS[1:]),
            ),
        ),
    )
    return {s.name: s for s in scenarios}


# -- processes ----------------------------------------------------------------------------


def fair_env(prefix: str, args: argparse.Namespace) -> dict[str, str]:
    """The settings the producer and the loop share (fairqueue.conf's variables)."""
    return {
        "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
        "FAIRQUEUE_PREFIX": prefix,
        "FAIRQUEUE_REDIS_URL": REDIS_URL,
        "QUEUE_FAIR_MAX_WAIT_MS": str(args.bound_ms),
        "QUEUE_FAIR_REBALANCE_INTERVAL_MS": str(args.interval_ms),
    }


class NodeWorker:
    """The stock Node BullMQ worker; a thread reads its per-job lines."""

    def __init__(self, prefix: str, args: argparse.Namespace, log: TextIO) -> None:
        self.records: list[dict[str, Any]] = []
        self.seen: set[str] = set()
        self.ready = threading.Event()
        self.process = subprocess.Popen(
            [
                "node",
                str(WORKER_JS),
                REDIS_URL,
                prefix,
                QUEUE,
                str(args.concurrency),
                str(args.run_ms),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,  # Ctrl-C reaches us only; our finally stops it
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.ready.wait(30):
            self.stop()
            raise RuntimeError(f"the Node worker did not start; see {LOG}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip() == "ready":
                self.ready.set()
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            self.records.append(record)
            self.seen.add(str(record["id"]))

    def stop(self) -> None:
        stop_process(self.process)
        self.reader.join(10)


class PythonWorker(NodeWorker):
    """``--worker python``: ``fairqueue_worker bench --processes N`` (the handler in
    ``benchmarks/worker_app/jobs.py`` waits ``--run-ms`` and prints the same per-job line
    as the Node worker); ``--concurrency`` slots in all, split over the processes."""

    def __init__(self, prefix: str, args: argparse.Namespace, log: TextIO) -> None:
        import redis

        self.records = []
        self.seen = set()
        self.ready = threading.Event()
        processes = args.worker_processes
        env = {
            **os.environ,
            **fair_env(prefix, args),
            "DJANGO_SETTINGS_MODULE": "benchmarks.worker_settings",
            "FQBENCH_RUN_MS": str(args.run_ms),
        }
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(  # noqa: S603 - our own command
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "fairqueue_worker",
                JOB_TYPE,
                "--processes",
                str(processes),
                "--concurrency",
                str(max(1, args.concurrency // processes)),
                "-v",
                "0",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        client = redis.Redis.from_url(REDIS_URL)
        deadline = time.monotonic() + 60
        # Up once every process wrote its liveness record.
        while client.hlen(f"{prefix}:{QUEUE}:fq:procs") < processes:
            if time.monotonic() > deadline or self.process.poll() is not None:
                client.close()
                self.stop()
                raise RuntimeError(f"the Python worker did not start; see {LOG}")
            time.sleep(0.05)
        client.close()
        self.ready.set()


def worker_words(args: argparse.Namespace) -> str:
    if getattr(args, "worker", "node") == "python":
        return f"fairqueue_worker --processes {args.worker_processes}"
    return "stock Node BullMQ worker"


def make_worker(prefix: str, args: argparse.Namespace, log: TextIO) -> NodeWorker:
    if getattr(args, "worker", "node") == "python":
        return PythonWorker(prefix, args, log)
    return NodeWorker(prefix, args, log)


def start_loop(prefix: str, args: argparse.Namespace, log: TextIO) -> subprocess.Popen[bytes]:
    env = {**os.environ, **fair_env(prefix, args)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return loop_process(JOB_TYPE, args.interval_ms, env, log)


def wait_for_loop(prefix: str, loop: subprocess.Popen[bytes], timeout: float = 20.0) -> bool:
    """Until the loop holds its leader lock (its first pass has begun)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and loop.poll() is None:
            if client.exists(f"{prefix}:{QUEUE}:fq:leader"):
                return True
            time.sleep(0.05)
    finally:
        client.close()
    return False


# -- one run ------------------------------------------------------------------------------


@dataclass
class Job:
    level: str
    tenant: str
    ts: int | None = None
    processed: int | None = None
    finished: int | None = None
    times: int = 0
    failed: int = 0


@dataclass
class Run:
    scheduler: str
    scenario: Scenario
    t0_ms: int
    t_end_ms: int
    t_stop_ms: int
    jobs: dict[str, Job]
    duplicates: int = 0
    lost: int = 0
    left: int = 0
    unknown: int = 0
    failed: int = 0
    loop_errors: int = 0
    loop_ready: bool | None = None


class Producer:
    """Open-loop arrivals for every source, through the scheduler's enqueue path."""

    def __init__(
        self, scheduler: str, scenario: Scenario, prefix: str, db: ThreadPoolExecutor
    ) -> None:
        self.scheduler = scheduler
        self.sources = scenario.sources
        self.prefix = prefix
        self.db = db
        self.jobs: dict[str, Job] = {}

    async def run(self, seconds: float) -> None:
        queue = None
        if self.scheduler == "plain":
            from bullmq import Queue

            queue = Queue(QUEUE, {"connection": REDIS_URL, "prefix": self.prefix})
        sent = [0] * len(self.sources)
        start = time.monotonic()
        try:
            while (elapsed := time.monotonic() - start) < seconds:
                for index, source in enumerate(self.sources):
                    if source.burst:
                        due = source.burst if elapsed >= source.burst_at_s else 0
                        count = due - sent[index]
                    else:
                        count = min(int(source.rate * elapsed) + 1 - sent[index], MAX_BATCH)
                    if count > 0:
                        ids = await self._add(queue, source, count)
                        sent[index] += count
                        for job_id in ids:
                            self.jobs[job_id] = Job(source.level, source.tenant)
                await asyncio.sleep(TICK_S)
        finally:
            if queue is not None:
                await queue.close()

    async def _add(self, queue: Any, source: Source, count: int) -> list[str]:
        if queue is not None:
            data = {"tenantId": source.tenant, "priorityLevel": source.level}
            opts = {"priority": PLAIN_PRIORITY[source.level]}
            jobs = await queue.addBulk(
                [{"name": JOB_TYPE, "data": data, "opts": opts} for _ in range(count)]
            )
            return [str(job.id) for job in jobs]
        return await asyncio.get_running_loop().run_in_executor(
            self.db, enqueue_fair, source, count
        )


def enqueue_fair(source: Source, count: int) -> list[str]:
    from fairqueue.enqueue.api import enqueue_jobs

    weight = {} if source.weight is None else {"tenant_weight": source.weight}
    results = enqueue_jobs(
        JOB_TYPE,
        [{}] * count,
        tenant_id=source.tenant,
        priority_level=source.level,
        source="benchmarks/bench_fairness.py",
        **weight,  # type: ignore[typeddict-unknown-key]
    )
    return [result.job_id for result in results]


def supports_tenant_weight() -> bool:
    """Whether ``enqueue_job`` takes ``tenant_weight=``: an unknown job type fails
    validation after the keyword arguments are bound, so nothing is written."""
    from fairqueue.enqueue.api import enqueue_job
    from fairqueue.exceptions import UnknownJobTypeError

    try:
        enqueue_job("fqbench-probe-no-such-type", {}, tenant_weight=1)  # type: ignore[typeddict-unknown-key]
    except TypeError:
        return False
    except UnknownJobTypeError:
        return True
    return True


async def drive(
    producer: Producer, worker: NodeWorker, args: argparse.Namespace
) -> tuple[int, int, int]:
    t0 = now_ms()
    await producer.run(args.seconds)
    t_end = now_ms()
    deadline = time.monotonic() + args.drain_s
    while time.monotonic() < deadline and not set(producer.jobs) <= worker.seen:
        await asyncio.sleep(0.1)
    return t0, t_end, now_ms()


def now_ms() -> int:
    return int(time.time() * 1000)


def run_one(
    scheduler: str, scenario: Scenario, args: argparse.Namespace, db: ThreadPoolExecutor
) -> Run:
    """One scheduler on one scenario under a fresh prefix, deleted afterwards."""
    from fairqueue import conf
    from fairqueue.broker import close_brokers

    prefix = f"fqbench-{uuid.uuid4().hex[:12]}"
    os.environ.update(fair_env(prefix, args))
    db.submit(conf.reload_settings).result()
    worker: NodeWorker | None = None
    loop: subprocess.Popen[bytes] | None = None
    OUT.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as log:
        log.write(f"--- {scenario.name} / {scheduler} ({prefix})\n")
        log.flush()
        loop_log_start = LOG.stat().st_size
        try:
            loop_ready = None
            breakers = getattr(args, "breakers", None)
            if scheduler == "fairqueue":
                if breakers is not None:
                    breakers.before_run()
                loop = start_loop(prefix, args, log)
            worker = make_worker(prefix, args, log)
            if loop is not None:
                loop_ready = wait_for_loop(prefix, loop)
                if not loop_ready:
                    # A "fairqueue" run without its loop would be reported as one with it.
                    raise SystemExit(f"the rebalance loop did not take its lock; see {LOG}")
            producer = Producer(scheduler, scenario, prefix, db)
            t0, t_end, t_stop = asyncio.run(drive(producer, worker, args))
            worker.stop()
            if loop is not None:
                stop_process(loop)
                if loop.returncode not in (0, None):
                    print(f"  warning: the rebalance loop exited with {loop.returncode}")
                if breakers is not None and breakers.after_run(f"{scenario.name} / {scheduler}"):
                    print(f"  {scenario.name}: the breaker opened (see the end)", flush=True)
            run = collect(scheduler, scenario, prefix, producer.jobs, worker, t0, t_end, t_stop)
            run.loop_ready = loop_ready
        finally:
            if worker is not None:
                worker.stop()
            if loop is not None:
                stop_process(loop)
            db.submit(close_brokers).result()
            close_brokers()
            delete_prefix(prefix)
    with LOG.open() as log:
        log.seek(loop_log_start)
        run.loop_errors = sum(1 for line in log if "pass failed" in line or "Traceback" in line)
    return run


def collect(
    scheduler: str,
    scenario: Scenario,
    prefix: str,
    jobs: dict[str, Job],
    worker: NodeWorker,
    t0: int,
    t_end: int,
    t_stop: int,
) -> Run:
    """Match the worker's reports to what was enqueued; look up what was not reported."""
    import redis

    run = Run(scheduler, scenario, t0, t_end, t_stop, jobs)
    for record in worker.records:
        job = jobs.get(str(record["id"]))
        if job is None:
            run.unknown += 1
            continue
        if not record.get("ok", True):
            job.failed += 1
            run.failed += 1
            continue
        job.times += 1
        if job.times == 1:
            job.ts, job.processed, job.finished = record["ts"], record["p"], record["f"]
    run.duplicates = sum(1 for job in jobs.values() if job.times > 1)
    missing = [job_id for job_id, job in jobs.items() if job.times == 0]
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        for start in range(0, len(missing), 2000):
            chunk = missing[start : start + 2000]
            with client.pipeline(transaction=False) as pipe:
                for job_id in chunk:
                    pipe.hmget(f"{prefix}:{QUEUE}:{job_id}", "timestamp", "finishedOn")
                rows = pipe.execute()
            for job_id, (timestamp, finished) in zip(chunk, rows, strict=True):
                if timestamp is not None and finished is None:
                    run.left += 1  # still in the queue (waiting, prioritized, delayed...)
                    jobs[job_id].ts = int(timestamp)
                else:
                    run.lost += 1
    finally:
        client.close()
    return run


def calibrate(args: argparse.Namespace, db: ThreadPoolExecutor) -> tuple[float, float, list[int]]:
    """The worker's capacity (jobs/s) on a plain backlog it cannot empty, alone and then
    while a fairqueue producer enqueues at twice that rate elsewhere on this machine.

    Every scenario runs producers beside the worker on the same two cores, so the worker
    delivers less than it does alone; arrival rates are sized from the loaded capacity,
    so a source "at its share" really is at it. Each figure is the median 1 s
    completion rate of a 5 s run. Returns (loaded, alone, loaded 1 s rates)."""
    alone, _ = _measure_worker(args)
    load = Scenario(
        "calibration", "critical at 2x capacity", (Source("critical", "c1", 2 * alone),)
    )
    loaded, rates = _measure_worker(args, load=load, db=db)
    return loaded, alone, rates


def _measure_worker(
    args: argparse.Namespace, *, load: Scenario | None = None, db: ThreadPoolExecutor | None = None
) -> tuple[float, list[int]]:
    from bullmq import Queue

    from fairqueue import conf
    from fairqueue.broker import close_brokers

    backlog = math.ceil(1.5 * args.concurrency * 1000 / args.run_ms * 6)
    prefix = f"fqbench-{uuid.uuid4().hex[:12]}"
    load_prefix = f"fqbench-{uuid.uuid4().hex[:12]}"
    OUT.mkdir(parents=True, exist_ok=True)
    worker = None
    producer = None
    try:

        async def fill() -> None:
            queue = Queue(QUEUE, {"connection": REDIS_URL, "prefix": prefix})
            for start in range(0, backlog, MAX_BATCH):
                count = min(MAX_BATCH, backlog - start)
                await queue.addBulk(
                    [{"name": JOB_TYPE, "data": {}, "opts": {"priority": 5}} for _ in range(count)]
                )
            await queue.close()

        asyncio.run(fill())
        if load is not None and db is not None:
            os.environ.update(fair_env(load_prefix, args))
            db.submit(conf.reload_settings).result()
            producer = threading.Thread(
                target=asyncio.run, args=(Producer("fairqueue", load, load_prefix, db).run(5.5),)
            )
            producer.start()
        with LOG.open("a") as log:
            worker = make_worker(prefix, args, log)
            time.sleep(5.0)
            worker.stop()
        finished = sorted(r["f"] for r in worker.records)
        if len(finished) < 10:
            raise RuntimeError(f"calibration: the worker served almost nothing; see {LOG}")
        rates = []
        a = finished[0] + 500
        while a + 1000 <= finished[-1]:
            rates.append(sum(1 for f in finished if a <= f < a + 1000))
            a += 1000
        if len(finished) >= backlog:
            print("warning: the calibration backlog ran out; capacity is underestimated")
        return (statistics.median(rates) if rates else len(finished) / 4.5), rates
    finally:
        if worker is not None:
            worker.stop()
        if producer is not None:
            producer.join()
            db.submit(close_brokers).result()
        delete_prefix(prefix)
        delete_prefix(load_prefix)


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
class Wait:
    """A quantile of waits; ``censored``: some job in it had not been taken yet, so the
    true value is at least this."""

    seconds: float | None
    censored: bool = False

    def __str__(self) -> str:
        if self.seconds is None:
            return "-"
        return (">=" if self.censored else "") + f"{self.seconds:.3f}"


@dataclass
class GroupStats:
    arrived_rate: float
    served_rate: float
    share: float
    entitled_rate: float
    ratio: float | None
    p50: Wait
    p99: Wait
    max: Wait
    over_bound: int
    left: int


@dataclass
class RunStats:
    scheduler: str
    scenario: str
    window_s: float
    levels: dict[str, GroupStats]
    tenants: dict[str, GroupStats]
    throughput: float
    throughput_mean: float
    jain: list[float]
    duplicates: int
    lost: int
    left: int
    unknown: int
    failed: int
    loop_errors: int
    loop_ready: bool | None
    served_per_s: dict[str, list[int]] = field(default_factory=dict)
    #: Bursts: the largest deviation of a tenant's share of a second's jobs from an equal
    #: share, over the seconds after all bursts arrived in which every tenant had jobs left.
    burst_dev: float | None = None


def _quantile(waits: Sequence[tuple[float, bool]], q: float) -> Wait:
    if not waits:
        return Wait(None)
    index = min(len(waits) - 1, max(0, math.ceil(q * len(waits)) - 1))
    seconds, censored = waits[index]
    # Any censored wait at or below this rank could really be larger than this value.
    return Wait(seconds, censored or any(c for _, c in waits[: index + 1]))


def analyse(run: Run, bound_ms: int) -> RunStats:
    a = run.t0_ms + int(WARMUP_S * 1000)
    b = run.t_end_ms
    window_s = max(1e-9, (b - a) / 1000)
    scenario = run.scenario
    tenant_weight = {s.tenant: float(s.weight or 1) for s in scenario.sources}
    served: Counter[tuple[str, str]] = Counter()
    arrived: Counter[tuple[str, str]] = Counter()
    waits: dict[tuple[str, str], list[tuple[float, bool]]] = defaultdict(list)
    left: Counter[tuple[str, str]] = Counter()
    finished: list[int] = []
    for job in run.jobs.values():
        key = (job.level, job.tenant)
        if job.processed is not None and a <= job.processed < b:
            served[key] += 1
        if job.finished is not None and a <= job.finished < b:
            finished.append(job.finished)
        if job.times == 0:
            left[key] += 1
        if job.ts is not None and a <= job.ts < b:
            arrived[key] += 1
            if job.processed is not None:
                waits[key].append(((job.processed - job.ts) / 1000, False))
            else:
                waits[key].append(((run.t_stop_ms - job.ts) / 1000, True))
    total = sum(served.values())
    level_alloc = max_min(
        total,
        {lv: sum(n for (l2, _), n in arrived.items() if l2 == lv) for lv in LEVELS},
        WEIGHTS,
    )
    tenant_alloc: dict[tuple[str, str], float] = {}
    for level in LEVELS:
        demands = {t: n for (l2, t), n in arrived.items() if l2 == level}
        for tenant, alloc in max_min(level_alloc[level], demands, tenant_weight).items():
            tenant_alloc[(level, tenant)] = alloc

    def group(keys: list[tuple[str, str]], entitled: float) -> GroupStats:
        group_waits = sorted(w for k in keys for w in waits[k])
        n_served = sum(served[k] for k in keys)
        return GroupStats(
            arrived_rate=sum(arrived[k] for k in keys) / window_s,
            served_rate=n_served / window_s,
            share=n_served / total if total else 0.0,
            entitled_rate=entitled / window_s,
            ratio=n_served / entitled if entitled > 1e-9 else None,
            p50=_quantile(group_waits, 0.5),
            p99=_quantile(group_waits, 0.99),
            max=_quantile(group_waits, 1.0),
            over_bound=sum(1 for w, _ in group_waits if w * 1000 > bound_ms),
            left=sum(left[k] for k in keys),
        )

    keys = sorted({(s.level, s.tenant) for s in scenario.sources})
    levels = {
        level: group([k for k in keys if k[0] == level], level_alloc[level])
        for level in LEVELS
        if any(k[0] == level for k in keys)
    }
    tenants = {}
    if scenario.by_tenant:
        tenants = {k[1]: group([k], tenant_alloc.get(k, 0.0)) for k in keys}
    per_second: list[int] = [0] * max(1, int(window_s))
    for f in finished:
        index = int((f - a) / 1000)
        if index < len(per_second):
            per_second[index] += 1
    full_seconds = per_second[: int(window_s)] or per_second
    jain = []
    if scenario.jain_tenants:
        start = a
        while start + JAIN_WINDOW_S * 1000 <= b:
            end = start + JAIN_WINDOW_S * 1000
            x = [
                sum(
                    1
                    for job in run.jobs.values()
                    if job.tenant == tenant
                    and job.processed is not None
                    and start <= job.processed < end
                )
                / tenant_weight[tenant]
                for tenant in scenario.jain_tenants
            ]
            squares = sum(v * v for v in x)
            jain.append(sum(x) ** 2 / (len(x) * squares) if squares else 0.0)
            start = int(end)
    served_per_s: dict[str, list[int]] = {}
    for job in run.jobs.values():
        if job.processed is None:
            continue
        name = job.tenant if scenario.by_tenant else job.level
        second = int((job.processed - run.t0_ms) / 1000)
        if second >= 0:
            series = served_per_s.setdefault(name, [])
            series.extend([0] * (second + 1 - len(series)))
            series[second] += 1
    return RunStats(
        burst_dev=_burst_dev(run),
        scheduler=run.scheduler,
        scenario=scenario.name,
        window_s=window_s,
        levels=levels,
        tenants=tenants,
        throughput=float(statistics.median(full_seconds)),
        throughput_mean=len(finished) / window_s,
        jain=jain,
        duplicates=run.duplicates,
        lost=run.lost,
        left=run.left,
        unknown=run.unknown,
        failed=run.failed,
        loop_errors=run.loop_errors,
        loop_ready=run.loop_ready,
        served_per_s=served_per_s,
    )


def _burst_dev(run: Run) -> float | None:
    """The bursts' criterion: in each whole second (from the start) after the last job
    of the bursts was added and before the first tenant ran out of jobs, each tenant's
    share of the jobs taken against an equal share; the largest relative deviation."""
    bursts = [s for s in run.scenario.sources if s.burst]
    if not bursts:
        return None
    taken: dict[str, list[int]] = defaultdict(list)
    for job in run.jobs.values():
        if job.processed is not None:
            taken[job.tenant].append(job.processed - run.t0_ms)
    if len(taken) < len(bursts):
        return None
    arrived = [job.ts - run.t0_ms for job in run.jobs.values() if job.ts is not None]
    if not arrived:
        return None
    first = math.ceil(max(arrived) / 1000)  # the second after the last job was added
    last_of_all = min(max(times) for times in taken.values())  # a tenant's last job taken
    worst = None
    second = first
    while (second + 1) * 1000 <= last_of_all:
        counts = [
            sum(1 for t in times if second * 1000 <= t < (second + 1) * 1000)
            for times in taken.values()
        ]
        mean = sum(counts) / len(counts)
        if mean > 0:
            dev = max(abs(n / mean - 1) for n in counts)
            worst = dev if worst is None else max(worst, dev)
        second += 1
    return worst


# -- report -------------------------------------------------------------------------------


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_scenario(scenario: Scenario, stats: list[RunStats]) -> None:
    print(f"\n== {scenario.name}: {scenario.description}")
    label = "tenant" if scenario.by_tenant else "level"
    print(
        f"{'scheduler':<17} {label:<9} {'in/s':>6} {'out/s':>6} {'share':>6} {'entl/s':>7} "
        f"{'ratio':>5} {'p50 s':>8} {'p99 s':>8} {'max s':>8} {'>bound':>6} {'left':>6}"
    )
    for st in stats:
        groups = st.tenants if scenario.by_tenant else st.levels
        for name, g in groups.items():
            print(
                f"{st.scheduler:<17} {name:<9} {g.arrived_rate:>6.1f} {g.served_rate:>6.1f} "
                f"{g.share:>6.1%} {g.entitled_rate:>7.1f} {_ratio(g.ratio):>5} "
                f"{g.p50!s:>8} {g.p99!s:>8} {g.max!s:>8} {g.over_bound:>6} {g.left:>6}"
            )
    for st in stats:
        extra = ""
        if st.jain:
            extra += (
                f", Jain(A,B) per 5 s min {min(st.jain):.3f} mean {statistics.fmean(st.jain):.3f}"
            )
        if scenario.name == "tenant-weighted":
            extra += f", heavy/light {_ratio(weighted_ratio(st))}"
        if st.loop_ready is not None:
            extra += f", loop errors {st.loop_errors}" + ("" if st.loop_ready else " (NOT READY)")
        print(
            f"  {st.scheduler:<17} {st.throughput:.0f} jobs/s (median 1 s), "
            f"dup {st.duplicates}, lost {st.lost}, left {st.left}"
            + (f", unknown {st.unknown}" if st.unknown else "")
            + (f", failed {st.failed}" if st.failed else "")
            + extra
        )


def weighted_ratio(st: RunStats) -> float | None:
    heavy, light = st.tenants.get("heavy"), st.tenants.get("light")
    if heavy is None or light is None or light.served_rate == 0:
        return None
    return heavy.served_rate / light.served_rate


@dataclass
class Target:
    criterion: str
    target: str
    values: dict[str, str]
    status: str  # PASS / FAIL on fairqueue's value; "-": not run; "info": no target
    note: str = ""


def targets(
    by_key: Mapping[tuple[str, str], RunStats],
    args: argparse.Namespace,
    skipped: Mapping[str, str],
) -> list[Target]:
    """Each done-when criterion, checked from the measurements of every scheduler."""
    rows: list[Target] = []

    def add(criterion: str, target: str, scenario: str, measure: Any, check: Any | None) -> None:
        values, status = {}, "-"
        for scheduler in SCHEDULERS:
            st = by_key.get((scenario, scheduler))
            if st is None:
                values[scheduler] = "-"
                continue
            value, text = measure(st)
            values[scheduler] = text
            if scheduler == "fairqueue":
                if check is None:
                    status = "info"
                else:
                    status = "PASS" if value is not None and check(value) else "FAIL"
        rows.append(Target(criterion, target, values, status))

    def worst_dev(st: RunStats) -> tuple[float, str]:
        dev = {lv: g.share / WEIGHT_SHARE[lv] - 1 for lv, g in st.levels.items()}
        worst = max(dev, key=lambda lv: abs(dev[lv]))
        shares = "/".join(f"{g.share * 100:.0f}" for g in st.levels.values())
        return abs(dev[worst]), f"{shares} ({worst} {dev[worst]:+.0%})"

    add(
        "backlogged: shares vs 40/30/20/10",
        "<= 5% off",
        "backlogged",
        worst_dev,
        lambda v: v <= 0.05,
    )

    def low_ratio(st: RunStats) -> tuple[float | None, str]:
        g = st.levels.get("low")
        return (g.ratio, f"{g.ratio:.0%}") if g and g.ratio is not None else (None, "-")

    add("flood: low's share of its entitlement", ">= 95%", "flood", low_ratio, lambda v: v >= 0.95)

    def wait_of(group: str, quantile: str, by_tenant: bool = False) -> Any:
        def measure(st: RunStats) -> tuple[float | None, str]:
            g = (st.tenants if by_tenant else st.levels).get(group)
            if g is None:
                return None, "-"
            w: Wait = getattr(g, quantile)
            return w.seconds, str(w) + " s"

        return measure

    add("flood: low wait p99", "<= 1 s", "flood", wait_of("low", "p99"), lambda v: v <= 1.0)
    add(
        "trickle: critical wait p50",
        "(report)",
        "trickle",
        wait_of("critical", "p50"),
        None,
    )
    add(
        "trickle: critical wait p99",
        "<= 0.020 s",
        "trickle",
        wait_of("critical", "p99"),
        lambda v: v <= 0.020,
    )

    def jain_min(st: RunStats) -> tuple[float | None, str]:
        if not st.jain:
            return None, "-"
        return min(st.jain), f"min {min(st.jain):.3f}, mean {statistics.fmean(st.jain):.3f}"

    add(
        "tenant-pair: Jain(A,B) per 5 s window",
        "min >= 0.98",
        "tenant-pair",
        jain_min,
        lambda v: v >= 0.98,
    )
    add(
        "tenant-pair: sparse tenant max wait",
        "<= 1 s",
        "tenant-pair",
        wait_of("sparse", "max", by_tenant=True),
        lambda v: v <= 1.0,
    )

    def heavy_light(st: RunStats) -> tuple[float | None, str]:
        r = weighted_ratio(st)
        return r, _ratio(r)

    add(
        "tenant-weighted: heavy(3)/light(1) service",
        "2.7..3.3",
        "tenant-weighted",
        heavy_light,
        lambda v: 2.7 <= v <= 3.3,
    )
    if "tenant-weighted" in skipped:
        rows[-1].status, rows[-1].note = (
            "n/a",
            f"not measured, not met: {skipped['tenant-weighted']}",
        )

    def overload_min(st: RunStats) -> tuple[float | None, str]:
        ratios = {lv: g.share / WEIGHT_SHARE[lv] for lv, g in st.levels.items()}
        worst = min(ratios, key=ratios.__getitem__)
        return ratios[worst], f"min {ratios[worst]:.0%} ({worst})"

    add(
        "overload: each level's share / weight share",
        ">= 95%",
        "overload",
        overload_min,
        lambda v: v >= 0.95,
    )

    def bursts_dev(st: RunStats) -> tuple[float | None, str]:
        v = st.burst_dev
        return v, "-" if v is None else f"worst {v:+.0%}"

    add(
        "bursts: each tenant's share of each second vs equal",
        "<= 10% off",
        "bursts",
        bursts_dev,
        lambda v: v <= 0.10,
    )

    def emptying_dev(st: RunStats) -> tuple[float | None, str]:
        ratios = {lv: g.ratio for lv, g in st.levels.items() if g.ratio is not None}
        if not ratios:
            return None, "-"
        worst = max(ratios, key=lambda lv: abs(ratios[lv] - 1))
        text = "/".join(f"{r:.2f}" for r in ratios.values())
        return abs(ratios[worst] - 1), f"{text} ({worst})"

    add(
        "overload-emptying: each level's service / max-min",
        "<= 5% off",
        "overload-emptying",
        emptying_dev,
        lambda v: v <= 0.05,
    )

    def over_bound(st: RunStats) -> tuple[float | None, str]:
        n = sum(g.over_bound for g in st.levels.values())
        worst = max(
            (g.max for g in st.levels.values() if g.max.seconds is not None),
            key=lambda w: w.seconds or 0.0,
            default=Wait(None),
        )
        return n, f"{n} (max wait {worst} s)"

    add(
        f"underload: jobs over the bound ({args.bound_ms} ms)",
        "0",
        "underload",
        over_bound,
        lambda v: v == 0,
    )

    noloop = by_key.get(("overload", "fairqueue-noloop"))

    def throughput_ratio(st: RunStats) -> tuple[float | None, str]:
        if noloop is None or not noloop.throughput:
            return None, f"{st.throughput:.0f}/s"
        r = st.throughput / noloop.throughput
        return r, f"{r:.3f} ({st.throughput:.0f}/s)"

    add(
        "overload: throughput / fairqueue-noloop's",
        ">= 0.97",
        "overload",
        throughput_ratio,
        lambda v: v >= 0.97,
    )

    values, status = {}, "-"
    for scheduler in SCHEDULERS:
        runs = [st for (_, s), st in by_key.items() if s == scheduler]
        if not runs:
            values[scheduler] = "-"
            continue
        bad = sum(st.duplicates + st.lost + st.unknown + st.failed for st in runs)
        values[scheduler] = (
            f"dup {sum(st.duplicates for st in runs)}, lost {sum(st.lost for st in runs)}"
            + (f", other {sum(st.unknown + st.failed for st in runs)}" if bad else "")
        )
        if scheduler == "fairqueue":
            status = "PASS" if bad == 0 else "FAIL"
    rows.append(Target("Node worker: every job exactly once (all runs)", "0", values, status))
    return rows


def print_targets(rows: list[Target]) -> None:
    print("\n== targets (checked on fairqueue, loop running; baselines beside it)")
    widths = [46, 11, 30, 6, 30, 30]
    head = ["criterion", "target", "fairqueue", "status", "fairqueue-noloop", "plain"]
    print(" ".join(f"{h:<{w}}" for h, w in zip(head, widths, strict=True)).rstrip())
    for row in rows:
        cells = [
            row.criterion,
            row.target,
            row.values["fairqueue"],
            row.status,
            row.values["fairqueue-noloop"],
            row.values["plain"],
        ]
        print(" ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True)).rstrip())
        if row.note:
            print(f"{'':<{widths[0]}} note: {row.note}")


def plot(runs: list[tuple[Run, RunStats]], path: Path) -> None:
    """Cumulative jobs taken over time: one panel per scenario and scheduler, a line per
    level (per tenant in the tenant scenarios); dotted: end of arrivals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(run.scenario.name for run, _ in runs))
    schedulers = [s for s in SCHEDULERS if any(run.scheduler == s for run, _ in runs)]
    fig, axes = plt.subplots(
        len(scenarios),
        len(schedulers),
        figsize=(5 * len(schedulers), 3.0 * len(scenarios)),
        squeeze=False,
    )
    done = {(run.scenario.name, run.scheduler) for run, _ in runs}
    for row, name in enumerate(scenarios):
        for column, scheduler in enumerate(schedulers):
            if (name, scheduler) not in done:
                axes[row][column].set_axis_off()
    for run, _ in runs:
        ax = axes[scenarios.index(run.scenario.name)][schedulers.index(run.scheduler)]
        groups: dict[str, list[float]] = defaultdict(list)
        for job in run.jobs.values():
            if job.processed is not None:
                name = job.tenant if run.scenario.by_tenant else job.level
                groups[name].append((job.processed - run.t0_ms) / 1000)
        for name in sorted(groups, key=lambda g: (LEVELS.index(g) if g in LEVELS else 9, g)):
            starts = sorted(groups[name])
            ax.step(
                starts, range(1, len(starts) + 1), where="post", color=COLORS.get(name), label=name
            )
        ax.axvline((run.t_end_ms - run.t0_ms) / 1000, color="grey", linestyle=":")
        ax.axvline(WARMUP_S, color="grey", linestyle=":", alpha=0.5)
        ax.legend(loc="upper left", fontsize=7)
        ax.set_title(f"{run.scenario.name} - {run.scheduler}", fontsize=10)
        ax.grid(alpha=0.3)
        if run.scheduler == schedulers[0]:
            ax.set_ylabel("jobs taken (cumulative)")
        ax.set_xlabel("seconds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------


def setup_django() -> ThreadPoolExecutor:
    """Django on the benchmark's settings, used from one thread only (the in-memory
    database that ``enqueue_jobs`` writes its audit rows to is per connection)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    # A file, not memory: the rebalance loop this benchmark starts reads it too. One per
    # run (by pid): two benchmarks at once (a smoke run's, or two people's on one
    # machine) would otherwise migrate and delete each other's database.
    OUT.mkdir(parents=True, exist_ok=True)
    database = OUT / f"bench-{os.getpid()}.sqlite3"
    database.unlink(missing_ok=True)
    atexit.register(database.unlink, missing_ok=True)
    os.environ["FQBENCH_DB"] = str(database)
    import django

    django.setup()
    from django.core.management import call_command

    db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fqbench-db")
    db.submit(call_command, "migrate", verbosity=0).result()
    return db


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="arrivals per run (s)")
    parser.add_argument("--run-ms", type=float, default=10.0, help="each job's run time")
    parser.add_argument(
        "--concurrency", type=int, default=2, help="the worker's slots (in all processes)"
    )
    parser.add_argument(
        "--worker",
        choices=("node", "python"),
        default="node",
        help="the stock Node BullMQ worker, or fairqueue_worker (Python)",
    )
    parser.add_argument(
        "--worker-processes", type=int, default=2, help="--worker python: its --processes"
    )
    parser.add_argument("--interval-ms", type=int, default=250, help="rebalance interval")
    parser.add_argument("--bound-ms", type=int, default=3000, help="QUEUE_FAIR_MAX_WAIT_MS")
    parser.add_argument("--drain-s", type=float, default=3.0, help="drain phase cap (s)")
    parser.add_argument("--scenario", action="append", help="run only these (repeatable)")
    parser.add_argument("--scheduler", action="append", choices=SCHEDULERS)
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--out", type=Path, default=OUT / "fairness.png", help="the plot")
    parser.add_argument(
        "--breaker", action="store_true", help="the loop's breaker on; count its openings"
    )
    args = parser.parse_args(argv)
    if args.seconds <= WARMUP_S + 1:
        parser.error(f"--seconds must be more than {WARMUP_S + 1:g} (warm-up {WARMUP_S:g} s)")

    names = args.scenario or list(build_scenarios(1.0))
    unknown = sorted(set(names) - set(build_scenarios(1.0)))
    if unknown:
        parser.error(f"unknown scenario {unknown}: choose from {list(build_scenarios(1.0))}")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also where a shell started us ignoring it
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    LOG.unlink(missing_ok=True)
    db = setup_django()
    args.breakers = BreakerCount(args.breaker, db)
    try:
        weights_supported = db.submit(supports_tenant_weight).result()
        capacity, alone, rates = calibrate(args, db)
        print(
            f"capacity: {capacity:.0f} jobs/s while a producer enqueues at 2x ({alone:.0f} "
            f"alone; {worker_words(args)}, concurrency {args.concurrency}, "
            f"{args.run_ms:g} ms jobs; 1 s rates {rates})",
            flush=True,
        )
        scenarios = build_scenarios(capacity)
        results: list[tuple[Run, RunStats]] = []
        skipped: dict[str, str] = {}
        for name in names:
            scenario = scenarios[name]
            schedulers = args.scheduler or SCHEDULERS
            if scenario.needs_weights and not weights_supported:
                skipped[name] = "enqueue_jobs takes no tenant_weight= in this checkout"
                print(f"  {name}: fairqueue runs skipped, {skipped[name]}", flush=True)
                schedulers = [s for s in schedulers if s == "plain"]
            for scheduler in schedulers:
                run = run_one(scheduler, scenario, args, db)
                stats = analyse(run, args.bound_ms)
                results.append((run, stats))
                print(
                    f"  ran {name:<15} {scheduler:<17} {len(run.jobs):>6} enqueued, "
                    f"{sum(j.times > 0 for j in run.jobs.values()):>6} taken, "
                    f"{time.monotonic() - started:>4.0f} s elapsed",
                    flush=True,
                )
        print(
            f"\nSettings: capacity {capacity:.0f} jobs/s, {args.run_ms:g} ms jobs, "
            f"bound {args.bound_ms} ms, loop every {args.interval_ms} ms, "
            f"{args.seconds:g} s of arrivals (first {WARMUP_S:g} s not measured), "
            f"drain <= {args.drain_s:g} s."
        )
        print(
            "in/s, out/s = arrived / taken per second in the window; share = of all taken; "
            "entl/s = weighted max-min entitlement; ratio = taken / entitled; waits of jobs "
            "that arrived in the window (>= : some not taken by the end, age then); "
            ">bound = waits over the bound; left = never taken (still waiting at the end)."
        )
        by_key = {(st.scenario, st.scheduler): st for _, st in results}
        for name in dict.fromkeys(st.scenario for _, st in results):
            print_scenario(scenarios[name], [st for _, st in results if st.scenario == name])
        rows = targets(by_key, args, skipped)
        print_targets(rows)
        if results:
            plot(results, args.out)
            print(f"\nplot: {args.out}")
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "settings": {k: str(v) for k, v in vars(args).items()},
                        "capacity": capacity,
                        "calibration_rates": rates,
                        "scenarios": {
                            name: [asdict(source) for source in scenarios[name].sources]
                            for name in names
                        },
                        "tenant_weight_supported": weights_supported,
                        "skipped": skipped,
                        "runs": [asdict(st) for _, st in results],
                        "targets": [asdict(row) for row in rows],
                    },
                    indent=1,
                )
            )
            print(f"numbers: {args.json}")
        args.breakers.report()
        print(f"total time {time.monotonic() - started:.0f} s")
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted: workers and loops stopped, keys deleted", file=sys.stderr)
        return 130
    finally:
        db.shutdown()


if __name__ == "__main__":
    sys.exit(main())
