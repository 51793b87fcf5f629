"""Enqueue and rebalance at scale: fairqueue against plain BullMQ, side by side in one run.

The goal it checks: no single Redis script runs over 50 ms, whatever the backlog. For
each size N (default 1k, 10k, 100k; ``--scale`` adds 1M) the same N jobs (4 levels, 50
tenants, small payloads) are enqueued twice, on separate prefixes of a private
``redis-server`` this benchmark starts (``--save "" --appendonly no``, free port), so it
can log slow commands in ``SLOWLOG`` (every one over 100 us), reset ``INFO
commandstats`` and read ``INFO memory`` without disturbing anyone:

* **fairqueue**: ``SyncBroker.add_jobs`` in batches of 1,000 (one EVALSHA each); two
  ``rebalance_queue`` passes (first, repeat); a forced paged rebase (the clock's virtual
  time set ``REBASE_THRESHOLD + 1000`` above its base, then ``rebase_page`` until done); a pass
  with every job overdue (the ready-time index shifted 10 minutes back, a second's list
  at a time).
* **plain BullMQ**: ``Queue.addBulk`` in batches of 1,000 (a MULTI of one
  ``addPrioritizedJob`` per job) with numeric priorities (critical=1, high=3,
  normal=5, low=10) and the retention options fairqueue gives every job
  (``removeOnComplete``, ``removeOnFail``), so memory per job compares the same job
  options; the naive method of rebalancing as the baseline for a pass: read
  the first 1,000 waiting jobs, one awaited ``Job.changePriority`` per job.

"worst script" is the longest EVAL/EVALSHA that Redis itself logged during the phase
(SLOWLOG, server time, no network); "worst batch" is the longest 1,000-job call as the
client timed it (a plain BullMQ batch is a MULTI: Redis runs it as one block too).
Ratios are fairqueue / plain BullMQ.

    python benchmarks/bench_rebalance.py [--sizes 1000 10000 100000] [--scale] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from bullmq import Queue  # noqa: E402
from bullmq.redis_connection import SCRIPT_DEFINITIONS, loadScript  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from benchmarks.common import free_port  # noqa: E402
from fairqueue import conf  # noqa: E402
from fairqueue.broker import (  # noqa: E402
    MAX_PRIORITY,
    REBASE_THRESHOLD,
    Fence,
    NewJob,
    add_jobs_script,
    adopt_page_script,
    close_brokers,
    get_sync_broker,
    plain_script,
)
from fairqueue.broker.scripts import add_delayed_script  # noqa: E402
from fairqueue.rebalance.passes import REBASE_PAGE_SIZE, rebalance_queue  # noqa: E402
from fairqueue.scheduling.levels import PAYLOAD_LEVEL_KEY, PAYLOAD_TENANT_KEY, PriorityLevel  # noqa: E402
from tests.helpers.processes import redis_server_args  # noqa: E402

JOB_TYPE = QUEUE = "email"
FAIR_PREFIX = "fqbench"
PLAIN_PREFIX = "plainbench"
BATCH = 1_000
#: Batches between two reads of the slow log (it holds SLOWLOG_LEN entries at most).
DRAIN_EVERY = 10
SLOWLOG_LEN = 50_000
TENANTS = 50
LEVEL_MIX = {
    PriorityLevel.CRITICAL: 10,
    PriorityLevel.HIGH: 20,
    PriorityLevel.NORMAL: 40,
    PriorityLevel.LOW: 30,
}
PLAIN_PRIORITY = {
    PriorityLevel.CRITICAL: 1,
    PriorityLevel.HIGH: 3,
    PriorityLevel.NORMAL: 5,
    PriorityLevel.LOW: 10,
}
#: A job's priority score in BullMQ's prioritized set is priority * 2**32 + counter.
CAP_SCORE = MAX_PRIORITY * 2**32
BUDGET_MS = 50.0
REBASE_TOKEN = "bench-rebase"  # noqa: S105 - a lock token, not a secret
OVERDUE_SHIFT_MS = 600_000


# -- the private Redis ---------------------------------------------------------------------


@contextlib.contextmanager
def private_redis(
    slowlog_us: int = 100, wrapper: Sequence[str] = (), start_timeout_s: float = 5.0
) -> Iterator[str]:
    """A throwaway ``redis-server`` on a free port (no persistence); its URL. ``wrapper``:
    a command that runs the server (``valgrind --tool=callgrind ...``), which may make it
    slow to start."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="fqbench-redis-")
    process = subprocess.Popen(  # noqa: S603 - our own binary and arguments
        [*wrapper, *redis_server_args(binary, port, workdir), "--logfile", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        for _ in range(int(start_timeout_s / 0.05)):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None:
                    raise SystemExit("redis-server exited at start") from None
                time.sleep(0.05)
        else:
            raise SystemExit("redis-server did not answer")
        client.config_set("slowlog-log-slower-than", slowlog_us)
        client.config_set("slowlog-max-len", SLOWLOG_LEN)
        client.close()
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _sha(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()  # noqa: S324


def script_names() -> dict[str, str]:
    """SHA1 -> a readable name, for fairqueue's scripts and BullMQ's."""
    names = {_sha(loadScript(file)): f"bullmq:{name}" for name, file in SCRIPT_DEFINITIONS.items()}
    for script in (add_jobs_script(), add_delayed_script(), adopt_page_script()):
        names[script.sha] = script.name
    for name in ("index_walk", "rebase_page", "lock_acquire", "lock_release"):
        names[plain_script(name).sha] = name
    return names


@dataclass
class Worst:
    ms: float = 0.0
    script: str = ""
    calls: int = 0
    #: All scripts of the phase together, Redis time.
    total_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ms": round(self.ms, 3),
            "script": self.script,
            "calls": self.calls,
            "total_ms": round(self.total_ms, 1),
        }


class SlowLog:
    """Reads the private server's slow log, and its script counters, phase by phase.

    Redis 7 also logs the commands a script runs, one entry each: with
    ``slowlog-log-slower-than 0`` a 1,000-job add script leaves some 20,000 entries,
    which overflow the log (scripts' own entries get dropped) and add to the scripts'
    time. So only commands over ``--slowlog-us`` (100 us) are logged; a phase whose
    scripts all ran faster shows none. Calls and total script time come from ``INFO
    commandstats``.
    """

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.raw = redis.Redis.from_url(url)  # slow-log entries carry binary arguments
        self.names = script_names()
        self.worst = Worst()

    def start(self) -> None:
        self.raw.execute_command("SLOWLOG", "RESET")
        self.raw.config_resetstat()
        self.worst = Worst()

    def drain(self) -> None:
        # Raw entries: [id, start, duration us, [command, arg...], client, name].
        entries = self.raw.execute_command("SLOWLOG", "GET", "-1")
        self.raw.execute_command("SLOWLOG", "RESET")
        for _, _, duration_us, args, *_ in entries:
            if args[0].upper() not in (b"EVAL", b"EVALSHA", b"FCALL"):
                continue
            ms = int(duration_us) / 1000
            if ms > self.worst.ms:
                sha = args[1].decode("ascii", "replace") if len(args) > 1 else ""
                self.worst.ms, self.worst.script = ms, self.names.get(sha, sha[:12])

    def stop(self) -> Worst:
        self.drain()
        stats = self.client.info("commandstats")
        for name in ("eval", "evalsha", "fcall"):
            stat = stats.get(f"cmdstat_{name}")
            if stat:
                self.worst.calls += int(stat["calls"])
                self.worst.total_ms += int(stat["usec"]) / 1000
        return self.worst

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])


