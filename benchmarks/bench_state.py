"""What fairqueue's per-flow state costs Redis once tenants have drained: many one-job
tenants are added, a stock Node BullMQ worker runs them all while passes record their
run times, and then the bytes of fairqueue's keys are read (``MEMORY USAGE``), as the
drain leaves them, after the next add (which retires the idle flows), and once the
flows' estimates have been idle past ``FLOW_STATE_IDLE_S`` (here made 0 so the passes
forget them at once, a few per call).

    python benchmarks/bench_state.py [--tenants 100000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_fairness import JOB_TYPE, LOG, OUT, QUEUE, NodeWorker, setup_django  # noqa: E402
from benchmarks.common import REDIS_URL, delete_prefix  # noqa: E402


def fair_bytes(client, prefix: str) -> dict[str, int]:
    """Bytes of fairqueue's keys of the queue, by kind (MEMORY USAGE, all samples)."""
    sizes: dict[str, int] = {}
    for key in client.scan_iter(match=f"{prefix}:{QUEUE}:fq:*", count=5000):
        name = key.decode().split(":fq:", 1)[1]
        kind = name.split(":", 1)[0] if not name.startswith("hist") else "hist"
        sizes[kind] = sizes.get(kind, 0) + (client.memory_usage(key, samples=0) or 0)
    return sizes


def report(label: str, sizes: dict[str, int], tenants: int) -> None:
    total = sum(sizes.values())
    parts = ", ".join(f"{k} {v / 1024:.0f} KiB" for k, v in sorted(sizes.items()))
    print(f"{label:<44} {total / 1024:>9.0f} KiB {total / tenants:>7.1f} B/tenant  ({parts})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=50, help="the Node worker's")
    args = parser.parse_args(argv)
    args.run_ms = 0.0
    prefix = f"fqbench-{uuid.uuid4().hex[:12]}"
    os.environ["FAIRQUEUE_PREFIX"] = prefix
    os.environ["FAIRQUEUE_REDIS_URL"] = REDIS_URL
    # Finished jobs' hashes are kept until the passes read who ran (the history step
    # reads a started job's flow from its hash).
    os.environ["FAIRQUEUE_KEEP_COMPLETED_COUNT"] = str(args.tenants + 1000)
    db = setup_django()
    import redis

    from fairqueue.broker import NewJob, close_brokers, get_sync_broker
    from fairqueue.rebalance.passes import rebalance_queue
    from fairqueue.scheduling import attempts
    from fairqueue.scheduling.levels import PriorityLevel

    client = redis.Redis.from_url(REDIS_URL)
    OUT.mkdir(parents=True, exist_ok=True)

    def passes_until(done, limit_s: float = 600.0) -> int:
        count, deadline = 0, time.monotonic() + limit_s
        while time.monotonic() < deadline:
            db.submit(rebalance_queue, JOB_TYPE).result()
            count += 1
            if done():
                break
        return count

    try:
        broker = get_sync_broker()
        db.submit(rebalance_queue, JOB_TYPE).result()  # the history starts now
        with LOG.open("a") as log:
            worker = NodeWorker(prefix, args, log)
            try:
                started = time.monotonic()
                for first in range(0, args.tenants, 250):
                    jobs = [
                        NewJob(
                            JOB_TYPE,
                            {"tenantId": f"t{n}", "priorityLevel": "normal"},
                            PriorityLevel.NORMAL,
                            tenant=f"t{n}",
                        )
                        for n in range(first, min(first + 250, args.tenants))
                    ]
                    db.submit(broker.add_jobs, QUEUE, jobs).result()
                    if first % 10_000 == 0:
                        db.submit(rebalance_queue, JOB_TYPE).result()
                while len(worker.seen) < args.tenants and time.monotonic() - started < 900:
                    db.submit(rebalance_queue, JOB_TYPE).result()
                    time.sleep(0.05)
            finally:
                worker.stop()
        seen_key = f"{prefix}:{QUEUE}:fq:seen"
        passes_until(lambda: False, 3)  # the history step reads the last events
        print(f"{args.tenants} one-job tenants, {len(worker.seen)} run by a stock Node worker")
        print(f"flows with a measured estimate: {client.zcard(seen_key)}")
        report("after the drain", fair_bytes(client, prefix), args.tenants)
        db.submit(
            broker.add_jobs, QUEUE, [NewJob(JOB_TYPE, {}, PriorityLevel.NORMAL, tenant="next")]
        ).result()
        report("after the next add (idle flows retired)", fair_bytes(client, prefix), args.tenants)
        attempts.FLOW_STATE_IDLE_S = 0
        count = passes_until(lambda: not client.exists(seen_key))
        report(
            f"estimates idle past the horizon ({count} passes)",
            fair_bytes(client, prefix),
            args.tenants,
        )
    finally:
        db.submit(close_brokers).result()
        close_brokers()
        delete_prefix(prefix)
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
