"""A job's whole life in Redis's instructions: fairqueue against raw ``bullmq``, counted by
callgrind, so the ratio does not move with the machine's load.

``bench_cost.py``'s whole-life section measures Redis's CPU time while producer, worker,
loop and Redis share the machine; on two cores its ratios move by 0.1 between runs of the
same code. Here a private ``redis-server`` runs under ``valgrind --tool=callgrind`` and
each job lives alone: added (``Queue.add`` / ``enqueue_job`` with both lookups wired),
taken and completed by a stock Python ``Worker`` (another process, a no-op processor),
and only then the next; the instructions Redis ran between two counter dumps, per job.
Then, over the same jobs' events, the loop's tick (stalled check, a page of adoption,
the history step) and a pass, each counted alone; the tick's share per job as at
``--rate`` jobs/s with a tick every 250 ms (a tick covers rate / 4 jobs), the pass's as
one per 20 ticks.

Two worker shapes: concurrency 1 (the leanest life BullMQ has: the strictest ratio) and
concurrency 50 (as in ``bench_cost.py``; each idle slot's poll is counted too, as it is in
production). Instructions are a proxy for CPU time: cache misses and the machine's
contention are not counted. Needs ``valgrind`` (``apt-get install valgrind``).

Then (``--parts``) the add script alone, part by part: each add into an empty queue (as
when workers keep up), followed by the same bare take (a ZPOPMIN and a DEL in Lua),
for the whole script and for each of ``bench_cost.ADD_VARIANTS`` (the script without one
part of its work): a part's instructions are the whole script's less its variant's.

Then (``--producer``) the producer's own instructions per job: the producing process
itself under callgrind, counting only while it adds (``callgrind_control -i``), raw
``Queue.add`` / ``addBulk`` of 100 against ``enqueue_job`` / ``enqueue_jobs`` of 100
with both lookups wired and warm, and with an explicit level. Producer CPU in
``bench_cost.py`` is process time and moves by 10% between runs; this does not (the
kernel's share, a socket write and read per call in both, is not counted).

``--account``: the add script alone for a job of a tenant with an account against one
without (into an empty queue, and beside a backlog of 20 flows, 10 of them one account's),
then the whole life of each.

    python benchmarks/bench_instructions.py [--jobs 250] [--rate 1000] [--parts [--rev REV]]
        [--producer] [--account]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from bullmq import Queue  # noqa: E402

from benchmarks import bench_cost as bc  # noqa: E402  (sets Django up)
from benchmarks.bench_rebalance import private_redis  # noqa: E402


@contextmanager
def counted_redis(only: str | None = None) -> Iterator[tuple[str, Callable[[], int]]]:
    """A private redis-server under callgrind; its URL and a function that dumps the
    counters and returns the instructions run since the last dump. ``only``: count only
    inside that function of Redis's (``evalShaCommand``: the scripts alone, without the
    timer work that the machine's load stretches or shrinks)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    out = tempfile.mkdtemp(prefix="fqbench-callgrind-")
    wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.out"]
    if only is not None:
        wrapper.append(f"--toggle-collect={only}")
    try:
        with private_redis(wrapper=wrapper, start_timeout_s=60) as url:
            client = redis.Redis.from_url(url)
            pid = client.info("server")["process_id"]  # valgrind runs it in its own process
            client.close()

            def dump() -> int:
                subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True)
                files = sorted(glob.glob(f"{out}/cg.out.*"), key=os.path.getmtime)
                with open(files[-1]) as dumped:
                    for line in dumped:
                        if line.startswith(("summary:", "totals:")):
                            return int(line.split()[1])
                raise RuntimeError("callgrind wrote no totals")

            yield url, dump
    finally:
        shutil.rmtree(out, ignore_errors=True)