# -- the jobs ------------------------------------------------------------------------------


def job_specs(n: int) -> list[tuple[PriorityLevel, str]]:
    rng = random.Random(n)
    levels = rng.choices(list(LEVEL_MIX), weights=list(LEVEL_MIX.values()), k=n)
    return [(level, f"tenant-{rng.randrange(TENANTS)}") for level in levels]


def payload(i: int, level: PriorityLevel, tenant: str) -> dict[str, Any]:
    return {
        PAYLOAD_TENANT_KEY: tenant,
        PAYLOAD_LEVEL_KEY: level.value,
        "to": f"user{i}@example.com",
        "i": i,
    }


@dataclass
class Enqueue:
    seconds: float = 0.0
    worst_batch_ms: float = 0.0
    bytes_per_job: float = 0.0
    worst: Worst = field(default_factory=Worst)

    def as_dict(self, n: int) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "jobs_per_s": round(n / self.seconds),
            "worst_batch_ms": round(self.worst_batch_ms, 3),
            "bytes_per_job": round(self.bytes_per_job, 1),
            "worst_script": self.worst.as_dict(),
        }


def enqueue(slowlog: SlowLog, specs: list[tuple[PriorityLevel, str]], add_batch) -> Enqueue:
    """Time ``add_batch`` over the specs, 1,000 at a time (building the jobs is not timed,
    nor are the slow-log reads between batches); memory is ``used_memory``'s growth."""
    out = Enqueue()
    slowlog.start()
    before = slowlog.used_memory()
    for batch_no, start in enumerate(range(0, len(specs), BATCH)):
        batch = [(start + i, *spec) for i, spec in enumerate(specs[start : start + BATCH])]
        elapsed = add_batch(batch)
        out.seconds += elapsed
        out.worst_batch_ms = max(out.worst_batch_ms, elapsed * 1000)
        if batch_no % DRAIN_EVERY == DRAIN_EVERY - 1:
            slowlog.drain()
    out.worst = slowlog.stop()
    out.bytes_per_job = (slowlog.used_memory() - before) / len(specs)
    return out


