"""What fairness costs per job, in the producer and in Redis: fairqueue against raw
``bullmq``, side by side in one run, on a private ``redis-server`` (free port, no
persistence), so Redis's own CPU counters (``INFO cpu``: used_cpu_user + used_cpu_sys)
and ``INFO commandstats`` count this benchmark's commands only.

1. **Enqueue**, single and batch (100 jobs per call), ``--jobs`` jobs per case, best of
   ``--repeat`` runs (each figure its own best; the raw baseline is measured in every
   round, next to the fair cases):

   * raw: ``Queue.add`` / ``Queue.addBulk`` with a numeric priority and the very job
     options and data fields fairqueue gives its jobs (``removeOnComplete``,
     ``removeOnFail``, ``tenantId``, ``priorityLevel``);
   * fairqueue: ``enqueue_job`` / ``enqueue_jobs`` of a tenant's job with no lookup
     wired; with both database lookups wired (``wire_tenant_plan_lookup()``) and warm;
     with an explicit ``priority_level``; with a ``priority_override`` (audited).

   The Django cache is ``django_redis`` on the private server's database 1 (as in the
   demo project), so a lookup that goes through it shows in Redis's CPU too. The
   database is a fresh SQLite file (``--database-url`` for another one).
   Producer CPU is ``time.process_time()`` (every thread of this process).

2. **A job's whole life**: jobs enqueued one at a time at ``--rate`` jobs/s for
   ``--seconds`` while a stock Python BullMQ ``Worker`` (another process, concurrency
   50, or each of ``--concurrency``'s values in turn; 1 is BullMQ's leanest life and a
   stock Node worker's default; a no-op processor) drains them, until the queue is
   empty; Redis CPU over the whole window, per job. fairqueue (both lookups wired) runs
   without and with the ``rebalance_fair`` loop (another process, 5 s passes, its ticks
   every 250 ms), so the loop's share is the difference, and the loop once more with the
   usage ledger off (``USAGE_LEDGER = False``): the ledger's share is the difference of
   those two, printed as their ratio. ``--life-rounds`` rounds of the four runs,
   interleaved; each run's best is reported (the machine's other work only
   adds to a run's figure), and every round's figures below it.

3. **The loop's steps**, on a quiet server: a burst of a tick's worth
   of jobs (``--rate`` / 4) drained by the worker, then the tick (stalled check, a page
   of adoption, the history step) and, every 20th time, a pass, each step measured
   alone (Redis CPU from ``INFO cpu``, less what reading it costs); per job at ``--rate``.

4. **The add script, part by part**: the script's EVALSHA time per job (a batch of
   100 of one flow, and one job alone), and what each part of its per-job work costs:
   the whole script less a variant of it without that part (variants made here, from
   the loaded source; the shipped Lua is not touched).

5. **The history step** over one stretch of the events stream, replayed from the same
   cursor: today's recorder (the loop reads the page and works it out; one script
   writes the page's per-bucket and per-flow results) against the Lua recorder it
   replaced (the page read into a script and worked out there), Redis CPU per job.

Ratios are fairqueue / raw bullmq (1.00 = the same cost; lower is better).

    python benchmarks/bench_cost.py [--jobs 2000] [--repeat 3] [--rate 1000] [--seconds 10]
        [--life-rounds 3] [--concurrency 50 [1 ...]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
if "FQBENCH_COST_DIR" not in os.environ:  # the benchmark, not a worker it spawned
    os.environ["FQBENCH_COST_DIR"] = tempfile.mkdtemp(prefix="fqbench-cost-")
    # Read before Django is set up (tests.settings reads DATABASE_URL), so by hand here.
    _given = [arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("--database-url=")]
    os.environ["DATABASE_URL"] = (
        _given[0] if _given else f"sqlite:///{os.environ['FQBENCH_COST_DIR']}/bench.sqlite3"
    )
_DB_DIR = os.environ["FQBENCH_COST_DIR"]

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from bullmq import Queue, Worker  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from benchmarks.bench_rebalance import private_redis  # noqa: E402
from benchmarks.common import loop_process  # noqa: E402
from fairqueue import conf  # noqa: E402
from fairqueue.broker import Fence, close_brokers, get_broker  # noqa: E402
from fairqueue.enqueue import priority  # noqa: E402
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs  # noqa: E402

QUEUE = JOB_TYPE = "email"
BATCH = 100
TENANT = "t-1"
CONCURRENCY = 50
INTERVAL_MS = 5_000
#: Section 2's run with the loop and the usage ledger off (the usual run has it on).
LEDGER_OFF = "fairqueue + loop, ledger off"
TICK_MS = 250


# -- measuring ------------------------------------------------------------------------------


@dataclass
class Sample:
    """Per job: producer CPU (us), Redis CPU (us), script time (us) and commands."""

    producer_us: float
    redis_us: float
    script_us: float
    commands: float
    top: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def best(samples: list[Sample]) -> Sample:
        return Sample(
            min(s.producer_us for s in samples),
            min(s.redis_us for s in samples),
            min(s.script_us for s in samples),
            min(s.commands for s in samples),
            min(samples, key=lambda s: s.redis_us).top,
        )


class Meter:
    """Reads the private server's counters around a measured stretch."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)

    def redis_cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def start(self) -> tuple[float, float]:
        self.client.config_resetstat()
        return time.process_time(), self.redis_cpu()

    def stats(self) -> dict[str, tuple[int, int]]:
        """command -> (calls, usec) since the last reset (commands run by scripts are
        counted too, under their own names)."""
        return {
            name.removeprefix("cmdstat_"): (int(stat["calls"]), int(stat["usec"]))
            for name, stat in self.client.info("commandstats").items()
        }

    def stop(self, started: tuple[float, float], jobs: int) -> Sample:
        producer = time.process_time() - started[0]
        redis_cpu = self.redis_cpu() - started[1]
        stats = self.stats()
        scripts = sum(usec for name, (_, usec) in stats.items() if name in ("evalsha", "eval"))
        calls = sum(c for name, (c, _) in stats.items() if not name.startswith(("config", "info")))
        top = {
            name: usec / jobs
            for name, (_, usec) in sorted(stats.items(), key=lambda kv: -kv[1][1])[:4]
        }
        return Sample(
            producer * 1e6 / jobs, redis_cpu * 1e6 / jobs, scripts / jobs, calls / jobs, top
        )