class Completions:
    """Waits for a job's 'completed' event with one blocking XREAD at a time: the same
    few commands per job for both producers, none while blocked."""

    def __init__(self, url: str, prefix: str) -> None:
        # No socket timeout: XREAD blocks up to 60 s, longer than redis-py 8's default
        # socket_timeout (5 s), which would end the benchmark before its first row.
        self.client = redis.Redis.from_url(url, socket_timeout=None)
        self.key, self.since = f"{prefix}:{bc.QUEUE}:events", "0-0"

    def wait(self, job_id: int) -> None:
        while True:
            reply = self.client.xread({self.key: self.since}, block=60_000, count=100)
            if not reply:
                raise RuntimeError(f"job {job_id} did not complete")
            for entry_id, fields in reply[0][1]:
                self.since = entry_id
                if fields.get(b"event") == b"completed" and int(fields[b"jobId"]) >= job_id:
                    return


def raw_life(url: str, jobs: int, concurrency: int, dump: Callable[[], int]) -> float:
    prefix = f"raw{uuid.uuid4().hex[:6]}"
    done = Completions(url, prefix)

    async def main() -> float:
        queue = Queue(bc.QUEUE, {"connection": url, "prefix": prefix})
        opts = bc.job_options()
        await queue.add(bc.QUEUE, bc.raw_data(-1), opts)
        done.wait(1)
        dump()
        for i in range(jobs):
            await queue.add(bc.QUEUE, bc.raw_data(i), opts)
            done.wait(i + 2)
        counted = dump()
        await queue.close()
        return counted / jobs

    with bc.stock_worker(url, prefix, concurrency):
        return asyncio.run(main())


#: A tenant of an account (``--account``): its jobs carry the account (docs/concepts.md).
ACCOUNT_TENANT = "t-acct"


def fair_life(
    url: str, jobs: int, concurrency: int, rate: int, dump: Callable[[], int], tenant: str = ""
) -> dict[str, float]:
    from fairqueue.broker import Fence, get_sync_broker
    from fairqueue.rebalance import leadership, pass_result, passes

    prefix = f"fair{uuid.uuid4().hex[:6]}"
    done = Completions(url, prefix)
    per_tick = rate * bc.TICK_MS / 1000
    ticks_per_pass = bc.INTERVAL_MS // bc.TICK_MS
    with bc.fairqueue_on(url, prefix), bc.stock_worker(url, prefix, concurrency):
        bc.wire(True)
        broker, sync = bc.get_broker(), get_sync_broker()
        token = "bench-instructions"
        ttl = leadership.lock_ttl_ms(bc.INTERVAL_MS)
        lock = leadership.LeaderLock(bc.QUEUE, token, ttl)
        fence = Fence(broker.fair_key(bc.QUEUE, "leader"), token, ttl)
        max_wait = bc.conf.get_settings().max_wait_ms

        def step(fn: Callable[..., Any]) -> None:
            async def call() -> None:
                result = pass_result.PassResult(job_type=bc.JOB_TYPE, queue=bc.QUEUE)
                await fn(pass_result.Timed(result), broker, bc.QUEUE, fence, result)

            sync.run(call)

        async def record(timed: Any, broker_: Any, queue: str, fence_: Fence, result: Any) -> None:
            await passes._record(timed, broker_, queue, fence_, max_wait)

        async def adopt(timed: Any, broker_: Any, queue: str, fence_: Fence, result: Any) -> None:
            await passes._adopt(timed, broker_, queue, fence_, result, dry_run=False)

        lock.acquire()
        step(record)  # the history's cursor
        # Every script loaded (compiling one is not a job's cost): a job and a round of
        # every step before the count starts.
        tenant = tenant or bc.TENANT
        bc.enqueue_job(bc.JOB_TYPE, bc.fair_data(-1), tenant_id=tenant)
        done.wait(1)
        for warm in (passes._recover_stalled, adopt, record):
            step(warm)
        passes.rebalance_queue(bc.JOB_TYPE, rebalancer=token, interval_ms=bc.INTERVAL_MS)
        dump()
        for i in range(jobs):
            bc.enqueue_job(bc.JOB_TYPE, bc.fair_data(i), tenant_id=tenant)
            done.wait(i + 2)
        life = dump() / jobs
        lock.acquire()
        dump()
        step(passes._recover_stalled)
        stalled = dump()
        step(adopt)
        adopted = dump()
        step(record)  # every job's events: as many ticks' worth as jobs / per_tick
        history = dump() / jobs
        passes.rebalance_queue(bc.JOB_TYPE, rebalancer=token, interval_ms=bc.INTERVAL_MS)
        a_pass = dump()
    return {
        "fairqueue": life,
        "tick: stalled check": stalled / per_tick,
        "tick: adopt a page": adopted / per_tick,
        "tick: history": history,
        "pass": a_pass / (per_tick * ticks_per_pass),
    }


