"""Status reads at scale: ``job_status``, ``estimate_start`` and the signed-token JSON
endpoint beside ``--waiting`` waiting jobs and one tenant's ``--held`` held jobs, on a
private Redis (under the real-time scheduling class where ``chrt`` may set it, so the
slow log measures the reads' own work, not the time this shared machine's scheduler gave
Redis's core to others). Each call's Redis time is the sum of every command it sent, read
from Redis's slow log (every command logged, the meter's own left out), with how many
commands that was; side by side, BullMQ's own ``ZRANK`` of a waiting job (the ratios are
what compares across runs on a shared machine) and a walk of the held list to the last
job (``LPOS``: how a held job's place was found before the held index).

Setup: ``--waiting`` jobs of 100 unlimited tenants over the four levels, then
``--held`` jobs of one tenant with ``max_active`` 2 (two released, the rest held), and a
full history over the rate's window (every field of every bucket written, each bucket's
most served tenants as many as one keeps): the most the history reads can cost. The first
``HELD_UNINDEXED`` held jobs are then taken out of the held index (as jobs held before it
existed), so the status of the last of them is the held read's worst case: its place
looked for among those. With ``--pending``, one more tenant has that many delayed jobs
(due in an hour), the most an estimate places one by one (``MAX_ESTIMATE_COUNT``): a
delayed job due after them is estimated behind them all, the worst case of
``estimate_start``.
Reads, ``--calls`` of each: the last waiting job's status, the first and last held
job's status, the held job the index lacks, a new job's estimate for a waiting tenant
and for the held one (and for the pending tenant), the JSON endpoint for the last waiting
and the last held job.

``--compare OTHER_CHECKOUT``: then the reads again by that checkout's code and this one's,
alternating (``--rounds`` each), on the same Redis: before and after a change, side by
side.

    python benchmarks/bench_status.py [--waiting 1000000] [--held 1000000] [--calls 200]
        [--pending 10000] [--compare OTHER_CHECKOUT [--rounds 2]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The checkout whose code runs the reads (``--compare`` runs another's): its fairqueue
#: and benchmarks come first on the path.
sys.path.insert(0, os.environ.get("FQBENCH_CODE", str(ROOT)))

#: A walk of a list to one member, as job_status.lua did for a held job.
_LPOS = "return redis.call('LPOS', KEYS[1], ARGV[1])"
#: BullMQ's own place of a waiting job: its rank in the prioritized set.
_ZRANK = "return redis.call('ZRANK', KEYS[1], ARGV[1])"
#: The meter's connection name: its own commands (the slow log's resets and reads) are
#: left out of what a call cost.
METER = "fqbench-meter"
#: Held jobs taken out of the held index, as if held before it existed (at most
#: HELD_PLACE_SCAN are looked through for one of them).
HELD_UNINDEXED = 1_000


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


def write_history(client: Any, prefix: str, queue: str, seconds: int) -> None:
    """A history as full as the loop writes it, from the rate's window before now to
    ``seconds`` after: every field the estimate reads set in every bucket, and each
    bucket's most served flows as many as a bucket keeps (``TENANTS_PER_BUCKET``)."""
    from fairqueue.broker.status_reads import HISTORY_FIELDS
    from fairqueue.scheduling.estimate import RATE_WINDOW_S
    from fairqueue.scheduling.shares import BUCKET_S, LEVEL_NAMES, TENANTS_PER_BUCKET

    base = f"{prefix}:{queue}:fq:hist"
    now = int(time.time())
    first = (now - RATE_WINDOW_S) // BUCKET_S * BUCKET_S
    client.hset(base, "since", (first - 60) * 1000)
    pipe = client.pipeline(transaction=False)
    for start in range(first, now + seconds + BUCKET_S, BUCKET_S):
        fields: dict[str, int] = dict.fromkeys(HISTORY_FIELDS, 7)
        fields.update(vt0ms=start * 1000, vt1ms=start * 1000 + 9_000, vt0=1_000, vt1=2_000)
        pipe.hset(f"{base}:{start}", mapping=fields)
        pipe.zadd(
            f"{base}:t:{start}",
            {f"{LEVEL_NAMES[n % 4]}\nopen-{n}": 100 - n for n in range(TENANTS_PER_BUCKET)},
        )
        pipe.expire(f"{base}:{start}", seconds + 120)
        pipe.expire(f"{base}:t:{start}", seconds + 120)
    pipe.execute()


