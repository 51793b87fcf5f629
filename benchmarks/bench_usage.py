"""What the usage ledger costs Redis per job: the history step with the ledger off and on,
side by side in one run, on the same jobs.

One fresh private ``redis-server`` (no persistence; the shared server is not touched)
holds two queues with the same work: ``email`` recorded with the ledger off
(``USAGE_LEDGER = False``) and ``report`` with it on. Each round adds ``--jobs`` jobs to
each (fairqueue's add script; four levels, ``--tenants`` tenants; every ``--fail-every``-th
job fails its first attempt and succeeds at its second), a stock Node BullMQ worker per
queue (``benchmarks/live_worker.mjs``, bullmq 6.7, 0 ms jobs) drains them and stops, then,
with nothing else talking to Redis, the loop's history step (``run_tick(...,
history_only=True)``, as ``rebalance_fair`` runs it every 250 ms) reads each queue's events
until none is left: off first in odd rounds, on first in even ones. For the ``on`` queue,
the ledger's write (the Redis part of the loop's usage step: ``read_dirty`` and
``mark_written``) is measured apart.

Redis's cost is its own: every top-level command's server time from the slow log (logging
every command, reset before each measured step; a script's inner commands are inside its
time), Redis's CPU time (``INFO cpu``, user and system: its reading of requests and
writing of replies too, at the kernel's accounting resolution) and the commands sent. Per
attempt recorded: server µs, CPU µs and commands. For scale, Redis's CPU while each queue's
jobs were added and drained (an attempt's life, the idle worker's polling included).

    python benchmarks/bench_usage.py [--jobs 1500] [--rounds 4] [--tenants 20]
        [--fail-every 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
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
from fairqueue.broker import NewJob, close_brokers, get_sync_broker  # noqa: E402
from fairqueue.broker.usage_store import UsageStore  # noqa: E402
from fairqueue.rebalance.passes import rebalance_queue, run_tick  # noqa: E402
from fairqueue.scheduling.levels import PAYLOAD_LEVEL_KEY, PAYLOAD_TENANT_KEY, PriorityLevel  # noqa: E402

PREFIX = "fquse"
OFF, ON = "email", "report"
WORKER = Path(__file__).resolve().parent / "live_worker.mjs"
LEVELS = (PriorityLevel.CRITICAL, PriorityLevel.HIGH, PriorityLevel.NORMAL, PriorityLevel.LOW)
BATCH = 500


def _settings(url: str, ledger: bool) -> dict[str, Any]:
    return {
        "PREFIX": PREFIX,
        "QUEUES": {OFF: OFF, ON: ON},
        "REDIS_URL": url,
        "USAGE_LEDGER": ledger,
        # Every finished job's hash kept through the round: the history reads each start's
        # level and tenant from it (the loop reads them within 250 ms in production).
        "KEEP_COMPLETED": {"count": 100_000, "age": 86_400},
    }


def _add(queue: str, count: int, tenants: int, fail_every: int, first: int) -> None:
    broker = get_sync_broker()
    jobs: list[NewJob] = []
    for i in range(first, first + count):
        level, tenant = LEVELS[i % 4], f"t{i % tenants}"
        data: dict[str, Any] = {PAYLOAD_TENANT_KEY: tenant, PAYLOAD_LEVEL_KEY: level.value}
        retried = fail_every and i % fail_every == 0
        if retried:
            data["failTimes"] = 1
        jobs.append(
            NewJob(
                name=queue,
                data=data,
                level=level,
                tenant=tenant,
                attempts=2 if retried else None,
            )
        )
        if len(jobs) == BATCH:
            broker.add_jobs(queue, jobs)
            jobs = []
    if jobs:
        broker.add_jobs(queue, jobs)


def _drain(url: str, queue: str, attempts: int) -> None:
    """A stock Node worker takes ``attempts`` attempts, then stops (SIGTERM: flushes)."""
    worker = subprocess.Popen(  # noqa: S603 - our own script
        ["node", str(WORKER), url, PREFIX, queue, "50", "0"],  # noqa: S607
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if worker.stdout is None or worker.stdout.readline().strip() != "ready":
            raise SystemExit("the Node worker did not start")
        seen = 0
        done = threading.Event()

        def read() -> None:
            nonlocal seen
            assert worker.stdout is not None
            for line in worker.stdout:
                if line.startswith("{"):
                    seen += 1
                    if seen >= attempts:
                        done.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if not done.wait(300):
            raise SystemExit(f"the worker of {queue} took {seen} of {attempts} attempts")
    finally:
        worker.terminate()
        worker.wait(15)


class ServerCost:
    """Redis's own time of every top-level command between :meth:`reset` and :meth:`read`
    (the slow log, logging every command)."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.client.config_set("slowlog-log-slower-than", 0)
        self.client.config_set("slowlog-max-len", 1_000_000)

    def reset(self) -> None:
        self.client.slowlog_reset()
        cpu = self.client.info("cpu")
        self._cpu = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    def read(self) -> tuple[int, int, int]:
        """(server µs of the top-level commands, their number, Redis's CPU µs) since the
        reset; the commands scripts ran inside are in their script's time (the slow log
        lists them apart, from client ``?:0``), the slow log's own commands left out."""
        cpu = self.client.info("cpu")
        cpu_us = round(1e6 * (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]) - self._cpu))
        entries = self.client.slowlog_get(1_000_000)
        mine = [
            e
            for e in entries
            if e.get("client_address") != b"?:0"
            and not e["command"].lower().startswith((b"slowlog", b"config", b"info"))
        ]
        return sum(int(e["duration"]) for e in mine), len(mine), cpu_us


