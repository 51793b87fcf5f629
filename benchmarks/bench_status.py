"""Status reads at scale: ``job_status``, ``estimate_start`` and the signed-token JSON
endpoint beside ``--waiting`` waiting jobs and one tenant's ``--held`` held jobs, on a
private Redis. Each call's Redis time is read from Redis's slow log (every command
logged), so the figures are the scripts' own work, not the round trip; side by side, a
walk of the held list to the same job (``LPOS``: how ``job_status`` found a held job's
place before the held index) and BullMQ's own ``ZRANK`` of a waiting job.

Setup: ``--waiting`` jobs of 100 unlimited tenants over the four levels, then
``--held`` jobs of one tenant with ``max_active`` 2 (two released, the rest held).
With ``--pending``, one more tenant has that many delayed jobs (due in an hour), the
most an estimate places one by one (``MAX_ESTIMATE_COUNT``): a delayed job due after
them is estimated behind them all, the worst case of ``estimate_start``.
Reads, ``--calls`` of each: the last waiting job's status, the first and last held
job's status, a new job's estimate for a waiting tenant and for the held one (and for
the pending tenant), the JSON endpoint for the last waiting and the last held job.

    python benchmarks/bench_status.py [--waiting 1000000] [--held 1000000] [--calls 200]
        [--pending 10000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: A walk of a list to one member, as job_status.lua did for a held job.
_LPOS = "return redis.call('LPOS', KEYS[1], ARGV[1])"
#: BullMQ's own place of a waiting job: its rank in the prioritized set.
_ZRANK = "return redis.call('ZRANK', KEYS[1], ARGV[1])"


def _add(db: Any, broker: Any, queue: str, jobs: list[Any]) -> list[str]:
    return [job.job_id for job in db.submit(broker.add_jobs, queue, jobs).result()]


def fill(db: Any, queue: str, waiting: int, held: int, pending: int) -> tuple[str, str, str]:
    """Add the jobs; the last waiting job's id and the first and last held job's."""
    from fairqueue.broker import NewJob, get_sync_broker
    from fairqueue.scheduling.levels import PriorityLevel
    from fairqueue.scheduling.limits import TenantLimits
    from fairqueue.scheduling.wire import encoded_limits

    broker = get_sync_broker()
    levels = list(PriorityLevel)
    batch: list[Any] = []
    last_waiting = ""
    for n in range(waiting):
        tenant = f"open-{n % 100}"
        batch.append(
            NewJob(name="bench", data={"tenantId": tenant}, level=levels[n % 4], tenant=tenant)
        )
        if len(batch) == 5_000 or n == waiting - 1:
            last_waiting = _add(db, broker, queue, batch)[-1]
            batch = []
    limits = encoded_limits(TenantLimits(max_active=2))
    for n in range(held):
        batch.append(
            NewJob(
                name="bench",
                data={"tenantId": "held"},
                level=PriorityLevel.NORMAL,
                job_id=f"held-{n}",
                tenant="held",
                limits=limits,
            )
        )
        if len(batch) == 5_000 or n == held - 1:
            _add(db, broker, queue, batch)
            batch = []
    for n in range(pending):
        batch.append(
            NewJob(
                name="bench",
                data={"tenantId": "pending"},
                level=PriorityLevel.NORMAL,
                tenant="pending",
                delay_ms=3_600_000,
            )
        )
        if len(batch) == 5_000 or n == pending - 1:
            _add(db, broker, queue, batch)
            batch = []
    return last_waiting, f"held-{min(2, held - 1)}", f"held-{held - 1}"


def redis_us(client: Any, call: Callable[[], Any], calls: int, command: str) -> list[float]:
    """The Redis time (us) of each of ``calls`` calls, from the slow log's entries whose
    command starts with ``command`` (an EVALSHA of one script's sha, or EVAL)."""
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    for _ in range(calls):
        call()
    entries = client.slowlog_get(1_000_000)
    client.config_set("slowlog-log-slower-than", 10_000)
    client.slowlog_reset()
    found = []
    for entry in entries:
        text = entry["command"]
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        if text.startswith(command):
            found.append(float(entry["duration"]))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--waiting", type=int, default=1_000_000)
    parser.add_argument("--held", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pending", type=int, default=0)
    args = parser.parse_args(argv)
    if not shutil.which("redis-server"):
        print("redis-server not found", file=sys.stderr)
        return 2
    from benchmarks.bench_release_scale import start_redis

    redis_process, url, folder = start_redis()
    os.environ["FAIRQUEUE_REDIS_URL"] = url
    prefix = f"fqbench-{uuid.uuid4().hex[:12]}"
    os.environ["FAIRQUEUE_PREFIX"] = prefix
    import redis

    from benchmarks.bench_fairness import JOB_TYPE, QUEUE, setup_django
    from benchmarks.common import wait_for_redis

    client = redis.Redis.from_url(url)
    wait_for_redis(client)
    db = setup_django()
    rows: list[tuple[str, list[float]]] = []
    try:
        from django.test import RequestFactory

        import fairqueue
        from fairqueue.broker import close_brokers
        from fairqueue.broker.scripts import plain_script
        from fairqueue.enqueue.status_tokens import status_token
        from fairqueue.status.endpoint import job_status_view

        started = time.perf_counter()
        last_waiting, first_held, last_held = fill(db, QUEUE, args.waiting, args.held, args.pending)
        held_key = f"{prefix}:{QUEUE}:fq:lim:held:held"
        print(
            f"setup: {args.waiting:,} waiting, {client.llen(held_key):,} held "
            f"in {time.perf_counter() - started:.0f} s"
        )
        status_sha = plain_script("job_status").sha
        estimate_sha = plain_script("estimate_start").sha
        factory = RequestFactory()

        def on_db(call: Callable[[], Any]) -> Callable[[], Any]:
            return lambda: db.submit(call).result()

        def endpoint(job_id: str) -> Callable[[], Any]:
            token = status_token(JOB_TYPE, job_id)
            return on_db(lambda: job_status_view(factory.get(f"/jobs/{token}/"), token))

        lpos = client.register_script(_LPOS)
        zrank = client.register_script(_ZRANK)
        prioritized = f"{prefix}:{QUEUE}:prioritized"
        plan: list[tuple[str, Callable[[], Any], str]] = [
            (
                "job_status, last waiting job",
                on_db(lambda: fairqueue.job_status(JOB_TYPE, last_waiting)),
                f"EVALSHA {status_sha}",
            ),
            (
                "job_status, first held job",
                on_db(lambda: fairqueue.job_status(JOB_TYPE, first_held)),
                f"EVALSHA {status_sha}",
            ),
            (
                "job_status, last held job",
                on_db(lambda: fairqueue.job_status(JOB_TYPE, last_held)),
                f"EVALSHA {status_sha}",
            ),
            (
                "estimate_start, a waiting tenant",
                on_db(lambda: fairqueue.estimate_start(JOB_TYPE, tenant_id="open-7")),
                f"EVALSHA {estimate_sha}",
            ),
            (
                "estimate_start, the held tenant",
                on_db(lambda: fairqueue.estimate_start(JOB_TYPE, tenant_id="held")),
                f"EVALSHA {estimate_sha}",
            ),
            *(
                [
                    (
                        f"estimate_start behind {args.pending:,} delayed",
                        on_db(
                            lambda: fairqueue.estimate_start(
                                JOB_TYPE, tenant_id="pending", delay_ms=7_200_000
                            )
                        ),
                        f"EVALSHA {estimate_sha}",
                    )
                ]
                if args.pending
                else []
            ),
            ("JSON endpoint, last waiting job", endpoint(last_waiting), f"EVALSHA {status_sha}"),
            ("JSON endpoint, last held job", endpoint(last_held), f"EVALSHA {status_sha}"),
            (
                "BullMQ ZRANK, last waiting job",
                lambda: zrank(keys=[prioritized], args=[last_waiting]),
                "EVALSHA",
            ),
            (
                "held list walk (LPOS), last held job",
                lambda: lpos(keys=[held_key], args=[last_held]),
                "EVALSHA",
            ),
        ]
        for label, call, command in plan:
            call()  # the script loaded, the connection made
            rows.append((label, redis_us(client, call, args.calls, command)))
        close_brokers()
    finally:
        db.shutdown()
        client.close()
        redis_process.terminate()
        redis_process.wait()
        shutil.rmtree(folder, ignore_errors=True)
    print()
    print(f"{args.waiting:,} waiting jobs, {args.held:,} held jobs of one tenant;")
    print(f"Redis time per call from the slow log, {args.calls} calls each (us)")
    print()
    print(f"{'read':<40} {'median':>8} {'p99':>8} {'max':>8}")
    for label, samples in rows:
        if not samples:
            print(f"{label:<40} {'(none logged)':>26}")
            continue
        samples.sort()
        p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
        print(f"{label:<40} {statistics.median(samples):>8.0f} {p99:>8.0f} {samples[-1]:>8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
