"""What recording the dashboard's history costs the rebalance pass, at 1,000 jobs/s.

A producer adds jobs at ``--rate`` jobs/s (batches every 100 ms through fairqueue's add
script; four levels, 20 tenants) for ``--seconds``, while a stock Node BullMQ worker
(``benchmarks/live_worker.mjs``, bullmq 6.7, ``--concurrency`` jobs at a time, 0 ms
jobs) drains them and the rebalance pass runs every ``--interval-ms``. Three runs under
the same load, each on a fresh private ``redis-server`` (no persistence; the shared
server is not touched):

* ``off``: passes with ``record_history=False`` (the pass as it was);
* ``on``: passes as shipped, recording the history from BullMQ's events stream;
* ``on, 5 s``: the same at the default 5 s interval.

Both ``on`` runs do what ``rebalance_fair`` does: besides each pass, the history step
alone every ``HISTORY_EVERY_MS`` between passes. BullMQ keeps about 10,000 events (about
3 per job), 3 s of them at 1,000 jobs/s, so 5 s passes alone would see about half (the
history records such a gap rather than guessing), and the default ``KEEP_COMPLETED``
(1,000 jobs) removes a finished job's hash about a second after it finished.

Per run: jobs added and taken, pass duration (client-timed, median / p95 / max), the
slowest script call of any pass or step (client-timed), the history steps between passes
and their duration, the server time of the history script's calls (Redis's slow log,
calls over 100 µs: median / max), jobs recorded, jobs the worker took that the history
counts (recorded / taken), and the share of the run's time the history observed.

    python benchmarks/bench_history.py [--rate 1000] [--seconds 20] [--interval-ms 1000]
        [--concurrency 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from bench_rebalance import private_redis  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from fairqueue import conf  # noqa: E402
from fairqueue.broker import NewJob, close_brokers, get_sync_broker, plain_script  # noqa: E402
from fairqueue.rebalance.passes import rebalance_queue, run_tick  # noqa: E402
from fairqueue.rebalance.rebalancer import HISTORY_EVERY_MS  # noqa: E402
from fairqueue.scheduling import shares  # noqa: E402
from fairqueue.scheduling.levels import PAYLOAD_LEVEL_KEY, PAYLOAD_TENANT_KEY, PriorityLevel  # noqa: E402

JOB_TYPE = QUEUE = "email"
PREFIX = "fqhist"
WORKER = Path(__file__).resolve().parent / "live_worker.mjs"
LEVELS = (PriorityLevel.CRITICAL, PriorityLevel.HIGH, PriorityLevel.NORMAL, PriorityLevel.LOW)
TICK_S = 0.1


def _produce(rate: int, seconds: float, stop: threading.Event, added: list[int]) -> None:
    broker = get_sync_broker()
    per_tick = max(1, round(rate * TICK_S))
    started = time.monotonic()
    i = 0
    while not stop.is_set() and time.monotonic() - started < seconds:
        jobs = []
        for _ in range(per_tick):
            level, tenant = LEVELS[i % 4], f"t{i % 20}"
            data = {PAYLOAD_TENANT_KEY: tenant, PAYLOAD_LEVEL_KEY: level.value, "i": i}
            jobs.append(NewJob(name=JOB_TYPE, data=data, level=level, tenant=tenant))
            i += 1
        broker.add_jobs(QUEUE, jobs)
        added[0] += len(jobs)
        next_tick = started + (added[0] / per_tick) * TICK_S
        time.sleep(max(0.0, next_tick - time.monotonic()))


def _passes(
    interval_s: float, record: bool, stop: threading.Event, out: list[Any], steps: list[Any]
) -> None:
    """What ``rebalance_fair`` does: a pass every interval and, between passes, the
    history step every ``HISTORY_EVERY_MS`` (not in the ``off`` run)."""
    every_s = HISTORY_EVERY_MS / 1000
    while not stop.is_set():
        began = time.monotonic()
        out.append(
            rebalance_queue(
                JOB_TYPE,
                rebalancer="bench-history",
                interval_ms=int(interval_s * 1000),
                record_history=record,
            )
        )
        deadline = began + interval_s
        while not stop.wait(max(0.0, min(deadline - time.monotonic(), every_s))):
            if deadline - time.monotonic() <= 0:
                break
            if record:
                steps.append(
                    run_tick(
                        JOB_TYPE,
                        rebalancer="bench-history",
                        interval_ms=int(interval_s * 1000),
                        history_only=True,
                    )
                )


def run(name: str, args: argparse.Namespace, *, record: bool, interval_ms: int) -> dict[str, Any]:
    with private_redis() as url:
        fq = {"PREFIX": PREFIX, "QUEUES": {JOB_TYPE: QUEUE}, "REDIS_URL": url}
        with override_settings(FAIRQUEUE=fq):
            os.environ["FAIRQUEUE_REDIS_URL"] = url
            conf.reload_settings()
            try:
                return _run(name, args, url, record=record, interval_ms=interval_ms)
            finally:
                close_brokers()
                conf.reload_settings()


def _run(
    name: str, args: argparse.Namespace, url: str, *, record: bool, interval_ms: int
) -> dict[str, Any]:
    worker = subprocess.Popen(  # noqa: S603 - our own script
        ["node", str(WORKER), url, PREFIX, QUEUE, str(args.concurrency), "0"],  # noqa: S607
        stdout=subprocess.PIPE,
        text=True,
    )
    taken = [0]

    def read() -> None:
        for line in worker.stdout:
            if line.startswith("{"):
                taken[0] += 1

    try:
        return _measure(
            name, url, args, worker, taken, read, record=record, interval_ms=interval_ms
        )
    finally:
        worker.terminate()
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def _script_ms(url: str, sha: str) -> list[float]:
    """Server-side durations (ms) of one script's calls over 100 µs (the slow log)."""
    client = redis.Redis.from_url(url)
    try:
        entries = client.slowlog_get(100_000)
    finally:
        client.close()
    return sorted(
        entry["duration"] / 1000
        for entry in entries
        if len(entry["command"].split()) > 1 and entry["command"].split()[1] == sha.encode()
    )


