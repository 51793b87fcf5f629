"""Scaling out: enqueue + drain throughput on a Redis Cluster of 1, 2 and 3 masters.

Each run starts a private cluster (loopback ports, a directory under /tmp, stopped
afterwards), spreads 6 queues over its masters by their hash tags (``{q..}``, two per
master at 3 masters), then ``--procs`` client processes enqueue ``--jobs`` jobs per queue
and drain them with stock BullMQ workers. Each run does it through fairqueue (the fair
add script, batches of 250, through the cluster client) and through plain BullMQ
(``Queue.addBulk`` of 250 at priority 5, on a client of the queue's master: see
``_enqueue``), side by side; both drain through fairqueue's worker factory.

Reported per run: wall-clock jobs/s (enqueue, drain, both) and the scaling factor
against one master in the same invocation; Redis CPU seconds per master (INFO cpu);
and the Redis-side capacity, jobs / the busiest master's CPU seconds, i.e. the rate at
which the masters would saturate if each had its own core. On a small machine the
clients (Python packing, BullMQ's worker loop) and all the masters share the same cores,
so wall-clock throughput cannot rise with masters there; the capacity column shows what
the cluster buys where the masters get their own cores.

    python benchmarks/bench_cluster.py [--jobs 2000] [--procs 2] [--masters 1 2 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
from bullmq import Queue  # noqa: E402

from fairqueue.broker import Broker, NewJob  # noqa: E402
from fairqueue.scheduling.levels import PriorityLevel  # noqa: E402
from tests.helpers.servers import LocalCluster, start_cluster  # noqa: E402

QUEUES = 6
BATCH = 250
PREFIX = "fqbench"
LEVELS = list(PriorityLevel)


def slot_owners(port: int) -> list[tuple[int, int, int]]:
    """(first slot, last slot, master port) of the cluster a node on ``port`` is in."""
    client = redis.Redis(port=port, decode_responses=True)
    try:
        return [
            (int(start), int(end), int(master[1]))
            for start, end, master, *_ in client.execute_command("CLUSTER SLOTS")
        ]
    finally:
        client.close()


def queue_owners(nodes: list[str], queues: list[str]) -> dict[str, int]:
    """The port of the master that owns each queue's slot."""
    owners = slot_owners(int(nodes[0].split(":")[1]))
    return {
        queue: next(
            p
            for start, end, p in owners
            if start <= redis.crc.key_slot(queue.strip("{}").encode()) <= end
        )
        for queue in queues
    }


def spread_queues(cluster: LocalCluster, count: int = QUEUES) -> list[str]:
    """``count`` queue names whose hash tags land round-robin on the masters."""
    owners = slot_owners(cluster.ports[0])
    by_port: dict[int, list[str]] = {port: [] for port in cluster.ports}
    for i in range(10_000):
        tag = f"q{i}"
        slot = redis.crc.key_slot(tag.encode())
        port = next(p for start, end, p in owners if start <= slot <= end)
        by_port[port].append("{" + tag + "}")
        names = [by_port[p][k] for k in range(count) for p in cluster.ports if len(by_port[p]) > k]
        if len(names) >= count and all(len(v) >= count for v in by_port.values()):
            return names[:count]
    raise RuntimeError("could not spread the queues")


async def _enqueue(mode: str, nodes: list[str], queues: list[str], jobs: int) -> None:
    if mode == "fairqueue":
        broker = Broker("redis+cluster://" + ",".join(nodes), PREFIX)

        async def fill(queue: str) -> None:
            for start in range(0, jobs, BATCH):
                await broker.adding.add_jobs(
                    queue,
                    [
                        NewJob(
                            "bench",
                            {"i": i},
                            LEVELS[i % 4],
                            tenant=f"t{i % 7}",
                        )
                        for i in range(start, min(jobs, start + BATCH))
                    ],
                )

        await asyncio.gather(*(fill(queue) for queue in queues))
        await broker.close()
        return
    # Plain BullMQ's Queue.addBulk pipelines EVALSHA, which redis-py's cluster client
    # refuses (and its concurrent Queue.add calls trip a connection race in redis-py's
    # async cluster client): so each queue gets a plain client on the master that owns
    # its slot, as a producer that knows the slot map would use.
    owner = queue_owners(nodes, queues)

    async def fill_plain(queue_name: str) -> None:
        connection = aioredis.Redis(port=owner[queue_name], decode_responses=True)
        queue = Queue(queue_name, {"connection": connection, "prefix": PREFIX})
        for start in range(0, jobs, BATCH):
            await queue.addBulk(
                [
                    {"name": "bench", "data": {"i": i}, "opts": {"priority": 5}}
                    for i in range(start, min(jobs, start + BATCH))
                ]
            )
        await connection.aclose()

    await asyncio.gather(*(fill_plain(queue) for queue in queues))