def head_mix(client: redis.Redis, prefix: str, *, fair: bool) -> str:
    """Levels of the first 1,000 jobs a stock worker takes (the lowest scores), as
    critical/high/normal/low counts: fairqueue's level is in its score's low bits, plain
    BullMQ's is its priority (1/3/5/10)."""
    rows = client.zrange(f"{prefix}:{QUEUE}:prioritized", 0, 999, withscores=True)
    counts = [0, 0, 0, 0]
    for _, score in rows:
        if fair:
            counts[int(score) % 4] += 1
        else:
            counts[{1: 0, 3: 1, 5: 2, 10: 3}[int(score) >> 32]] += 1
    return "/".join(str(count) for count in counts)


def at_cap(client: redis.Redis, prefix: str) -> int:
    """Jobs at BullMQ's largest priority (parked: no room in the tag band)."""
    return int(client.zcount(f"{prefix}:{QUEUE}:prioritized", CAP_SCORE, "+inf"))


# -- fairqueue -----------------------------------------------------------------------------


def timed_pass(slowlog: SlowLog) -> dict[str, Any]:
    slowlog.start()
    started = time.perf_counter()
    result = rebalance_queue(JOB_TYPE)
    elapsed = time.perf_counter() - started
    assert not result.lock_lost, "another rebalancer holds the benchmark queue's lock"
    return {
        "ms": round(elapsed * 1000, 2),
        "worst_script": slowlog.stop().as_dict(),
        "worst_script_client_ms": round(result.worst_script_ms, 3),
        "script_calls": result.script_calls,
        "adopted": result.adopted,
        "overdue": result.overdue,
        "cleaned": result.cleaned,
        "rebased": result.rebased,
    }


def forced_rebase(slowlog: SlowLog) -> dict[str, Any]:
    """Set the virtual time just past the rebase threshold and rebase the whole band.

    A real queue gets there by running jobs (its waiting jobs then lie above the virtual
    time); here the jobs lie below it, so the rebase moves them all to the floor. The
    work per job is the same: a ZADD and an HSET.
    """
    sync_broker = get_sync_broker()
    state = sync_broker.broker.fair_key(QUEUE, "state")
    base = float(slowlog.client.hget(state, "base") or 0)
    slowlog.client.hset(state, "vt", f"{base + REBASE_THRESHOLD + 1000:.17g}")
    lock_key = sync_broker.broker.fair_key(QUEUE, "leader")
    pages = moved = 0
    worst_page_ms = total = 0.0
    slowlog.start()
    try:
        while True:
            started = time.perf_counter()
            page_moved, done = sync_broker.run(
                sync_broker.broker.passes.rebase_page,
                QUEUE,
                fence=Fence(lock_key, REBASE_TOKEN, 60_000),
                page_size=REBASE_PAGE_SIZE,
            )
            elapsed = time.perf_counter() - started
            total += elapsed
            worst_page_ms = max(worst_page_ms, elapsed * 1000)
            pages += 1
            moved += page_moved
            if pages % 100 == 0:
                slowlog.drain()
            if done:
                break
    finally:
        sync_broker.run(sync_broker.broker.lock.release_lock, lock_key, REBASE_TOKEN)
    worst = slowlog.stop()
    assert moved > 0, "the rebase did not start"
    return {
        "ms": round(total * 1000, 2),
        "pages": pages,
        "moved": moved,
        "worst_page_client_ms": round(worst_page_ms, 3),
        "worst_script": worst.as_dict(),
    }