def unindex(client: Any, prefix: str, queue: str, held: int) -> str:
    """Take the first ``HELD_UNINDEXED`` held jobs out of the held index; the last of
    them (its place looked for among those)."""
    rank_key = f"{prefix}:{queue}:fq:lim:hrank:held"
    count = min(HELD_UNINDEXED, max(0, held - 2))
    ids = client.lrange(f"{prefix}:{queue}:fq:lim:held:held", 0, count - 1)
    if ids:
        client.zrem(rank_key, *ids)
    return ids[-1].decode() if ids else ""


def redis_us(client: Any, call: Callable[[], Any], calls: int) -> list[tuple[float, int]]:
    """The Redis time (us) of each of ``calls`` calls and the commands it sent: the slow
    log's entries of every client but the meter, summed per call (Redis 7 logs the
    commands a script runs too, from no address, '?:0': its own entry holds their time)."""
    client.config_set("slowlog-log-slower-than", 0)
    found = []
    for _ in range(calls):
        client.slowlog_reset()
        call()
        entries = [
            entry
            for entry in client.slowlog_get(10_000)
            if _text(entry.get("client_name")) != METER
            and _text(entry.get("client_address")) != "?:0"
        ]
        found.append((float(sum(entry["duration"] for entry in entries)), len(entries)))
    client.config_set("slowlog-log-slower-than", 10_000)
    client.slowlog_reset()
    return found


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``ordered`` (sorted), the nearest rank below."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def can_realtime() -> bool:
    """Whether ``chrt`` may put a process in the real-time class here."""
    if not shutil.which("chrt"):
        return False
    return subprocess.run(["chrt", "--fifo", "10", "true"], capture_output=True).returncode == 0


