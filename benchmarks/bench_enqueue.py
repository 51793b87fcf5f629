"""Enqueue throughput: fairqueue against raw bullmq, side by side in one run.

* single: ``enqueue_job`` called from a plain thread (as a sync Django view would)
  against ``await bullmq.Queue.add`` in a loop;
* batch: ``enqueue_jobs`` against ``await bullmq.Queue.addBulk``, 100 jobs per call.

Ratios are time per job, fairqueue / raw (1.00 = same speed; lower is better).

    python benchmarks/bench_enqueue.py [--jobs 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

from benchmarks.common import REDIS_URL, delete_prefix  # noqa: E402

django.setup()

from bullmq import Queue  # noqa: E402
from django.conf import settings  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from fairqueue import conf  # noqa: E402
from fairqueue.broker import close_brokers  # noqa: E402
from fairqueue.enqueue import priority  # noqa: E402
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs  # noqa: E402

BATCH = 100


def raw_single(prefix: str, n: int) -> float:
    async def main():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": prefix})
        await queue.add("email", {"warm": True}, {"priority": 5})
        start = time.perf_counter()
        for i in range(n):
            await queue.add("email", {"i": i, "to": "a@example.com"}, {"priority": 5})
        elapsed = time.perf_counter() - start
        await queue.close()
        return elapsed

    return asyncio.run(main())


def raw_bulk(prefix: str, n: int) -> float:
    async def main():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": prefix})
        await queue.addBulk([{"name": "email", "data": {}, "opts": {"priority": 5}}])
        start = time.perf_counter()
        for b in range(n // BATCH):
            await queue.addBulk(
                [
                    {
                        "name": "email",
                        "data": {"i": b * BATCH + i, "to": "a@example.com"},
                        "opts": {"priority": 5},
                    }
                    for i in range(BATCH)
                ]
            )
        elapsed = time.perf_counter() - start
        await queue.close()
        return elapsed

    return asyncio.run(main())


def in_thread(fn) -> float:
    """Run ``fn`` in a plain thread, the way a sync view runs under a WSGI server."""
    result: list[float] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def fair_single(n: int, **kwargs) -> float:
    enqueue_job("email", {"warm": True}, **kwargs)
    start = time.perf_counter()
    for i in range(n):
        enqueue_job("email", {"i": i, "to": "a@example.com"}, **kwargs)
    return time.perf_counter() - start


def fair_bulk(n: int) -> float:
    enqueue_jobs("email", [{"warm": True}], tenant_id="t-1")
    start = time.perf_counter()
    for b in range(n // BATCH):
        enqueue_jobs(
            "email",
            [{"i": b * BATCH + i, "to": "a@example.com"} for i in range(BATCH)],
            tenant_id="t-1",
        )
    return time.perf_counter() - start


def best(fn, repeat: int = 3) -> float:
    """Best of ``repeat`` runs: the least disturbed by other work on the machine."""
    return min(fn() for _ in range(repeat))


def measure(n: int) -> list[tuple[str, float, float]]:
    rows = []
    prefix = f"fqbench-{uuid.uuid4().hex[:8]}"
    fq = {"PREFIX": prefix, "QUEUES": {"email": "email"}, "REDIS_URL": REDIS_URL}
    with override_settings(FAIRQUEUE=fq):
        conf.reload_settings()
        # The demo project wires its TenantPlan lookups at startup; the benchmark has no
        # database tables, so it measures without them (and with a plan lambda below).
        priority.unwire_tenant_plan_lookup()
        priority.unwire_tenant_weight_lookup()
        try:
            raw = best(lambda: raw_single(prefix + "-raw", n))
            fair = best(lambda: in_thread(lambda: fair_single(n, tenant_id="t-1")))
            rows.append(("single: enqueue_job(tenant, no lookup) vs Queue.add", raw, fair))
            priority.wire_tenant_plan_lookup(lambda tenant_id: "pro")
            fair = best(lambda: in_thread(lambda: fair_single(n, tenant_id="t-1")))
            rows.append(("single: enqueue_job(tenant, plan lookup) vs Queue.add", raw, fair))
            priority.unwire_tenant_plan_lookup()
            raw = best(lambda: raw_bulk(prefix + "-raw", n))
            fair = best(lambda: in_thread(lambda: fair_bulk(n)))
            rows.append((f"batch of {BATCH}: enqueue_jobs vs Queue.addBulk", raw, fair))
        finally:
            close_brokers()
            delete_prefix(prefix)
            delete_prefix(prefix + "-raw")
    conf.reload_settings()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=3000)
    args = parser.parse_args()
    assert settings.configured
    rows = measure(args.jobs)
    print(
        f"Enqueue throughput, {args.jobs} jobs per run, best of 3 (jobs/s; ratio = time "
        "per job, fairqueue / raw bullmq)"
    )
    print(f"{'case':<56} | {'raw jobs/s':>10} | {'fairqueue jobs/s':>16} | {'ratio':>5}")
    print("-" * 98)
    for name, raw, fair in rows:
        print(
            f"{name:<56} | {args.jobs / raw:>10.0f} | {args.jobs / fair:>16.0f} | "
            f"{fair / raw:>5.2f}"
        )


if __name__ == "__main__":
    main()