def cpu_us(client: redis.Redis) -> float:
    """The server's CPU so far (us): unlike commandstats' times (wall clock inside a
    command), not inflated when the machine's other work preempts Redis."""
    info = client.info("cpu")
    return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6


# -- the enqueue cases ----------------------------------------------------------------------


def job_options() -> dict[str, Any]:
    """The options fairqueue gives every job (its retention), for the raw jobs too."""
    settings = conf.get_settings()
    return {
        "priority": 5,
        "removeOnComplete": settings.keep_completed.bullmq_option(),
        "removeOnFail": settings.keep_failed.bullmq_option(),
    }


def raw_data(i: int) -> dict[str, Any]:
    return {"i": i, "to": "a@example.com", "tenantId": TENANT, "priorityLevel": "normal"}


def fair_data(i: int) -> dict[str, Any]:
    return {"i": i, "to": "a@example.com"}


def raw_single(url: str, prefix: str, n: int, meter: Meter) -> Sample:
    async def main() -> Sample:
        queue = Queue(QUEUE, {"connection": url, "prefix": prefix})
        opts = job_options()
        await queue.add(QUEUE, raw_data(-1), opts)
        started = meter.start()
        for i in range(n):
            await queue.add(QUEUE, raw_data(i), opts)
        sample = meter.stop(started, n)
        await queue.close()
        return sample

    return asyncio.run(main())


