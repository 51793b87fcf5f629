"""The release step at scale: many limited tenants with backlogs beside a million waiting
jobs, on a private Redis (so its CPU figures are fairqueue's and BullMQ's alone).

Setup: ``--waiting`` jobs of ``--open-tenants`` unlimited tenants, and ``--tenants``
tenants with ``max_active`` 2 and ``--backlog`` jobs each (two released, the rest held).
Four phases, side by side in one run, each ``--phase-s`` long:

* **nothing**: only the ``PING`` below: the Redis CPU they cost, taken off the idle
  loop's figure.
* **plain BullMQ**: a stock Node BullMQ worker (16 slots) drains the queue, no loop: the
  baseline of what other clients wait for a ``PING``.
* **idle loop**: ``manage.py rebalance_fair`` runs, no worker: nothing can move (every
  limited tenant is at its ``max_active``). Redis CPU the loop costs, in % of one core.
* **busy**: the loop and the worker together: the limited tenants' jobs finish and their
  next ones are released as the worker drains the queue.

For each phase: Redis CPU (``INFO cpu``, % of one core), a ``PING`` every 2 ms from
another connection (p50, p99, max), and each script's slowest call (Redis's slow
log, every call over 200 us), with the limited tenants' jobs the worker ran.

    python benchmarks/bench_release_scale.py [--tenants 10000] [--waiting 1000000]
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def start_redis(realtime: bool = False) -> tuple[subprocess.Popen[bytes], str, str]:
    """A private redis-server without persistence on a free port; with realtime, under
    the real-time scheduling class (``chrt``), so the slow log measures the scripts' own
    work and not the time this shared machine's scheduler gave Redis's core to the
    benchmark's workers and producers (a production Redis has a core of its own)."""
    import socket

    # Not benchmarks.common.free_port: benchmarks.common reads FAIRQUEUE_REDIS_URL when
    # first imported, and this runs before main() points it at this server, so the loop
    # (through bench_fairness) would lead on the shared Redis instead, and every phase
    # with the loop would wait for releases that never come.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    folder = tempfile.mkdtemp(prefix="fqbench-redis-")
    command = ["chrt", "--fifo", "10"] if realtime else []
    process = subprocess.Popen(
        [
            *command,
            "redis-server",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            folder,
            "--slowlog-log-slower-than",
            "200",
            "--slowlog-max-len",
            "1000000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, f"redis://127.0.0.1:{port}/0", folder


#: A PING every 2 ms for the given seconds, on a connection of its own; prints the round
#: trips (ms), one a line. A process of its own, so the benchmark's other threads (the
#: worker's reader) cannot hold its interpreter while a reply waits.
_PINGER = """
import sys, time, redis
client = redis.Redis.from_url(sys.argv[1])
end = time.perf_counter() + float(sys.argv[2])
out = []
while time.perf_counter() < end:
    started = time.perf_counter()
    client.ping()
    out.append((time.perf_counter() - started) * 1000)
    time.sleep(0.002)
print("\\n".join(f"{ms:.3f}" for ms in out))
"""


def start_pinger(url: str, seconds: float, realtime: bool) -> subprocess.Popen[str]:
    """The pinger (:data:`_PINGER`); with realtime, under ``chrt`` below Redis's own
    priority, so its figures are Redis's waits and not this machine's scheduling."""
    command = ["chrt", "--fifo", "5"] if realtime else []
    return subprocess.Popen(  # noqa: S603 - our own command
        [*command, sys.executable, "-c", _PINGER, url, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )


def cpu_seconds(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def script_names() -> dict[str, str]:
    from fairqueue.broker import scripts

    names = {}
    for name in dir(scripts):
        maker = getattr(scripts, name)
        if name.endswith("_script") and callable(maker):
            if inspect.signature(maker).parameters:
                continue  # not a script's maker (plain_script, call_script)
            script = maker()
            names[script.sha] = script.name
    for path in (ROOT / "fairqueue" / "broker" / "lua").glob("*.lua"):
        if "." not in path.stem:  # entry scripts (lua/include, lua/wrap: not run alone)
            try:
                script = scripts.plain_script(path.stem)
            except Exception:  # an include, not an entry script
                continue
            names.setdefault(script.sha, script.name)
    return names


def slowest(client: Any, names: dict[str, str]) -> dict[str, tuple[float, int, int]]:
    """Each script's slowest call in the slow log (ms), its calls logged (over 0.2 ms) and
    those over 5 ms; then the log emptied."""
    worst: dict[str, tuple[float, int, int]] = {}
    for entry in client.slowlog_get(1_000_000):
        command = entry["command"]
        if isinstance(command, bytes):
            command = command.decode(errors="replace")
        parts = command.split()
        if len(parts) < 2 or parts[0].upper() != "EVALSHA":
            continue  # a plain command (and this benchmark's own reads)
        name = names.get(parts[1], "bullmq")
        ms = entry["duration"] / 1000
        most, logged, over = worst.get(name, (0.0, 0, 0))
        worst[name] = (max(most, ms), logged + 1, over + (ms > 5))
    client.slowlog_reset()
    return worst


def limited_done(worker: Any) -> int:
    """Jobs of limited tenants the worker ran (their ids start with 'lim-')."""
    if worker is None:
        return 0
    return sum(1 for record in list(worker.records) if str(record["id"]).startswith("lim-"))


def settle(client: Any, base: str, limit_s: float = 120.0) -> None:
    """Until the release step has nothing due (the idle phase measures a loop that has
    caught up, not the releases the previous phase left)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        if not client.exists(f"{base}:sweep") and not client.zcount(f"{base}:due", 0, now_ms):
            return
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--backlog", type=int, default=5)
    parser.add_argument("--waiting", type=int, default=1_000_000)
    parser.add_argument("--open-tenants", type=int, default=100)
    parser.add_argument("--phase-s", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="run redis-server under chrt --fifo (root): script times without preemption",
    )
    args = parser.parse_args(argv)
    if args.realtime and (os.geteuid() != 0 or not shutil.which("chrt")):
        parser.error("--realtime runs redis-server under chrt --fifo: it needs root and chrt")
    args.run_ms = 0
    args.bound_ms = 60_000
    args.interval_ms = 1_000
    if not shutil.which("redis-server"):
        print("redis-server not found", file=sys.stderr)
        return 2
    redis_process, url, folder = start_redis(args.realtime)
    os.environ["FAIRQUEUE_REDIS_URL"] = url
    prefix = f"fqbench-{uuid.uuid4().hex[:12]}"
    os.environ["FAIRQUEUE_PREFIX"] = prefix
    os.environ["FAIRQUEUE_KEEP_COMPLETED_COUNT"] = str(args.tenants * args.backlog + 100_000)
    import redis

    from benchmarks.bench_fairness import (
        LOG,
        QUEUE,
        NodeWorker,
        setup_django,
        start_loop,
        wait_for_loop,
    )
    from benchmarks.common import REDIS_URL, stop_process, wait_for_redis

    if REDIS_URL != url:  # the loop and the worker must use the private server
        raise SystemExit(f"benchmarks.common was imported too early: {REDIS_URL}")

    client = redis.Redis.from_url(url)
    wait_for_redis(client)
    db = setup_django()
    from fairqueue.broker import NewJob, close_brokers, get_sync_broker
    from fairqueue.scheduling.levels import PriorityLevel
    from fairqueue.scheduling.limits import TenantLimits
    from fairqueue.scheduling.wire import encoded_limits

    levels = list(PriorityLevel)
    limits = encoded_limits(TenantLimits(max_active=2))
    rows: list[tuple[str, dict[str, Any]]] = []
    loop = worker = None
    try:
        broker = get_sync_broker()

        def add(jobs: list[Any]) -> None:
            db.submit(broker.add_jobs, QUEUE, jobs).result()

        started = time.perf_counter()
        batch: list[Any] = []
        for n in range(args.waiting):
            tenant = f"open-{n % args.open_tenants}"
            batch.append(
                NewJob(
                    name="bench",
                    data={"tenantId": tenant},
                    level=levels[n % len(levels)],
                    tenant=tenant,
                )
            )
            if len(batch) == 5_000:
                add(batch)
                batch = []
        for t in range(args.tenants):
            tenant = f"t{t}"
            for n in range(args.backlog):
                batch.append(
                    NewJob(
                        name="bench",
                        data={"tenantId": tenant},
                        level=PriorityLevel.NORMAL,
                        job_id=f"lim-{t}-{n}",
                        tenant=tenant,
                        limits=limits,
                    )
                )
            if len(batch) >= 5_000:
                add(batch)
                batch = []
        if batch:
            add(batch)
        held = client.scard(f"{prefix}:{QUEUE}:fq:lim:tenants")
        print(
            f"setup: {args.waiting:,} waiting, {args.tenants:,} limited tenants "
            f"({held:,} holding) in {time.perf_counter() - started:.0f} s"
        )
        names = script_names()

        def phase(label: str, *, with_loop: bool, with_worker: bool) -> None:
            nonlocal loop, worker
            log = LOG.open("a")
            if with_loop and loop is None:
                loop = start_loop(prefix, args, log)
                if not wait_for_loop(prefix, loop):
                    raise RuntimeError(f"the loop did not start; see {LOG}")
            if not with_loop and loop is not None:
                stop_process(loop)
                loop = None
            if with_worker and worker is None:
                worker = NodeWorker(prefix, args, log)
            if not with_worker and worker is not None:
                worker.stop()
                worker = None
            time.sleep(1.0)  # past the start
            if with_loop and not with_worker:
                settle(client, f"{prefix}:{QUEUE}:fq:lim")
            client.slowlog_reset()
            limited_before = limited_done(worker)
            pinger = start_pinger(url, args.phase_s, args.realtime)
            cpu_before, wall_before = cpu_seconds(client), time.perf_counter()
            out, _ = pinger.communicate(timeout=args.phase_s + 60)
            cpu = (cpu_seconds(client) - cpu_before) / (time.perf_counter() - wall_before)
            samples = sorted(float(line) for line in out.split())
            rows.append(
                (
                    label,
                    {
                        "cpu": cpu * 100,
                        "p50": statistics.median(samples),
                        "p99": samples[int(len(samples) * 0.99)],
                        "max": samples[-1],
                        "scripts": slowest(client, names),
                        "limited": limited_done(worker) - limited_before,
                    },
                )
            )

        phase("nothing (the PINGs alone)", with_loop=False, with_worker=False)
        phase("plain BullMQ (worker, no loop)", with_loop=False, with_worker=True)
        phase("idle loop (loop, no worker)", with_loop=True, with_worker=False)
        phase("busy (loop and worker)", with_loop=True, with_worker=True)
    finally:
        if worker is not None:
            worker.stop()
        if loop is not None:
            stop_process(loop)
        close_brokers()
        db.shutdown()
        client.close()
        redis_process.terminate()
        redis_process.wait()
        shutil.rmtree(folder, ignore_errors=True)
    print()
    print(f"{args.tenants:,} limited tenants (max_active 2, {args.backlog} jobs each) beside")
    print(f"{args.waiting:,} waiting jobs; phases of {args.phase_s:.0f} s, PING every 2 ms")
    print()
    print(
        f"{'phase':<34} {'Redis CPU':>9} {'PING p50':>9} {'p99':>7} {'max':>7} "
        f"{'limited done':>12}  slowest script calls in ms (calls over 5 ms / over 0.2 ms)"
    )
    baseline = rows[0][1]["cpu"]
    for label, row in rows:
        scripts = ", ".join(
            f"{name} {ms:.1f} ({over}/{logged} > 5 ms)"
            for name, (ms, logged, over) in sorted(
                row["scripts"].items(), key=lambda item: -item[1][0]
            )[:4]
        )
        print(
            f"{label:<34} {row['cpu']:>8.1f}% {row['p50']:>8.2f}  {row['p99']:>6.2f} "
            f"{row['max']:>6.1f} {row['limited']:>12,}  {scripts or 'none over 0.2 ms'}"
        )
    idle = dict(rows)["idle loop (loop, no worker)"]["cpu"]
    print(
        f"\nthe idle loop's own Redis CPU (idle loop less the PINGs alone): "
        f"{idle - baseline:.1f}% of one core"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