def make_all_overdue(client: redis.Redis) -> None:
    """Shift every ready time 10 minutes back (order kept), so all jobs are overdue: the
    index lists jobs by the second they became ready, so each second's list moves."""
    key = get_sync_broker().broker.fair_key(QUEUE, "ready")
    shift = OVERDUE_SHIFT_MS // 1000
    for second in client.zrange(key, 0, -1):
        older = int(second) - shift
        client.rename(f"{key}:{second}", f"{key}:{older}")
        client.zrem(key, second)
        client.zadd(key, {str(older): older})


def run_fairqueue(url: str, slowlog: SlowLog, specs) -> dict[str, Any]:
    fq = {"PREFIX": FAIR_PREFIX, "QUEUES": {JOB_TYPE: QUEUE}, "REDIS_URL": url}
    with override_settings(FAIRQUEUE=fq):
        conf.reload_settings()
        try:
            sync_broker = get_sync_broker()

            def add_batch(batch) -> float:
                jobs = [
                    NewJob(
                        name=JOB_TYPE,
                        data=payload(i, level, tenant),
                        level=level,
                        tenant=tenant,
                    )
                    for i, level, tenant in batch
                ]
                started = time.perf_counter()
                sync_broker.add_jobs(QUEUE, jobs)
                return time.perf_counter() - started

            out: dict[str, Any] = {
                "enqueue": enqueue(slowlog, specs, add_batch).as_dict(len(specs))
            }
            out["at_cap"] = at_cap(slowlog.client, FAIR_PREFIX)
            out["head_mix"] = head_mix(slowlog.client, FAIR_PREFIX, fair=True)
            out["pass_first"] = timed_pass(slowlog)
            out["pass_repeat"] = timed_pass(slowlog)
            out["rebase"] = forced_rebase(slowlog)
            make_all_overdue(slowlog.client)
            out["pass_overdue"] = timed_pass(slowlog)
            out["at_cap_after"] = at_cap(slowlog.client, FAIR_PREFIX)
            return out
        finally:
            close_brokers()
            conf.reload_settings()


# -- plain BullMQ --------------------------------------------------------------------------


def run_plain(url: str, slowlog: SlowLog, specs) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    queue = Queue(QUEUE, {"connection": url, "prefix": PLAIN_PREFIX})
    # The job options fairqueue gives every job (its retention), so memory per job
    # compares like with like.
    settings = conf.get_settings()
    retention = {
        "removeOnComplete": settings.keep_completed.bullmq_option(),
        "removeOnFail": settings.keep_failed.bullmq_option(),
    }
    try:

        def add_batch(batch) -> float:
            jobs = [
                {
                    "name": JOB_TYPE,
                    "data": payload(i, level, tenant),
                    "opts": {"priority": PLAIN_PRIORITY[level], **retention},
                }
                for i, level, tenant in batch
            ]
            started = time.perf_counter()
            loop.run_until_complete(queue.addBulk(jobs))
            return time.perf_counter() - started

        out: dict[str, Any] = {"enqueue": enqueue(slowlog, specs, add_batch).as_dict(len(specs))}
        out["at_cap"] = at_cap(slowlog.client, PLAIN_PREFIX)
        out["head_mix"] = head_mix(slowlog.client, PLAIN_PREFIX, fair=False)
        slowlog.start()
        elapsed, changed = loop.run_until_complete(seed1_pass(queue))
        out["seed1_pass"] = {
            "ms": round(elapsed * 1000, 2),
            "changed": changed,
            "worst_script": slowlog.stop().as_dict(),
        }
        return out
    finally:
        loop.run_until_complete(queue.close())
        loop.close()