def _history(job_type: str, cost: ServerCost) -> tuple[int, int, int, int, int]:
    """History steps until the queue's events are read: (recorded, unrecorded, µs,
    commands, CPU µs)."""
    recorded = unrecorded = 0
    cost.reset()
    for _ in range(1_000):
        result = run_tick(job_type, rebalancer="bench-usage", interval_ms=1_000, history_only=True)
        recorded += result.recorded
        unrecorded += result.unrecorded
        if result.recorded == 0 and result.unrecorded == 0:
            break
    us, commands, cpu = cost.read()
    return recorded, unrecorded, us, commands, cpu


def _ledger_write(queue: str, cost: ServerCost) -> tuple[int, int, int, int]:
    """The Redis part of the loop's ledger write until nothing is dirty: (rows, µs,
    commands, CPU µs)."""
    sync = get_sync_broker()
    store = UsageStore(sync.broker.conn)
    rows = 0
    cost.reset()
    while True:
        reads = sync.run(store.read_dirty, queue, 500)
        if not reads:
            break
        sync.run(store.mark_written, queue, reads)
        rows += len(reads)
    us, commands, cpu = cost.read()
    return rows, us, commands, cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    totals = {
        OFF: {"recorded": 0, "unrecorded": 0, "us": 0, "commands": 0, "cpu": 0},
        ON: {"recorded": 0, "unrecorded": 0, "us": 0, "commands": 0, "cpu": 0},
    }
    write = {"rows": 0, "us": 0, "commands": 0, "cpu": 0}
    life = {"cpu": 0, "attempts": 0}
    with private_redis() as url:
        os.environ["FAIRQUEUE_REDIS_URL"] = url
        cost = ServerCost(url)
        try:
            for queue, ledger in ((OFF, False), (ON, True)):
                with override_settings(FAIRQUEUE=_settings(url, ledger)):
                    rebalance_queue(queue, rebalancer="bench-usage")  # the history's cursor
            retried = len(range(0, args.jobs, args.fail_every)) if args.fail_every else 0
            for round_no in range(args.rounds):
                first = round_no * args.jobs
                with override_settings(FAIRQUEUE=_settings(url, False)):
                    for queue in (OFF, ON):
                        cost.reset()
                        _add(queue, args.jobs, args.tenants, args.fail_every, first)
                        _drain(url, queue, args.jobs + retried)
                        life["cpu"] += cost.read()[2]
                        life["attempts"] += args.jobs + retried
                order = [(OFF, False), (ON, True)]
                if round_no % 2:
                    order.reverse()
                for queue, ledger in order:
                    with override_settings(FAIRQUEUE=_settings(url, ledger)):
                        recorded, unrecorded, us, commands, cpu = _history(queue, cost)
                        got = totals[queue]
                        got["recorded"] += recorded
                        got["unrecorded"] += unrecorded
                        got["us"] += us
                        got["commands"] += commands
                        got["cpu"] += cpu
                        if ledger:
                            rows, us, commands, cpu = _ledger_write(queue, cost)
                            write["rows"] += rows
                            write["us"] += us
                            write["commands"] += commands
                            write["cpu"] += cpu
        finally:
            close_brokers()
            conf.reload_settings()
    return {"totals": totals, "write": write, "life": life}


def table(result: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    off, on, write = result["totals"][OFF], result["totals"][ON], result["write"]
    rows = []
    for name, got in (("ledger off", off), ("ledger on", on)):
        n = max(1, got["recorded"])
        rows.append(
            {
                "run": name,
                "attempts recorded": got["recorded"],
                "unrecorded": got["unrecorded"],
                "server µs / attempt": round(got["us"] / n, 2),
                "Redis CPU µs / attempt": round(got["cpu"] / n, 2),
                "commands / 1,000 attempts": round(1000 * got["commands"] / n, 1),
            }
        )
    n = max(1, on["recorded"])
    rows.append(
        {
            "run": "ledger write (Redis part)",
            "attempts recorded": on["recorded"],
            "unrecorded": f"{write['rows']} rows",
            "server µs / attempt": round(write["us"] / n, 2),
            "Redis CPU µs / attempt": round(write["cpu"] / n, 2),
            "commands / 1,000 attempts": round(1000 * write["commands"] / n, 1),
        }
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_500, help="jobs per queue and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--fail-every", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not 1 <= args.jobs <= 2_000:
        parser.error(
            f"--jobs={args.jobs} is not allowed: expected 1..2000 (BullMQ keeps about "
            "10,000 events; a round's events must all be in the stream)"
        )
    began = time.monotonic()
    result = run(args)
    rows = table(result, args)
    print(
        f"\nThe history step's Redis cost per attempt, ledger off and on, {args.rounds} "
        f"rounds of {args.jobs} jobs per queue ({args.tenants} tenants, every "
        f"{args.fail_every}th job retried once), {time.monotonic() - began:.0f} s:"
    )
    cols = list(rows[0])
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(str(row[col]) for col in cols))
    off, on = rows[0]["server µs / attempt"], rows[1]["server µs / attempt"]
    both = on + rows[2]["server µs / attempt"]
    if off:
        print(
            f"ledger on / off: history step {on / off:.3f}, with the ledger write {both / off:.3f}"
        )
    life = result["life"]
    life_us = life["cpu"] / max(1, life["attempts"])
    extra = rows[1]["Redis CPU µs / attempt"] - rows[0]["Redis CPU µs / attempt"]
    extra += rows[2]["Redis CPU µs / attempt"]
    whole = life_us + rows[0]["Redis CPU µs / attempt"]
    print(
        f"an attempt's life (added, taken, finished; Redis CPU while the worker drained) "
        f"{life_us:.1f} µs, with the history step {whole:.1f} µs; the ledger adds "
        f"{extra:.2f} µs: {100 * extra / max(whole, 1e-9):.1f}%"
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, **result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