async def _drain(nodes: list[str], queues: list[str], jobs: int, concurrency: int) -> float:
    """Drain the queues; the wall-clock time the last job was taken. Closing the workers
    is not timed: Python BullMQ's ``Worker.close()`` can wait out its 5 s ``drainDelay``
    (taskforcesh/bullmq#4597), which made the drain rates bimodal."""
    broker = Broker("redis+cluster://" + ",".join(nodes), PREFIX)
    left = {queue: jobs for queue in queues}
    done = asyncio.Event()

    def processor(queue: str):
        async def process(job) -> None:
            left[queue] -= 1
            if not any(left.values()):
                done.set()

        return process

    workers = [
        broker.workers.make_worker(queue, processor(queue), concurrency=concurrency)
        for queue in queues
    ]
    runs = [asyncio.ensure_future(worker.run()) for worker in workers]
    await asyncio.wait_for(done.wait(), 600)
    drained_at = time.time()
    await asyncio.gather(*(worker.close() for worker in workers))
    for run in runs:
        run.cancel()
    await broker.close()
    return drained_at


def _client(mode, nodes, queues, jobs, concurrency, barrier, cpu) -> None:
    start = time.process_time()
    barrier.wait()  # go
    asyncio.run(_enqueue(mode, nodes, queues, jobs))
    barrier.wait()  # enqueued
    drained_at = asyncio.run(_drain(nodes, queues, jobs, concurrency))
    barrier.wait()  # drained
    cpu.put((time.process_time() - start, drained_at))


def redis_cpu(ports: list[int]) -> list[float]:
    """CPU seconds (user + sys) each server used so far."""
    out = []
    for port in ports:
        client = redis.Redis(port=port)
        try:
            info = client.info("cpu")
        finally:
            client.close()
        out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return out


@dataclass
class Run:
    mode: str
    masters: int
    jobs: int
    enqueue_s: float
    drain_s: float
    redis_cpu_s: list[float]
    client_cpu_s: float

    @property
    def total_s(self) -> float:
        return self.enqueue_s + self.drain_s

    @property
    def capacity(self) -> float:
        """jobs/s at which the busiest master would saturate one core."""
        return self.jobs / max(self.redis_cpu_s)


def run_once(mode: str, masters: int, jobs_per_queue: int, procs: int, concurrency: int) -> Run:
    cluster = start_cluster(masters)
    clients: list = []
    try:
        queues = spread_queues(cluster)
        ctx = mp.get_context("spawn")
        # A client that dies breaks the barrier (timeout) instead of hanging the parent,
        # so the cluster is always stopped below.
        barrier = ctx.Barrier(procs + 1, timeout=900)
        cpu = ctx.Queue()
        clients = [
            ctx.Process(
                target=_client,
                args=(
                    mode,
                    cluster.nodes,
                    queues[i::procs],
                    jobs_per_queue,
                    concurrency,
                    barrier,
                    cpu,
                ),
            )
            for i in range(procs)
        ]
        for process in clients:
            process.start()
        barrier.wait()
        cpu0, t0 = redis_cpu(cluster.ports), time.perf_counter()
        barrier.wait()
        t1 = time.perf_counter()
        enqueued_at = time.time()
        barrier.wait()
        cpu2 = redis_cpu(cluster.ports)
        reports = [cpu.get(timeout=60) for _ in clients]
        client_cpu = sum(used for used, _ in reports)
        drain_s = max(drained_at for _, drained_at in reports) - enqueued_at
        for process in clients:
            process.join(60)
        return Run(
            mode,
            masters,
            jobs_per_queue * QUEUES,
            t1 - t0,
            drain_s,
            [after - before for before, after in zip(cpu0, cpu2, strict=True)],
            client_cpu,
        )
    finally:
        for process in clients:  # a client that died or hung: its barrier broke
            if process.is_alive():
                process.kill()
        cluster.stop()


def table(runs: list[Run]) -> str:
    base = {run.mode: run for run in runs if run.masters == 1}
    lines = [
        "| client | masters | jobs | enqueue jobs/s | drain jobs/s | enqueue + drain jobs/s "
        "| x 1 master | Redis CPU s per master | client CPU s | Redis-side capacity jobs/s "
        "| x 1 master |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        one = base.get(run.mode)
        rate = run.jobs / run.total_s
        lines.append(
            f"| {run.mode} | {run.masters} | {run.jobs:,} | {run.jobs / run.enqueue_s:,.0f} "
            f"| {run.jobs / run.drain_s:,.0f} | {rate:,.0f} "
            f"| {rate / (one.jobs / one.total_s) if one else float('nan'):.2f} "
            f"| {' / '.join(f'{c:.2f}' for c in run.redis_cpu_s)} | {run.client_cpu_s:.1f} "
            f"| {run.capacity:,.0f} | {run.capacity / one.capacity if one else float('nan'):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2_000, help="jobs per queue (6 queues)")
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--concurrency", type=int, default=50, help="per worker")
    parser.add_argument("--masters", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--modes", nargs="+", default=["fairqueue", "bullmq"])
    args = parser.parse_args()
    runs = []
    for masters in args.masters:
        for mode in args.modes:
            run = run_once(mode, masters, args.jobs, args.procs, args.concurrency)
            print(
                f"{mode} on {masters} master(s): {run.jobs / run.total_s:,.0f} jobs/s, "
                f"Redis CPU {[round(c, 2) for c in run.redis_cpu_s]}",
                flush=True,
            )
            runs.append(run)
    print(f"\ncores: {os.cpu_count()}, load average before the last run: {os.getloadavg()}")
    print(table(runs))


if __name__ == "__main__":
    main()