#: A bare take: the head of the prioritized set popped and its hash deleted, so the next
#: add finds the queue empty (the same work after every variant's add).
TAKE = """
local head = redis.call('ZPOPMIN', KEYS[1])
if head[1] then redis.call('DEL', KEYS[2] .. head[1]) end
"""


def add_parts(
    url: str, jobs: int, dump: Callable[[], int], rev: str | None = None
) -> list[tuple[str, float]]:
    """(variant, instructions per add and take) of the add script and its variants (and
    with ``rev``, the whole script as it was at that git revision)."""
    from fairqueue.broker import NewJob
    from fairqueue.scheduling.levels import PriorityLevel
    from fairqueue.scheduling.wire import ADD_JOB_FIELDS

    sources = bc.add_script_sources(rev)
    # the revision's script reads fewer values per job: a job's args end with what it skips
    skipped = len(ADD_JOB_FIELDS) - bc.add_job_fields_at(rev) if rev else 0
    client = redis.Redis.from_url(url)
    take = client.register_script(TAKE)
    rows = []
    try:
        for name, source in sources.items():
            sha = client.script_load(source)
            cut = skipped if name == f"whole script at {rev}" else 0
            prefix = f"parts{uuid.uuid4().hex[:6]}"
            with bc.fairqueue_on(url, prefix):
                packer = bc.get_broker().adding.packer
                base = f"{prefix}:{bc.QUEUE}"
                keys = [f"{base}:prioritized", f"{base}:"]
                commands = []
                for i in range(jobs + 1):
                    data = {**bc.fair_data(i), "tenantId": bc.TENANT, "priorityLevel": "normal"}
                    job = NewJob(bc.QUEUE, data, PriorityLevel.NORMAL, tenant=bc.TENANT)
                    commands.append(packer.add_commands(bc.QUEUE, [job])[0])
                for i, command in enumerate(commands):
                    if i == 1:
                        dump()  # the first add and take (a script's first run) not counted
                    args = command.args[: len(command.args) - cut]
                    client.evalsha(sha, len(command.keys), *command.keys, *args)
                    take(keys=keys)
                rows.append((name, dump() / jobs))
            for key in client.scan_iter(f"{prefix}:*"):
                client.delete(key)
        rows.append(("raw bullmq (Queue.add with a priority)", raw_adds(url, jobs, dump, take)))
    finally:
        client.close()
    return rows


def raw_adds(url: str, jobs: int, dump: Callable[[], int], take: Any) -> float:
    """BullMQ's own prioritized add (``addPrioritizedJob``), each followed by the take."""
    prefix = f"rawparts{uuid.uuid4().hex[:6]}"
    keys = [f"{prefix}:{bc.QUEUE}:prioritized", f"{prefix}:{bc.QUEUE}:"]

    async def main() -> float:
        queue = Queue(bc.QUEUE, {"connection": url, "prefix": prefix})
        opts = bc.job_options()
        for i in range(jobs + 1):
            if i == 1:
                dump()
            await queue.add(bc.QUEUE, bc.raw_data(i), opts)
            take(keys=keys)
        counted = dump()
        await queue.obliterate({"force": True})
        await queue.close()
        return counted / jobs

    return asyncio.run(main())


#: --producer's cases: (name, fairqueue or raw, jobs per call, enqueue options).
PRODUCER_CASES: list[tuple[str, str, int, dict[str, Any]]] = [
    ("Queue.add", "raw", 1, {}),
    ("enqueue_job, both lookups wired, warm", "fair", 1, {}),
    ("enqueue_job, explicit priority_level", "fair", 1, {"priority_level": "high"}),
    ("enqueue_job, a tenant with an account, warm", "fair", 1, {"tenant_id": ACCOUNT_TENANT}),
    (f"Queue.addBulk of {bc.BATCH}", "raw", bc.BATCH, {}),
    (f"enqueue_jobs of {bc.BATCH}, both lookups wired, warm", "fair", bc.BATCH, {}),
    (
        f"enqueue_jobs of {bc.BATCH}, explicit priority_level",
        "fair",
        bc.BATCH,
        {"priority_level": "high"},
    ),
]