async def seed1_pass(queue: Queue) -> tuple[float, int]:
    """The naive pass: read up to 1,000 waiting jobs, give them priorities 1..n (here in
    the order read, round-robin over tenants), one awaited ``changePriority`` per job
    whose priority differs."""
    started = time.perf_counter()
    jobs = (await queue.getWaiting(0, BATCH - 1) + await queue.getPrioritized(0, BATCH - 1))[:BATCH]
    by_tenant: dict[str, list] = {}
    for job in jobs:
        by_tenant.setdefault(str((job.data or {}).get(PAYLOAD_TENANT_KEY)), []).append(job)
    order = []
    while any(by_tenant.values()):
        for queued in by_tenant.values():
            if queued:
                order.append(queued.pop(0))
    changed = 0
    for priority, job in enumerate(order, start=1):
        if job.priority != priority:
            await job.changePriority({"priority": priority})
            changed += 1
    return time.perf_counter() - started, changed


# -- the report ----------------------------------------------------------------------------


def run_size(url: str, n: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.flushall()
    client.close()
    slowlog = SlowLog(url)
    specs = job_specs(n)
    try:
        fair = run_fairqueue(url, slowlog, specs)
        plain = run_plain(url, slowlog, specs)
    finally:
        slowlog.client.close()
        slowlog.raw.close()
    phases = ("enqueue", "pass_first", "pass_repeat", "rebase", "pass_overdue")
    worst_phase = max(phases, key=lambda phase: fair[phase]["worst_script"]["ms"])
    worst = fair[worst_phase]["worst_script"]
    return {
        "n": n,
        "fairqueue": fair,
        "plain": plain,
        "worst_fairqueue_script": {"phase": worst_phase, **worst},
        "under_budget": worst["ms"] <= BUDGET_MS,
    }


def _script(worst: dict[str, Any]) -> str:
    return f"{worst['ms']:.2f} {worst['script']}" if worst["script"] else "-"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def report(row: dict[str, Any]) -> list[str]:
    n, fair, plain = row["n"], row["fairqueue"], row["plain"]
    fe, pe = fair["enqueue"], plain["enqueue"]
    seed1 = plain["seed1_pass"]

    def pass_cell(p: dict[str, Any]) -> str:
        return (
            f"{p['ms']:.1f} ms, {p['script_calls']} calls; adopted {p['adopted']}, "
            f"overdue {p['overdue']}, cleaned {p['cleaned']}, rebased {p['rebased']}"
        )

    rb = fair["rebase"]
    lines = [
        (
            "enqueue jobs/s",
            f"{fe['jobs_per_s']:,}",
            f"{pe['jobs_per_s']:,}",
            _ratio(fe["jobs_per_s"], pe["jobs_per_s"]),
        ),
        (
            "memory bytes/job",
            f"{fe['bytes_per_job']:.0f}",
            f"{pe['bytes_per_job']:.0f}",
            _ratio(fe["bytes_per_job"], pe["bytes_per_job"]),
        ),
        (
            "enqueue: Redis us/job",
            f"{fe['worst_script']['total_ms'] * 1000 / n:.1f}",
            f"{pe['worst_script']['total_ms'] * 1000 / n:.1f}",
            _ratio(fe["worst_script"]["total_ms"], pe["worst_script"]["total_ms"]),
        ),
        ("worst script: enqueue", _script(fe["worst_script"]), _script(pe["worst_script"]), ""),
        (
            "worst 1k batch (client ms)",
            f"{fe['worst_batch_ms']:.1f}",
            f"{pe['worst_batch_ms']:.1f}",
            _ratio(fe["worst_batch_ms"], pe["worst_batch_ms"]),
        ),
        ("jobs at the cap", f"{fair['at_cap']:,}", f"{plain['at_cap']:,}", ""),
        ("first 1,000 taken, c/h/n/l", fair["head_mix"], plain["head_mix"], ""),
        (
            "pass first",
            pass_cell(fair["pass_first"]),
            f"naive: {seed1['ms']:.1f} ms, {seed1['changed']} changePriority",
            _ratio(fair["pass_first"]["ms"], seed1["ms"]),
        ),
        ("pass repeat", pass_cell(fair["pass_repeat"]), "", ""),
        (
            "worst script: pass first",
            f"{_script(fair['pass_first']['worst_script'])} "
            f"(client {fair['pass_first']['worst_script_client_ms']:.1f})",
            _script(seed1["worst_script"]),
            "",
        ),
        (
            "worst script: pass repeat",
            f"{_script(fair['pass_repeat']['worst_script'])} "
            f"(client {fair['pass_repeat']['worst_script_client_ms']:.1f})",
            "",
            "",
        ),
        (
            "rebase (forced, full)",
            f"{rb['ms']:.1f} ms, {rb['pages']} pages, {rb['moved']:,} jobs",
            "",
            "",
        ),
        (
            "worst script: rebase",
            f"{_script(rb['worst_script'])} (client {rb['worst_page_client_ms']:.1f})",
            "",
            "",
        ),
        ("pass, all overdue", pass_cell(fair["pass_overdue"]), "", ""),
        (
            "worst script: overdue pass",
            f"{_script(fair['pass_overdue']['worst_script'])} "
            f"(client {fair['pass_overdue']['worst_script_client_ms']:.1f})",
            "",
            "",
        ),
        ("jobs at the cap, at the end", f"{fair['at_cap_after']:,}", "", ""),
    ]
    out = []
    for i, (metric, f_cell, p_cell, ratio) in enumerate(lines):
        size = f"{n:,}" if i == 0 else ""
        out.append(f"{size:>9} | {metric:<28} | {f_cell:<74} | {p_cell:<36} | {ratio:>6}")
    worst = row["worst_fairqueue_script"]
    verdict = "OK" if row["under_budget"] else "OVER"
    upkeep = max(
        (
            fair[phase]["worst_script"]
            for phase in ("pass_first", "pass_repeat", "rebase", "pass_overdue")
        ),
        key=lambda script: script["ms"],
    )
    batch_ms = pe["worst_script"]["total_ms"] / max(1, n // BATCH)
    out.append(
        f"{'':>9} | verdict, no fairqueue script over {BUDGET_MS:.0f} ms: {verdict} (worst "
        f"{worst['ms']:.2f} ms, {worst['script']}, {worst['phase']}; passes and rebase: "
        f"{upkeep['ms']:.2f} ms, {upkeep['script']}); plain BullMQ's worst "
        f"script {pe['worst_script']['ms']:.2f} ms, but each 1k addBulk is one MULTI "
        f"({batch_ms:.1f} ms of scripts per batch on average)"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--scale", action="store_true", help="add 1,000,000 waiting jobs")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    parser.add_argument(
        "--slowlog-us",
        type=int,
        default=100,
        help="slowlog-log-slower-than (0 logs every command, scripts' own too: slower)",
    )
    args = parser.parse_args()
    sizes = [*args.sizes, *([1_000_000] if args.scale else [])]
    rows = []
    with private_redis(args.slowlog_us) as url:
        os.environ["FAIRQUEUE_REDIS_URL"] = url  # the environment wins over FAIRQUEUE
        for n in sizes:
            started = time.perf_counter()
            rows.append(run_size(url, n))
            print(f"[{n:,} jobs measured in {time.perf_counter() - started:.0f} s]", flush=True)
    header = (
        f"{'waiting':>9} | {'metric':<28} | {'fairqueue':<74} | {'plain BullMQ':<36} | {'ratio':>6}"
    )
    print(
        "\nEnqueue and rebalance, fairqueue vs plain BullMQ (private redis-server; worst "
        "script = SLOWLOG server ms; ratio = fairqueue / plain)"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        for line in report(row):
            print(line)
        print("-" * len(header))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
        print(f"raw numbers: {args.json}")


if __name__ == "__main__":
    main()
