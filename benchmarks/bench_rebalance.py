"""Rebalance pass: fairqueue against seed 1's method, side by side in one run.

For 1k, 10k and 100k waiting jobs (mixed levels and tenants, enqueued by fairqueue):

* fairqueue: ``rebalance_queue`` (window of 1,000 + whole-backlog aging inside Redis,
  minimal writes, pipelined ``changePriority``);
* seed 1 (baseline): ``getWaiting`` + ``getPrioritized`` of up to 1,000 jobs, the same
  fair policy, compact priorities 1..n in run order, one awaited ``Job.changePriority``
  per job whose priority differs.

Round trips are counted at the socket: one per packed send of commands (a pipeline is
one). Ratios are baseline / fairqueue (higher = fairqueue faster).

    python benchmarks/bench_rebalance.py [--sizes 1000 10000 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

from benchmarks.common import REDIS_URL, delete_prefix  # noqa: E402

django.setup()

from bullmq import Queue  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from redis.asyncio.connection import AbstractConnection  # noqa: E402

from fairqueue import conf  # noqa: E402
from fairqueue.broker import WaitingJob, close_brokers  # noqa: E402
from fairqueue.priority import wire_tenant_plan_lookup  # noqa: E402
from fairqueue.rebalance import pending_from_job, rebalance_queue  # noqa: E402
from fairqueue.scheduler import order_pending_jobs  # noqa: E402
from fairqueue.services import enqueue_jobs  # noqa: E402

PLANS = ["enterprise", "pro", "free"]

_sends = 0
_original_send = AbstractConnection.send_packed_command


async def _counting_send(self, command, check_health=True):
    global _sends
    _sends += 1
    return await _original_send(self, command, check_health)


AbstractConnection.send_packed_command = _counting_send


def seed(n: int) -> None:
    """Batches of up to 1,000 jobs from 13 tenants on the three plans."""
    wire_tenant_plan_lookup(lambda tenant_id: PLANS[int(tenant_id.rsplit("-", 1)[1]) % 3])
    for start in range(0, n, 1000):
        size = min(1000, n - start)
        enqueue_jobs(
            "email",
            [{"i": start + i} for i in range(size)],
            tenant_id=f"tenant-{(start // 1000) % 13}",
        )


def fairqueue_pass() -> tuple[float, int, int]:
    global _sends
    before = _sends
    start = time.perf_counter()
    result = rebalance_queue("email")
    return time.perf_counter() - start, _sends - before, result.written


async def seed1_pass(prefix: str, max_wait_ms: int) -> tuple[float, int, int]:
    """Seed 1's "How the rebalance pass works", literally (priorities from 1, not 0)."""
    global _sends
    queue = Queue("email", {"connection": REDIS_URL, "prefix": prefix})
    before = _sends
    start = time.perf_counter()
    jobs = await queue.getWaiting(0, 999) + await queue.getPrioritized(0, 999)
    jobs = jobs[:1000]
    waiting = [
        WaitingJob(
            job.id,
            job.name,
            job.data if isinstance(job.data, dict) else None,
            job.timestamp,
            job.priority,
            job.attemptsMade,
        )
        for job in jobs
    ]
    by_id = {job.id: job for job in jobs}
    pending = [p for p in map(pending_from_job, waiting) if p is not None]
    order = order_pending_jobs(pending, now_ms=int(time.time() * 1000), max_wait_ms=max_wait_ms)
    written = 0
    for priority, item in enumerate(order, start=1):
        job = by_id[item.job_id]
        if job.priority != priority:
            try:
                await job.changePriority({"priority": priority})
                written += 1
            except Exception as exc:  # seed 1: races are caught and logged, never fatal
                print(f"changePriority failed: {type(exc).__name__}")
    elapsed = time.perf_counter() - start
    await queue.close()
    return elapsed, _sends - before, written


def run_size(n: int) -> dict[str, tuple[float, int, int]]:
    rows: dict[str, tuple[float, int, int]] = {}
    for variant in ("fairqueue", "seed1"):
        prefix = f"fqbench-{uuid.uuid4().hex[:8]}"
        fq = {"PREFIX": prefix, "QUEUES": {"email": "email"}, "REDIS_URL": REDIS_URL}
        with override_settings(FAIRQUEUE=fq):
            conf.reload_settings()
            try:
                seed(n)
                if variant == "fairqueue":
                    rows["fairqueue first"] = fairqueue_pass()
                    rows["fairqueue repeat"] = fairqueue_pass()
                else:
                    max_wait = conf.get_settings().max_wait_ms
                    rows["seed1 first"] = asyncio.run(seed1_pass(prefix, max_wait))
                    rows["seed1 repeat"] = asyncio.run(seed1_pass(prefix, max_wait))
            finally:
                close_brokers()
                delete_prefix(prefix)
    conf.reload_settings()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    args = parser.parse_args()
    print("Rebalance pass, fairqueue vs seed 1's method (window 1,000; times in ms)")
    header = (
        f"{'waiting':>8} | {'pass':<7} | {'fairqueue ms':>12} {'trips':>6} {'writes':>6} | "
        f"{'seed-1 ms':>10} {'trips':>6} {'writes':>6} | {'time ratio':>10}"
    )
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        rows = run_size(n)
        for which in ("first", "repeat"):
            f_time, f_trips, f_writes = rows[f"fairqueue {which}"]
            s_time, s_trips, s_writes = rows[f"seed1 {which}"]
            print(
                f"{n:>8} | {which:<7} | {f_time * 1000:>12.1f} {f_trips:>6} {f_writes:>6} | "
                f"{s_time * 1000:>10.1f} {s_trips:>6} {s_writes:>6} | {s_time / f_time:>9.1f}x"
            )
    print(
        "\nfairqueue also scans the whole backlog for overdue jobs each pass; seed 1 "
        "looks at the first 1,000 only."
    )


if __name__ == "__main__":
    main()