def produce(url: str, case: int, jobs: int) -> None:
    """The --producer child: two calls to warm up, then ``jobs`` jobs of
    ``PRODUCER_CASES[case]`` with callgrind's instrumentation on (this process runs under
    valgrind)."""
    _name, side, per_call, options = PRODUCER_CASES[case]
    prefix = f"producer{uuid.uuid4().hex[:6]}"
    calls = max(1, jobs // per_call)

    def instrument(state: str) -> None:
        subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], capture_output=True)

    # The producer's reads made every so often (the quota-demoted tenants every 0.25 s, the
    # plans' version every second, a tenant's entry every PLAN_LOCAL_CACHE_TIMEOUT) are
    # made before the count, not in it: under callgrind a job runs ~50x slower, so they
    # would land in ~50x more jobs than at production speed, as many as the machine's load
    # stretched the run (the same code measured 755k-840k a job).
    with bc.fairqueue_on(url, prefix, PLAN_LOCAL_CACHE_TIMEOUT=3_600):
        if side == "raw":

            async def main() -> None:
                queue = Queue(bc.QUEUE, {"connection": url, "prefix": prefix})
                opts = bc.job_options()

                async def add(c: int) -> None:
                    if per_call == 1:
                        await queue.add(bc.QUEUE, bc.raw_data(c), opts)
                        return
                    first = c * per_call
                    await queue.addBulk(
                        [
                            {"name": bc.QUEUE, "data": bc.raw_data(first + i), "opts": opts}
                            for i in range(per_call)
                        ]
                    )

                for c in range(2):
                    await add(c)
                instrument("on")
                for c in range(calls):
                    await add(c)
                instrument("off")
                await queue.close()

            asyncio.run(main())
        else:
            from fairqueue.enqueue import lookups
            from fairqueue.usage import quotas

            bc.wire(True)
            quotas.DEMOTED_CHECK_S = lookups.VERSION_CHECK_S = 3_600.0  # type: ignore[misc]

            def add(c: int) -> None:
                if per_call == 1:
                    bc.enqueue_job(
                        bc.JOB_TYPE, bc.fair_data(c), **{"tenant_id": bc.TENANT, **options}
                    )
                    return
                payloads = [bc.fair_data(c * per_call + i) for i in range(per_call)]
                bc.enqueue_jobs(bc.JOB_TYPE, payloads, **{"tenant_id": bc.TENANT, **options})

            for c in range(2):
                add(c)
            instrument("on")
            for c in range(calls):
                add(c)
            instrument("off")
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    client.close()