def raw_bulk(url: str, prefix: str, n: int, meter: Meter) -> Sample:
    async def main() -> Sample:
        queue = Queue(QUEUE, {"connection": url, "prefix": prefix})
        opts = job_options()
        await queue.addBulk([{"name": QUEUE, "data": raw_data(-1), "opts": opts}])
        started = meter.start()
        for b in range(n // BATCH):
            await queue.addBulk(
                [
                    {"name": QUEUE, "data": raw_data(b * BATCH + i), "opts": opts}
                    for i in range(BATCH)
                ]
            )
        sample = meter.stop(started, n // BATCH * BATCH)
        await queue.close()
        return sample

    return asyncio.run(main())


def fair_single(n: int, meter: Meter, **options: Any) -> Sample:
    enqueue_job(JOB_TYPE, fair_data(-1), tenant_id=TENANT, **options)  # warm
    started = meter.start()
    for i in range(n):
        enqueue_job(JOB_TYPE, fair_data(i), tenant_id=TENANT, **options)
    return meter.stop(started, n)


def fair_bulk(n: int, meter: Meter, **options: Any) -> Sample:
    enqueue_jobs(JOB_TYPE, [fair_data(-1)], tenant_id=TENANT, **options)  # warm
    started = meter.start()
    for b in range(n // BATCH):
        enqueue_jobs(
            JOB_TYPE,
            [fair_data(b * BATCH + i) for i in range(BATCH)],
            tenant_id=TENANT,
            **options,
        )
    return meter.stop(started, n // BATCH * BATCH)


def wire(lookups: bool) -> None:
    if lookups:
        priority.wire_tenant_plan_lookup()  # the database lookups of plan and weight
    else:
        priority.unwire_tenant_plan_lookup()
        priority.unwire_tenant_weight_lookup()


FAIR_CASES: list[tuple[str, bool, dict[str, Any]]] = [
    ("no lookups", False, {}),
    ("both lookups wired, warm", True, {}),
    ("explicit priority_level, lookups wired", True, {"priority_level": "high"}),
    ("priority_override (audited), lookups wired", True, {"priority_override": "high"}),
]


@contextlib.contextmanager
def fairqueue_on(url: str, prefix: str, **extra: Any) -> Iterator[None]:
    fq = {"PREFIX": prefix, "QUEUES": {QUEUE: QUEUE}, "REDIS_URL": url, **extra}
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url.rsplit("/", 1)[0] + "/1",
            "KEY_PREFIX": prefix,
        }
    }
    with override_settings(FAIRQUEUE=fq, CACHES=caches):
        conf.reload_settings()
        try:
            yield
        finally:
            close_brokers()
            wire(False)
    conf.reload_settings()


def enqueue_costs(url: str, n: int, repeat: int) -> list[tuple[str, Sample, Sample]]:
    meter = Meter(url)
    raw: dict[str, list[Sample]] = {"single": [], "batch": []}
    fair: dict[tuple[str, str], list[Sample]] = {}
    flush = redis.Redis.from_url(url)
    for _ in range(repeat):
        for shape, raw_fn, fair_fn in (
            ("single", raw_single, fair_single),
            ("batch", raw_bulk, fair_bulk),
        ):
            flush.flushdb()
            raw[shape].append(raw_fn(url, "raw", n, meter))
            for name, lookups, options in FAIR_CASES:
                flush.flushdb()
                with fairqueue_on(url, f"fq{uuid.uuid4().hex[:6]}"):
                    wire(lookups)
                    fair.setdefault((shape, name), []).append(fair_fn(n, meter, **options))
    flush.flushdb()
    flush.close()
    rows = []
    for shape, label in (("single", "Queue.add"), ("batch", f"addBulk of {BATCH}")):
        base = Sample.best(raw[shape])
        for name, _, _ in FAIR_CASES:
            api = "enqueue_job" if shape == "single" else f"enqueue_jobs of {BATCH}"
            rows.append((f"{api}, {name} vs {label}", base, Sample.best(fair[(shape, name)])))
    return rows


# -- a job's whole life ---------------------------------------------------------------------


def _worker_main(url: str, prefix: str, ready: Any, stop: Any, concurrency: int) -> None:
    async def main() -> None:
        async def process(job, token):
            return None

        worker = Worker(
            QUEUE, process, {"connection": url, "prefix": prefix, "concurrency": concurrency}
        )
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await worker.close()

    asyncio.run(main())


@contextlib.contextmanager
def stock_worker(url: str, prefix: str, concurrency: int = CONCURRENCY) -> Iterator[None]:
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    process = ctx.Process(target=_worker_main, args=(url, prefix, ready, stop, concurrency))
    process.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the stock worker did not start")
        time.sleep(1.0)  # its connections are up and it blocks on the marker
        yield
    finally:
        stop.set()
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()


@contextlib.contextmanager
def rebalance_loop(url: str, prefix: str, log: Any, ledger: bool = True) -> Iterator[None]:
    env = {
        **os.environ,
        "FAIRQUEUE_REDIS_URL": url,
        "FAIRQUEUE_PREFIX": prefix,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "benchmarks.cost_settings",
        "FQBENCH_LEDGER": "1" if ledger else "0",
    }
    process = loop_process(JOB_TYPE, INTERVAL_MS, env, log)
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + 30
        while not client.exists(f"{prefix}:{QUEUE}:fq:leader"):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("the rebalance loop did not start (see its log)")
            time.sleep(0.05)
        time.sleep(1.0)  # past its first pass
        yield
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def waiting(client: redis.Redis, prefix: str) -> int:
    base = f"{prefix}:{QUEUE}"
    pipe = client.pipeline(transaction=False)
    pipe.zcard(f"{base}:prioritized")
    pipe.llen(f"{base}:wait")
    pipe.llen(f"{base}:active")
    pipe.zcard(f"{base}:delayed")
    return sum(pipe.execute())


def wait_drained(client: redis.Redis, prefix: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while waiting(client, prefix):
        if time.monotonic() > deadline:
            raise RuntimeError("the worker did not drain the queue in time")
        time.sleep(0.05)


@dataclass
class Life:
    name: str
    jobs: int
    seconds: float
    redis_us: float
    script_us: float

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


def paced(n: int, rate: float, add: Callable[[int], None]) -> None:
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        add(i)


def life(
    url: str, mode: str, rate: int, seconds: int, log: Any, concurrency: int = CONCURRENCY
) -> Life:
    n = rate * seconds
    prefix = f"{mode.split()[0]}{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(url)
    meter = Meter(url)
    try:
        with contextlib.ExitStack() as stack:
            if mode != "raw":
                stack.enter_context(fairqueue_on(url, prefix))
                wire(True)  # both lookups, as the demo project wires them
            stack.enter_context(stock_worker(url, prefix, concurrency))
            if mode.startswith("fairqueue + loop"):
                ledger = mode != LEDGER_OFF
                stack.enter_context(rebalance_loop(url, prefix, log, ledger))
            if mode == "raw":

                async def main() -> tuple[tuple[float, float], float]:
                    queue = Queue(QUEUE, {"connection": url, "prefix": prefix})
                    opts = job_options()
                    await queue.add(QUEUE, raw_data(-1), opts)
                    await asyncio.sleep(0.5)
                    started, t0 = meter.start(), time.perf_counter()
                    begin = time.perf_counter()
                    for i in range(n):
                        delay = begin + i / rate - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        await queue.add(QUEUE, raw_data(i), opts)
                    await queue.close()
                    return started, t0

                started, t0 = asyncio.run(main())
            else:
                enqueue_job(JOB_TYPE, fair_data(-1), tenant_id=TENANT)
                time.sleep(0.5)
                started, t0 = meter.start(), time.perf_counter()
                paced(n, rate, lambda i: enqueue_job(JOB_TYPE, fair_data(i), tenant_id=TENANT))
            wait_drained(client, prefix)
            elapsed = time.perf_counter() - t0
            sample = meter.stop(started, n)
    finally:
        client.flushdb()
        client.close()
    return Life(mode, n, elapsed, sample.redis_us, sample.script_us)


# -- the loop's steps, one at a time ----------------------------------------------------------


def loop_steps(url: str, rate: int, rounds: int = 40) -> dict[str, float]:
    """Script time (us) per job at ``rate`` of each step of the loop: a tick every
    TICK_MS over the jobs of that stretch, a pass every INTERVAL_MS."""
    from fairqueue.rebalance import leadership, pass_result, passes

    prefix = f"steps{uuid.uuid4().hex[:6]}"
    burst = max(1, rate * TICK_MS // 1000)
    client = redis.Redis.from_url(url)
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    token = "bench-steps"
    try:
        with fairqueue_on(url, prefix), stock_worker(url, prefix):
            settings = conf.get_settings()
            lock = leadership.LeaderLock(QUEUE, token, leadership.lock_ttl_ms(INTERVAL_MS))
            broker = get_broker()
            ttl = leadership.lock_ttl_ms(INTERVAL_MS)
            fence = Fence(broker.fair_key(QUEUE, "leader"), token, ttl)
            from fairqueue.broker import get_sync_broker

            sync = get_sync_broker()

            # What reading the counter costs Redis (INFO itself), taken off each step.
            idle = min(-cpu_us(client) + cpu_us(client) for _ in range(20))

            def step(name: str, fn: Callable[[], Any]) -> None:
                lock.acquire()
                before = cpu_us(client)
                fn()
                usec = cpu_us(client) - before - idle
                totals[name] = totals.get(name, 0.0) + usec
                counts[name] = counts.get(name, 0) + 1

            def run(coro_fn: Callable[..., Any]) -> Callable[[], Any]:
                async def call() -> Any:
                    result = pass_result.PassResult(job_type=JOB_TYPE, queue=QUEUE)
                    return await coro_fn(pass_result.Timed(result), broker, QUEUE, fence, result)

                return lambda: sync.run(call)

            max_wait = settings.max_wait_ms

            async def record(timed, broker_, queue, fence_, result):
                await passes._record(timed, broker_, queue, fence_, max_wait)

            async def adopt(timed, broker_, queue, fence_, result):
                await passes._adopt(timed, broker_, queue, fence_, result, dry_run=False)

            passes_every = INTERVAL_MS // TICK_MS
            for i in range(rounds):
                enqueue_jobs(JOB_TYPE, [fair_data(j) for j in range(burst)], tenant_id=TENANT)
                wait_drained(client, prefix)
                step("tick: stalled check", run(passes._recover_stalled))
                step("tick: adopt a page", run(adopt))
                step("tick: history", run(record))
                if i % passes_every == passes_every - 1:
                    step(
                        "pass (whole)",
                        lambda: passes.rebalance_queue(
                            JOB_TYPE, rebalancer=token, interval_ms=INTERVAL_MS
                        ),
                    )
    finally:
        client.flushdb()
        client.close()
    ticks_per_s = 1000 / TICK_MS
    per_job: dict[str, float] = {}
    for name, usec in totals.items():
        per_call = usec / counts[name]
        per_s = per_call * (ticks_per_s if name.startswith("tick") else 1000 / INTERVAL_MS)
        per_job[name] = per_s / rate
    return per_job


# -- the add script, part by part -------------------------------------------------------------

#: Variants of the add script, each without one part of its per-job work (text edits of
#: the loaded source, here only: the shipped Lua is untouched). The cost of a part is the
#: full script's time less its variant's.
ADD_VARIANTS: dict[str, list[tuple[str, str]]] = {
    "the ready-second index (one RPUSH per call)": [
        ("fqIndexMany(fqKeys, fqIndexed, fqNow)\n", "")
    ],
    "the fqReady slot filled in (bytes, per job)": [
        (
            "  if slotted then job.opts = string.sub(job.opts, 1, -10) .. fqReadyPacked end\n",
            "",
        )
    ],
    "the flows' state (fqPlace over the call's memo, per job)": [
        (
            "score, behind, paid, cost = fqPlace(fqKeys, fqClockState, job.level, job.tenant, "
            "job.weight,\n        job.cost, false, job.account, job.accountWeight)",
            "score = fqFloor * fqScore + 4 * (#fqReplies + 1)",
        )
    ],
    "the flows' state written once (fqFlush, per call)": [
        ("fqFlush(fqKeys, fqClockState)\nfqIndexMany", "fqIndexMany")
    ],
    # No row for the fair score itself: since c71f14d it is BullMQ's own ZADD's argument,
    # not a command; leaving it out would place the job at the cap instead (no saving).
}


def lua_at(rev: str, name: str) -> str:
    """``lua/<name>.lua`` as it was at git revision ``rev``, its includes (from the same
    revision) expanded and constants filled in as the loader does: a script from before
    a change, measured beside today's in the same run."""
    from fairqueue.broker import scripts

    # Entry scripts, wrapped scripts and included libraries live in lua/, lua/wrap/ and
    # lua/include/ (once all in lua/): the first that holds the name at that revision.
    for folder in ("", "wrap/", "include/"):
        shown = subprocess.run(
            ["git", "show", f"{rev}:fairqueue/broker/lua/{folder}{name}.lua"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if shown.returncode == 0:
            text = shown.stdout
            break
    else:
        raise FileNotFoundError(f"lua script {name!r} at git revision {rev!r}")
    text = scripts._INCLUDE.sub(lambda match: lua_at(rev, match.group(1)), text)
    return scripts._CONSTANT.sub(lambda match: str(scripts._CONSTANTS[match.group(1)]), text)


def add_script_at(rev: str) -> str:
    """The add script as it was at ``rev`` (its per-job arguments are today's, less the
    fields that revision did not read: :func:`add_job_fields_at`)."""
    from fairqueue.broker.scripts import ADD_SCORE_EDIT, Argv, bullmq_source

    head, tail = lua_at(rev, "add_jobs.head"), lua_at(rev, "add_jobs.tail")
    # From c71f14d the fair score goes into BullMQ's own ZADD (the head declares it).
    edit = ADD_SCORE_EDIT if "fqScoreText" in head else None
    if "--- @argv" in head:  # named arguments (ARGV.jobs), rendered as the loader does
        argv = Argv.declared("add_jobs", head)
        head, tail = argv.render(head), argv.render(tail)
    return head + bullmq_source("addPrioritizedJob-9.lua", edit) + tail


def add_job_fields_at(rev: str) -> int:
    """How many values per job the add script read at ``rev`` (``ADD_JOB_FIELDS``; today's
    later fields are appended, so a job's first that many are the ones it read)."""
    from fairqueue.scheduling.wire import ADD_JOB_FIELDS

    shown = subprocess.run(
        ["git", "show", f"{rev}:fairqueue/scheduling/wire.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    found = re.search(r"ADD_JOB_FIELDS: Final = \(([^)]*)\)", shown.stdout)
    return len(re.findall(r'"\w+"', found.group(1))) if found else len(ADD_JOB_FIELDS)


def add_script_sources(rev: str | None = None) -> dict[str, str]:
    """The add script's source by name: the whole script, each of :data:`ADD_VARIANTS`,
    and with ``rev`` the whole script as it was at that git revision."""
    from fairqueue.broker import add_jobs_script

    full = add_jobs_script().source
    sources = {"whole script": full}
    if rev:
        sources[f"whole script at {rev}"] = add_script_at(rev)
    for name, edits in ADD_VARIANTS.items():
        source = full
        for old, new in edits:
            if old not in source:
                raise SystemExit(f"the add script changed: cannot leave out {name}")
            source = source.replace(old, new)
        sources[name] = source
    return sources


def add_script_parts(
    url: str, n: int, repeat: int, rev: str | None = None
) -> list[tuple[str, float, float]]:
    """(part, us per job in a batch of BATCH, us per job alone) of the add script; with
    ``rev``, the whole script as it was at that git revision too."""
    from fairqueue.broker import NewJob
    from fairqueue.broker.scripts import script_sha
    from fairqueue.scheduling.levels import PriorityLevel

    sources = add_script_sources(rev)
    client = redis.Redis.from_url(url)
    for source in sources.values():
        client.script_load(source)
    per_job: dict[str, list[tuple[float, float]]] = {name: [] for name in sources}
    try:
        for _ in range(repeat):
            for name, source in sources.items():
                sha = script_sha(source)
                shapes = []
                for size in (BATCH, 1):
                    client.flushdb()
                    with fairqueue_on(url, f"parts{uuid.uuid4().hex[:6]}"):
                        packer = get_broker().adding.packer
                        jobs = [
                            NewJob(
                                QUEUE,
                                {**fair_data(i), "tenantId": TENANT, "priorityLevel": "normal"},
                                PriorityLevel.NORMAL,
                                tenant=TENANT,
                            )
                            for i in range(size)
                        ]
                        commands = [packer.add_commands(QUEUE, jobs)[0] for _ in range(n // size)]
                        before = cpu_us(client)
                        for command in commands:
                            client.evalsha(sha, len(command.keys), *command.keys, *command.args)
                        shapes.append((cpu_us(client) - before) / (n // size * size))
                per_job[name].append((shapes[0], shapes[1]))
    finally:
        client.flushdb()
        client.close()
    best = {
        name: (min(b for b, _ in runs), min(s for _, s in runs)) for name, runs in per_job.items()
    }
    whole = best.pop("whole script")
    rows = [("whole script", *whole)]
    if rev:
        rows.append((f"whole script at {rev}", *best.pop(f"whole script at {rev}")))
    rows += [(name, whole[0] - batch, whole[1] - single) for name, (batch, single) in best.items()]
    return rows


# -- the history step, today's against the Lua recorder ----------------------------------------

#: The last revision that recorded the history in a Lua script (``history_record.lua``:
#: the stream page read into the script, per-job work in Redis); measured beside today's.
LUA_RECORDER_REV = "aeb023f"


def history_parts(url: str, jobs: int, rev: str | None = None) -> list[tuple[str, float, int]]:
    """(variant, Redis CPU us per started job, calls) over one stretch of ``jobs`` jobs'
    events, each variant from the same cursor: today's recorder (the loop reads the page
    and works it out, one script writes it) with fairness by time and by jobs, and the
    Lua recorder of :data:`LUA_RECORDER_REV` (or ``rev``) as it was called then."""
    from fairqueue.broker import get_sync_broker
    from fairqueue.scheduling.shares import BUCKET_S, RETENTION_S, TENANTS_PER_BUCKET

    prefix = f"hist{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(url)
    lua_rev = rev or LUA_RECORDER_REV
    try:
        old_lua = lua_at(lua_rev, "history_record")
    except subprocess.CalledProcessError:
        old_lua = None  # not a git checkout, or the revision is unknown
    token, base = "bench-history", f"{prefix}:{QUEUE}"
    keys = [f"{base}:events", f"{base}:fq:hist", f"{base}:fq:leader"]
    keys += [f"{base}:fq:run", f"{base}:fq:state", f"{base}:fq:flows", f"{base}:fq:fweights"]
    rows = []
    try:
        # Every finished job kept, so each start the step reads has its hash (as when the
        # loop reads the stream while the jobs run; here it reads after the drain).
        keep = {"KEEP_COMPLETED": {"count": 10 * jobs, "age": 86_400}}
        with fairqueue_on(url, prefix, **keep), stock_worker(url, prefix):
            broker, sync = get_broker(), get_sync_broker()

            def today(fairness_by: str) -> Callable[[], tuple[int, bool]]:
                async def page() -> tuple[int, bool]:
                    recorded = await broker.history.record_history_page(
                        QUEUE,
                        fence=Fence(keys[2], token, 60_000),
                        max_wait_ms=300_000,
                        fairness_by=fairness_by,
                    )
                    return recorded.recorded, recorded.more

                return lambda: sync.run(page)

            variants: dict[str, Callable[[], tuple[int, bool]]] = {
                "today: the loop reads and works out the page, one script writes it "
                "(fairness by time)": today("time"),
                "today, fairness by jobs": today("jobs"),
            }
            if old_lua is not None:
                script = client.register_script(old_lua)
                args = [token, 60_000, f"{base}:", f"{base}:fq:hist:", 1_000, BUCKET_S]
                args += [RETENTION_S, 300_000, 65_536, TENANTS_PER_BUCKET, 1_048_576, "time"]

                def lua_page() -> tuple[int, bool]:
                    reply = script(keys=keys, args=args)
                    return int(reply[2]), bool(int(reply[5]))

                variants[f"the Lua recorder at {lua_rev} (the page read into the script)"] = (
                    lua_page
                )
            client.set(keys[2], token)
            variants[next(iter(variants))]()  # the cursor
            for _ in range(0, jobs, BATCH):
                enqueue_jobs(JOB_TYPE, [fair_data(i) for i in range(BATCH)], tenant_id=TENANT)
            wait_drained(client, prefix)
            saved = client.hgetall(keys[1])
            state = {key: client.dump(key) for key in keys[3:]}
            best: dict[str, tuple[float, int]] = {}
            for name, page_fn in [*variants.items()] * 3:
                client.delete(keys[1], *keys[3:])
                client.hset(keys[1], mapping=saved)
                for key, dumped in state.items():
                    if dumped is not None:
                        client.restore(key, 0, dumped)
                calls, recorded, more = 0, 0, True
                cpu_before = cpu_us(client)
                while more:
                    got, more = page_fn()
                    calls += 1
                    recorded += got
                per_job = (cpu_us(client) - cpu_before) / max(recorded, 1)
                if name not in best or per_job < best[name][0]:
                    best[name] = (per_job, calls)
            rows = [(name, us, calls) for name, (us, calls) in best.items()]
    finally:
        client.flushdb()
        client.close()
    return rows


# -- the report -----------------------------------------------------------------------------


def ratio(fair: float, raw: float) -> str:
    return f"{fair / raw:.2f}x" if raw > 0 else "n/a"


def print_enqueue(rows: list[tuple[str, Sample, Sample]], n: int, repeat: int) -> None:
    print(
        f"\n1. Enqueue: per job, {n} jobs per case, best of {repeat} (us; ratio = fairqueue / "
        "raw bullmq)\n"
    )
    print(
        "| case | producer CPU raw | fairqueue | ratio | Redis CPU raw | fairqueue | ratio "
        "| scripts raw | fairqueue | commands raw | fairqueue |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, raw, fair in rows:
        print(
            f"| {name} | {raw.producer_us:.0f} | {fair.producer_us:.0f} "
            f"| {ratio(fair.producer_us, raw.producer_us)} | {raw.redis_us:.1f} "
            f"| {fair.redis_us:.1f} | {ratio(fair.redis_us, raw.redis_us)} "
            f"| {raw.script_us:.1f} | {fair.script_us:.1f} | {raw.commands:.1f} "
            f"| {fair.commands:.1f} |"
        )
    print("\nTop commands by Redis time per job (us, commands run by scripts included):")
    for name, _raw, fair in rows:
        tops = ", ".join(f"{k} {v:.1f}" for k, v in fair.top.items())
        print(f"  {name}: {tops}")
    print(f"  raw: {', '.join(f'{k} {v:.1f}' for k, v in rows[0][1].top.items())}")


def print_life(
    lives: list[Life], rate: int, rounds: list[list[Life]], concurrency: int = CONCURRENCY
) -> None:
    raw = lives[0]
    print(
        f"\n2. A job's whole life (add, take, complete, and the loop's share): {raw.jobs} jobs "
        f"offered at {rate}/s, one stock Python worker (concurrency {concurrency}) draining; "
        f"each run's best of {len(rounds)} interleaved rounds\n"
    )
    print(
        "| run | jobs/s | Redis CPU per job (us) | ratio | scripts per job (us) "
        "| Redis CPU % of a core |"
    )
    print("|---|---|---|---|---|---|")
    for run in lives:
        print(
            f"| {run.name} | {run.rate:.0f} | {run.redis_us:.1f} "
            f"| {ratio(run.redis_us, raw.redis_us)} | {run.script_us:.1f} "
            f"| {run.redis_us * run.rate / 1e4:.1f} |"
        )
    if len(lives) >= 3:
        loop = lives[2].redis_us - lives[1].redis_us
        print(
            f"\nThe loop's share: {loop:.1f} us per job, {loop / lives[2].redis_us:.1%} of "
            "the fair run's Redis CPU"
        )
    if len(lives) == 4:
        on, off = lives[2].redis_us, lives[3].redis_us
        print(
            f"The usage ledger (on / off, the loop running): {on:.1f} / {off:.1f} us per job, "
            f"ratio {on / off:.3f} ({on - off:+.1f} us, {(on - off) / off:+.1%})"
        )
        for i, runs in enumerate(rounds, 1):
            print(f"  round {i}: on / off {runs[2].redis_us / runs[3].redis_us:.3f}")
    if len(rounds) > 1:
        print("\nEach round (Redis CPU per job, us; ratios to that round's raw run):")
        for i, runs in enumerate(rounds, 1):
            cells = ", ".join(
                f"{run.name} {run.redis_us:.1f} ({ratio(run.redis_us, runs[0].redis_us)})"
                for run in runs
            )
            print(f"  round {i}: {cells}")


def print_steps(steps: dict[str, float], rate: int, whole: float | None) -> None:
    print(
        f"\n3. The loop's steps at {rate} jobs/s: Redis CPU per job (us), a tick every "
        f"{TICK_MS} ms, a pass every {INTERVAL_MS} ms\n"
    )
    print("| step | us per job | share of a job's whole life |")
    print("|---|---|---|")
    for name, us in steps.items():
        share = f"{us / whole:.1%}" if whole else "n/a"
        print(f"| {name} | {us:.2f} | {share} |")
    total = sum(steps.values())
    print(f"| all | {total:.2f} | {total / whole:.1%} |" if whole else f"| all | {total:.2f} | |")


def print_parts(rows: list[tuple[str, float, float]], n: int) -> None:
    print(
        f"\n4. The add script's time per job, part by part ({n} jobs, one flow; us of "
        "Redis CPU per job; a part = the whole less a variant without it)\n"
    )
    print(f"| part | batch of {BATCH} | alone (enqueue_job) |")
    print("|---|---|---|")
    for name, batch, single in rows:
        print(f"| {name} | {batch:.1f} | {single:.1f} |")


def print_history(rows: list[tuple[str, float, int]], jobs: int) -> None:
    print(
        f"\n5. The history step over one stretch of the events stream ({jobs} jobs started "
        "and completed), each recorder replayed from the same cursor, best of 3: Redis CPU "
        "per started job\n"
    )
    print("| variant | us per started job | calls |")
    print("|---|---|---|")
    for name, us, calls in rows:
        print(f"| {name} | {us:.1f} | {calls} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", type=int, default=1_000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument(
        "--life-rounds",
        type=int,
        default=3,
        help="rounds of section 2's four runs, interleaved (each run's best is reported)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[CONCURRENCY],
        help="section 2: the stock worker's concurrency; several values, a table each "
        "(1 is BullMQ's leanest life and a stock Node worker's default)",
    )
    parser.add_argument(
        "--database-url", help="--database-url=URL: a database instead of a fresh SQLite file"
    )
    parser.add_argument(
        "--before",
        metavar="REV",
        help="a git revision: the add and history scripts as they were there, measured "
        "beside today's (sections 4 and 5)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["enqueue", "life", "steps", "parts", "history"],
        default=["enqueue", "life", "steps", "parts", "history"],
    )
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    from fairqueue.models import TenantPlan

    TenantPlan.objects.update_or_create(
        tenant_id=TENANT, defaults={"plan_tier": "pro", "weight": 2}
    )
    print(f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()}")
    log_path = Path(_DB_DIR) / "loop.log"
    try:
        run(args, log_path)
    finally:
        shutil.rmtree(_DB_DIR, ignore_errors=True)  # the SQLite file and the loop's log
    print(f"\nload average at the end: {os.getloadavg()}")


def run(args: argparse.Namespace, log_path: Path) -> None:
    with private_redis() as url, open(log_path, "w") as log:
        if "enqueue" in args.only:
            print_enqueue(enqueue_costs(url, args.jobs, args.repeat), args.jobs, args.repeat)
        whole = None
        if "life" in args.only:
            # Rounds of the four runs, interleaved; each run's best (its least Redis CPU
            # per job: the machine's other work only ever adds to it).
            modes = ("raw", "fairqueue", "fairqueue + loop", LEDGER_OFF)
            for slots in args.concurrency:
                rounds = [
                    [life(url, mode, args.rate, args.seconds, log, slots) for mode in modes]
                    for _ in range(args.life_rounds)
                ]
                lives = [
                    min(runs, key=lambda run: run.redis_us) for runs in zip(*rounds, strict=True)
                ]
                print_life(lives, args.rate, rounds, slots)
                whole = lives[2].redis_us if whole is None else whole
        if "steps" in args.only:
            print_steps(loop_steps(url, args.rate), args.rate, whole)
        if "parts" in args.only:
            print_parts(add_script_parts(url, args.jobs, args.repeat, args.before), args.jobs)
        if "history" in args.only:
            print_history(history_parts(url, args.jobs, args.before), args.jobs)


if __name__ == "__main__":
    main()