def _measure(
    name: str,
    url: str,
    args: argparse.Namespace,
    worker: subprocess.Popen[str],
    taken: list[int],
    read: Any,
    *,
    record: bool,
    interval_ms: int,
) -> dict[str, Any]:
    if worker.stdout.readline().strip() != "ready":
        raise SystemExit("the Node worker did not start")
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stop = threading.Event()
    passes: list[Any] = []
    steps: list[Any] = []
    added = [0]
    rebalance_queue(JOB_TYPE, rebalancer="bench-history", record_history=record)  # cursor
    began = time.time()
    loop = threading.Thread(target=_passes, args=(interval_ms / 1000, record, stop, passes, steps))
    loop.start()
    _produce(args.rate, args.seconds, stop, added)
    time.sleep(1.0)  # let the worker catch up
    stop.set()
    loop.join()
    worker.terminate()
    worker.wait(15)
    reader.join(5)
    final = rebalance_queue(JOB_TYPE, rebalancer="bench-history", record_history=record)
    server_ms = _script_ms(url, plain_script("history_commit").sha)
    elapsed_ms = (time.time() - began) * 1000
    durations = sorted(result.duration_ms for result in passes)
    everything = [*passes, *steps, final]
    recorded = sum(result.recorded for result in everything)
    gap_ms = sum(result.history_gap_ms for result in everything)
    step_ms = sorted(step.duration_ms for step in steps) or [0.0]
    p95 = durations[min(len(durations) - 1, int(0.95 * len(durations)))]
    return {
        "run": name,
        "interval_ms": interval_ms,
        "added": added[0],
        "taken": taken[0],
        "rate": round(taken[0] / args.seconds),
        "passes": len(passes),
        "pass_ms_median": round(statistics.median(durations), 1),
        "pass_ms_p95": round(p95, 1),
        "pass_ms_max": round(durations[-1], 1),
        "worst_script_ms": round(max(r.worst_script_ms for r in [*passes, *steps]), 1),
        "script_calls_per_pass": round(statistics.mean(r.script_calls for r in passes), 1),
        "history_script_ms_median": round(statistics.median(server_ms), 2) if server_ms else None,
        "history_script_ms_max": round(server_ms[-1], 2) if server_ms else None,
        "recorded": recorded,
        "unrecorded": sum(result.unrecorded for result in everything),
        "steps": len(steps),
        "step_ms_median": round(statistics.median(step_ms), 1),
        "step_ms_max": round(step_ms[-1], 1),
        "recorded_of_taken": round(recorded / taken[0], 3) if record and taken[0] else None,
        "observed": round(1 - gap_ms / elapsed_ms, 3) if record else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval-ms", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = [
        run("off", args, record=False, interval_ms=args.interval_ms),
        run("on", args, record=True, interval_ms=args.interval_ms),
        run("on, 5 s", args, record=True, interval_ms=5_000),
    ]
    print(
        f"\nHistory recording at {args.rate} jobs/s for {args.seconds:.0f} s, Node worker "
        f"concurrency {args.concurrency} (buckets {shares.BUCKET_S} s):"
    )
    cols = (
        "run", "interval_ms", "added", "taken", "passes", "pass_ms_median", "pass_ms_p95",
        "pass_ms_max", "worst_script_ms", "script_calls_per_pass", "steps", "step_ms_median",
        "step_ms_max", "history_script_ms_median", "history_script_ms_max", "recorded",
        "unrecorded", "recorded_of_taken", "observed",
    )  # fmt: skip
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(str(row[col]) for col in cols))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