def producer_instructions(jobs: int) -> list[tuple[str, float]]:
    """(case, instructions per job) of each of PRODUCER_CASES, each in a producer process
    of its own under callgrind."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    rows = []
    with private_redis() as url:
        for case, (name, _side, per_call, _options) in enumerate(PRODUCER_CASES):
            out = tempfile.mkdtemp(prefix="fqbench-producer-")
            try:
                subprocess.run(
                    [
                        "valgrind",
                        "--tool=callgrind",
                        "--instr-atstart=no",
                        f"--callgrind-out-file={out}/cg.out",
                        sys.executable,
                        __file__,
                        "--producer-child",
                        str(case),
                        "--jobs",
                        str(jobs),
                        "--url",
                        url,
                    ],
                    check=True,
                    capture_output=True,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
                with open(f"{out}/cg.out") as counted:
                    total = next(
                        int(line.split()[1]) for line in counted if line.startswith("totals:")
                    )
            finally:
                shutil.rmtree(out, ignore_errors=True)
            rows.append((name, total / (max(1, jobs // per_call) * per_call)))
    return rows


def print_producer(jobs: int) -> None:
    print(
        f"\nThe producer's instructions per job (callgrind, the producing process itself, "
        f"{jobs} jobs per case)\n"
    )
    print("| case | k instructions per job | ratio to raw bullmq |")
    print("|---|---|---|")
    rows = producer_instructions(jobs)
    # Each case against the raw case of its own batch size.
    raw = {
        per_call: value
        for (_name, value), (_n, side, per_call, _o) in zip(rows, PRODUCER_CASES, strict=True)
        if side == "raw"
    }
    for (name, value), (_n, _side, per_call, _o) in zip(rows, PRODUCER_CASES, strict=True):
        print(f"| {name} | {value / 1000:.1f} | {value / raw[per_call]:.3f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=250)
    parser.add_argument("--rate", type=int, default=1_000)
    parser.add_argument("--parts", action="store_true", help="the add script, part by part")
    parser.add_argument("--only-parts", action="store_true", help="--parts, without the lives")
    parser.add_argument("--rev", help="--parts: the add script at this git revision too")
    parser.add_argument("--producer", action="store_true", help="the producer's instructions")
    parser.add_argument(
        "--account",
        action="store_true",
        help="a life of a tenant with an account against one without",
    )
    parser.add_argument("--producer-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    bc.call_command("migrate", verbosity=0)
    from fairqueue.models import Account, TenantPlan

    TenantPlan.objects.update_or_create(
        tenant_id=bc.TENANT, defaults={"plan_tier": "pro", "weight": 2}
    )
    account, _ = Account.objects.get_or_create(account_id="acct")
    TenantPlan.objects.update_or_create(
        tenant_id=ACCOUNT_TENANT, defaults={"plan_tier": "pro", "weight": 2, "account": account}
    )
    if args.producer_child is not None:
        produce(args.url, args.producer_child, args.jobs)
        return
    if args.producer:
        print_producer(args.jobs)
        return
    if args.account:
        print_account(args.jobs, args.rate)
        return
    if args.parts or args.only_parts:
        print_parts(args.jobs, args.rev)
    if args.only_parts:
        return
    print(
        f"\nA job's whole life in Redis instructions (callgrind), {args.jobs} jobs one at a "
        f"time; the loop's share as at {args.rate} jobs/s\n"
    )
    print("| worker slots | run | k instructions per job | ratio |")
    print("|---|---|---|---|")
    for concurrency in (1, bc.CONCURRENCY):
        with counted_redis() as (url, dump):
            raw = raw_life(url, args.jobs, concurrency, dump)
            fair = fair_life(url, args.jobs, concurrency, args.rate, dump)
        loop = sum(v for name, v in fair.items() if name != "fairqueue")
        rows = [("raw bullmq", raw), *fair.items(), ("fairqueue + loop", fair["fairqueue"] + loop)]
        for name, value in rows:
            print(f"| {concurrency} | {name} | {value / 1000:.1f} | {value / raw:.3f}x |")
        share = loop / (fair["fairqueue"] + loop)
        print(f"| {concurrency} | the loop's share of the fair life | | {share:.1%} |")
    bc.shutil.rmtree(bc._DB_DIR, ignore_errors=True)


def account_adds(url: str, jobs: int, dump: Callable[[], int]) -> list[tuple[str, float]]:
    """The add script alone, instructions per add and take, for a job of a tenant without
    an account and one of a tenant with one (docs/design.md, "Accounts"): into an empty
    queue, and beside a backlog of 20 other flows (10 of them one account's), where the
    clock reads and writes the flows' and the accounts' state.

    Counted inside EVALSHA only (``counted_redis(only=...)``): counted whole, Redis's own
    timer work (serverCron, about 10 a second) landed in whichever add the machine's load
    stretched, and moved a row by up to 6% between runs. The two adds alternate, each
    counted alone, and each row is the median."""
    from fairqueue.broker import NewJob, get_sync_broker
    from fairqueue.scheduling.levels import PriorityLevel

    client = redis.Redis.from_url(url)
    take = client.register_script(TAKE)
    rows = []
    try:
        for backlog in (False, True):
            runs = []  # (keys of the take, the add commands) for each side
            for account in (None, "acct"):
                prefix = f"acct{uuid.uuid4().hex[:6]}"
                with bc.fairqueue_on(url, prefix):
                    packer = bc.get_broker().adding.packer
                    base = f"{prefix}:{bc.QUEUE}"

                    def job(i: int, tenant: str, of: str | None) -> NewJob:
                        data = {**bc.fair_data(i), "tenantId": tenant, "priorityLevel": "normal"}
                        return NewJob(
                            bc.QUEUE, data, PriorityLevel.NORMAL, tenant=tenant, account=of
                        )

                    if backlog:  # 20 flows, 50 jobs each, the first ten one account's
                        others = [job(-1, f"o{k}", "other" if k < 10 else None) for k in range(20)]
                        for _ in range(50):  # 20 a call: a call of 250 outran the client's
                            # 10 s timeout under callgrind on a loaded machine
                            get_sync_broker().add_jobs(bc.QUEUE, others)
                    commands = [
                        packer.add_commands(bc.QUEUE, [job(i, "measured", account)])[0]
                        for i in range(jobs + 1)
                    ]
                runs.append(([f"{base}:prioritized", f"{base}:"], commands, prefix))
            sha = client.script_load(runs[0][1][0].source)
            counted: list[list[int]] = [[], []]
            for i in range(jobs + 1):
                for side, (keys, commands, _prefix) in enumerate(runs):
                    command = commands[i]
                    dump()
                    client.evalsha(sha, len(command.keys), *command.keys, *command.args)
                    take(keys=keys)
                    if i:  # the first add (a script's first run) not counted
                        counted[side].append(dump())
            where = "beside a backlog" if backlog else "into an empty queue"
            for side, who in enumerate(("without an account", "with an account")):
                rows.append((f"{where}, {who}", statistics.median(counted[side])))
            for _keys, _commands, prefix in runs:
                for key in client.scan_iter(f"{prefix}:*"):
                    client.delete(key)
    finally:
        client.close()
    return rows


def print_account(jobs: int, rate: int) -> None:
    """The add path of a job of a tenant with an account against one of a tenant without
    one (the add script alone), then a job's whole life (one worker slot), in one Redis."""
    print(f"\nThe add script in Redis instructions (callgrind, in EVALSHA), {jobs} adds each\n")
    print("| add | k instructions per add and take | ratio |")
    print("|---|---|---|")
    with counted_redis(only="evalShaCommand") as (url, dump):
        rows = account_adds(url, jobs, dump)
    for i, (name, value) in enumerate(rows):
        plain = rows[i - i % 2][1]
        print(f"| {name} | {value / 1000:.1f} | {value / plain:.3f}x |")
    print(f"\nA job's whole life in Redis instructions (callgrind), {jobs} jobs, one slot\n")
    print("| tenant | k instructions per job | ratio |")
    print("|---|---|---|")
    with counted_redis() as (url, dump):
        plain = fair_life(url, jobs, 1, rate, dump)["fairqueue"]
        with_account = fair_life(url, jobs, 1, rate, dump, tenant=ACCOUNT_TENANT)["fairqueue"]
    print(f"| without an account | {plain / 1000:.1f} | 1.000x |")
    print(f"| with an account | {with_account / 1000:.1f} | {with_account / plain:.3f}x |")
    bc.shutil.rmtree(bc._DB_DIR, ignore_errors=True)


def print_parts(jobs: int, rev: str | None) -> None:
    print(
        f"\nThe add script in Redis instructions (callgrind, in EVALSHA), {jobs} adds to an "
        "empty queue\n"
    )
    print("| script | k instructions per add and take | part (k) |")
    print("|---|---|---|")
    # Inside EVALSHA only (the adds, the takes, and raw bullmq's adds are all EVALSHAs):
    # Redis's timer work, which the machine's load moves, moved a row by up to 20k.
    with counted_redis(only="evalShaCommand") as (url, dump):
        rows = add_parts(url, jobs, dump, rev)
    whole = rows[0][1]
    for name, value in rows:
        part = "" if name.startswith(("whole script", "raw")) else f"{(whole - value) / 1000:.1f}"
        print(f"| {name} | {value / 1000:.1f} | {part} |")


if __name__ == "__main__":
    main()