def plan_of(
    db: Any, url: str, prefix: str, ids: Sequence[str], pending: int, walk: bool
) -> list[tuple[str, Callable[[], Any]]]:
    """The reads, each a callable of one call: ``ids`` the last waiting job's, the first
    and last held job's and the unindexed one's; ``walk``: with the held list's walk."""
    import redis
    from django.test import RequestFactory

    import fairqueue
    from benchmarks.bench_fairness import JOB_TYPE, QUEUE
    from fairqueue.enqueue.status_tokens import status_token
    from fairqueue.status.endpoint import job_status_view

    last_waiting, first_held, last_held, unindexed = ids
    factory = RequestFactory()

    def on_db(call: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: db.submit(call).result()

    def endpoint(job_id: str) -> Callable[[], Any]:
        token = status_token(JOB_TYPE, job_id)
        return on_db(lambda: job_status_view(factory.get(f"/jobs/{token}/"), token))

    def status(job_id: str) -> Callable[[], Any]:
        return on_db(lambda: fairqueue.job_status(JOB_TYPE, job_id))

    def estimate(tenant: str, delay_ms: int | None = None) -> Callable[[], Any]:
        return on_db(
            lambda: fairqueue.estimate_start(JOB_TYPE, tenant_id=tenant, delay_ms=delay_ms)
        )

    # another client than the meter's: its commands count
    other = redis.Redis.from_url(url, client_name="fqbench-baseline")
    zrank = other.register_script(_ZRANK)
    lpos = other.register_script(_LPOS)
    prioritized = f"{prefix}:{QUEUE}:prioritized"
    held_key = f"{prefix}:{QUEUE}:fq:lim:held:held"
    plan = [
        ("job_status, last waiting job", status(last_waiting)),
        ("job_status, first held job", status(first_held)),
        ("job_status, last held job", status(last_held)),
        (f"job_status, held, {HELD_UNINDEXED:,} unindexed", status(unindexed)),
        ("estimate_start, a waiting tenant", estimate("open-7")),
        ("estimate_start, the held tenant", estimate("held")),
        *(
            [(f"estimate_start behind {pending:,} delayed", estimate("pending", 7_200_000))]
            if pending
            else []
        ),
        ("JSON endpoint, last waiting job", endpoint(last_waiting)),
        ("JSON endpoint, last held job", endpoint(last_held)),
        (
            "BullMQ ZRANK, last waiting job",
            lambda: zrank(keys=[prioritized], args=[last_waiting]),
        ),
    ]
    if walk:
        plan.append(
            (
                "held list walk (LPOS), last held job",
                lambda: lpos(keys=[held_key], args=[last_held]),
            )
        )
    return plan


def measure(
    db: Any, url: str, prefix: str, ids: Sequence[str], args: argparse.Namespace, walk: bool
) -> list[tuple[str, list[tuple[float, int]]]]:
    """Each read of :func:`plan_of`, ``args.calls`` times, as :func:`redis_us` finds it."""
    import redis

    from fairqueue.broker import close_brokers

    client = redis.Redis.from_url(url, client_name=METER)
    rows = []
    for label, call in plan_of(db, url, prefix, ids, args.pending, walk):
        call()  # the script loaded, the connection made
        rows.append((label, redis_us(client, call, args.calls)))
    close_brokers()
    client.close()
    return rows


def attach(args: argparse.Namespace) -> int:
    """``--attach``: the reads on a Redis another run filled (this checkout's code, or
    ``FQBENCH_CODE``'s), printed as JSON: what ``--compare`` runs."""
    url, prefix, *ids = args.attach
    os.environ["FAIRQUEUE_REDIS_URL"] = url
    os.environ["FAIRQUEUE_PREFIX"] = prefix
    from benchmarks.bench_fairness import setup_django

    db = setup_django()
    try:
        rows = measure(db, url, prefix, ids, args, walk=False)
    finally:
        db.shutdown()
    print(json.dumps(rows))
    return 0


def side_by_side(
    args: argparse.Namespace, url: str, prefix: str, ids: Sequence[str]
) -> dict[str, list[list[tuple[float, int]]]]:
    """``--compare``: the reads by the other checkout's code and this one's, alternating
    (``args.rounds`` each), on the same Redis; label -> [other's, this one's] samples."""
    runs: dict[str, list[list[tuple[float, int]]]] = {}
    for _ in range(args.rounds):
        for side, code in enumerate((args.compare, str(ROOT))):
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--calls",
                str(args.calls),
                "--pending",
                str(args.pending),
                "--attach",
                url,
                prefix,
                *ids,
            ]
            env = {**os.environ, "FQBENCH_CODE": str(code)}
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            for label, samples in json.loads(out.stdout.strip().splitlines()[-1]):
                runs.setdefault(label, [[], []])[side].extend(tuple(x) for x in samples)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--waiting", type=int, default=1_000_000)
    parser.add_argument("--held", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pending", type=int, default=0)
    parser.add_argument(
        "--compare",
        metavar="OTHER_CHECKOUT",
        help="another checkout (the code before a change): the reads by its code and this "
        "one's, alternating, on the same Redis",
    )
    parser.add_argument("--rounds", type=int, default=2, help="--compare's rounds")
    parser.add_argument("--attach", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attach:
        return attach(args)
    if not shutil.which("redis-server"):
        print("redis-server not found", file=sys.stderr)
        return 2
    from benchmarks.bench_release_scale import start_redis

    realtime = can_realtime()
    redis_process, url, folder = start_redis(realtime=realtime)
    os.environ["FAIRQUEUE_REDIS_URL"] = url
    prefix = f"fqbench-{uuid.uuid4().hex[:12]}"
    os.environ["FAIRQUEUE_PREFIX"] = prefix
    import redis

    from benchmarks.bench_fairness import QUEUE, setup_django
    from benchmarks.common import wait_for_redis

    client = redis.Redis.from_url(url, client_name=METER)
    wait_for_redis(client)
    db = setup_django()
    loads = [os.getloadavg()[0]]
    compared: dict[str, list[list[tuple[float, int]]]] = {}
    try:
        started = time.perf_counter()
        last_waiting, first_held, last_held = fill(db, QUEUE, args.waiting, args.held, args.pending)
        held_key = f"{prefix}:{QUEUE}:fq:lim:held:held"
        unindexed = unindex(client, prefix, QUEUE, args.held)
        # longer than the reads take (a few ms a call, 11 reads, each side's rounds)
        write_history(client, prefix, QUEUE, 600 + args.calls * (1 + 2 * args.rounds))
        print(
            f"setup: {args.waiting:,} waiting, {client.llen(held_key):,} held "
            f"in {time.perf_counter() - started:.0f} s; Redis "
            + ("real-time (chrt)" if realtime else "at normal priority")
        )
        ids = (last_waiting, first_held, last_held, unindexed)
        rows = measure(db, url, prefix, ids, args, walk=True)
        if args.compare:
            compared = side_by_side(args, url, prefix, ids)
        loads.append(os.getloadavg()[0])
    finally:
        db.shutdown()
        client.close()
        redis_process.terminate()
        redis_process.wait()
        shutil.rmtree(folder, ignore_errors=True)
    print()
    print(f"{args.waiting:,} waiting jobs, {args.held:,} held jobs of one tenant; load average")
    print(f"{loads[0]:.1f} at the start, {loads[-1]:.1f} at the end. Redis time per call, all its")
    print(f"commands (slow log), {args.calls} calls each (us), and as a multiple of ZRANK's")
    print()
    report(rows)
    if compared:
        print()
        print(f"--compare {args.compare}: {args.rounds} rounds each, alternating; before -> after")
        print()
        head = f"{'before':>7} {'after':>6} {'ratio':>6}"
        print(f"{'read':<40} {'p50':>4} {head} {'p99':>4} {head}")
        for label, (before, after) in compared.items():
            b, a = sorted(us for us, _ in before), sorted(us for us, _ in after)
            if not b or not a:
                continue
            b50, a50 = statistics.median(b), statistics.median(a)
            b99, a99 = percentile(b, 0.99), percentile(a, 0.99)
            print(
                f"{label:<40} {'':>4} {b50:>7.0f} {a50:>6.0f} {a50 / max(b50, 1):>6.2f} "
                f"{'':>4} {b99:>7.0f} {a99:>6.0f} {a99 / max(b99, 1):>6.2f}"
            )
    return 0


def report(rows: Sequence[tuple[str, list[tuple[float, int]]]]) -> None:
    """The table of :func:`measure`'s rows, ZRANK's the unit of the multiples."""
    zrank_row = dict(rows).get("BullMQ ZRANK, last waiting job") or [(1.0, 1)]
    base50 = max(1.0, statistics.median(us for us, _ in zrank_row))
    base99 = max(1.0, percentile(sorted(us for us, _ in zrank_row), 0.99))
    print(f"{'read':<40} {'cmds':>4} {'median':>7} {'p99':>7} {'max':>7} {'x p50':>6} {'x p99':>6}")
    for label, samples in rows:
        if not samples:
            print(f"{label:<40} {'(none logged)':>26}")
            continue
        times = sorted(us for us, _ in samples)
        commands = int(statistics.median(count for _, count in samples))
        p50, p99 = statistics.median(times), percentile(times, 0.99)
        print(
            f"{label:<40} {commands:>4} {p50:>7.0f} {p99:>7.0f} {times[-1]:>7.0f} "
            f"{p50 / base50:>6.0f} {p99 / base99:>6.0f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
