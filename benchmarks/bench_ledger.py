"""The usage ledger, quotas and the breaker live: what they promise, measured against what
stock workers counted themselves (docs/design.md,
"Usage, quotas and the breaker: what holds").

Everything is real: a private ``redis-server`` (free port, no persistence), the
``manage.py rebalance_fair`` loop as a subprocess (``benchmarks/live_settings.py``, a
SQLite file, the Django cache on the private Redis), stock Node BullMQ 6.7 workers
(``benchmarks/usage_worker.mjs``: each counts every attempt as its processor starts it,
and its end as BullMQ confirmed it, with synchronous writes that survive a kill -9),
and fairqueue's enqueue. Scenarios (``--only``):

* ``live``: ``--jobs`` jobs of eight tenants enqueued at ``--rate``, each running 40..120
  ms; ``flaky``'s jobs fail twice then succeed (3 attempts), ``broken``'s always fail (2
  attempts). During the run the loop is killed -9 twice (while Redis holds counts the
  database has not got) and restarted, and a worker is killed -9 and restarted (its
  jobs stall: BullMQ's stalled check puts them back after ``--lock-ms``). At the end,
  per tenant: the ledger's attempts, completions and failures against the workers'
  own counts (exact), its worker time against theirs (taking the job, ``processedOn``,
  to its end, ``finishedOn``; within 1%).
* ``quota``: a tenant with a ``--quota-s`` daily quota of ``--job-s`` jobs, one worker
  slot: with ``hold`` (a backlog waiting) and with ``demote`` (the producer enqueues the
  next job as the last ends): the worker time it got beyond its quota before the action
  took effect (all its attempts for hold; those at its own level for demote). Then the
  period rolls over (the loop's steps run here with the clock set to the next day): the
  hold ends, its held jobs run, and its next job is at its own level again.
* ``breaker``: four healthy tenants keep one worker busy; a fifth joins whose every job
  fails (3 attempts). The healthy tenants' attempts per second before and after the
  breaker opens; the failing tenant's attempts after it opened; then its integration is
  fixed, the probe closes the breaker and its backlog runs.

    python benchmarks/bench_ledger.py [--only live quota breaker] [--jobs 10000]
        [--rate 250] [--workers 3] [--concurrency 10] [--lock-ms 5000]
        [--quota-s 60] [--job-s 1.0]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Before anything sets Django up: the benchmark's settings and its SQLite file.
TMP = Path(tempfile.mkdtemp(prefix="fqbench-ledger-"))
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.live_settings"
os.environ["FQBENCH_DB"] = str(TMP / "bench.sqlite3")

import redis  # noqa: E402

from benchmarks.bench_rebalance import private_redis  # noqa: E402
from benchmarks.common import wait_until  # noqa: E402
from benchmarks.ledger_parts import (  # noqa: E402
    JOB_TYPE,
    QUEUE,
    Loop,
    Unseen,
    Workers,
    clear_usage_tables,
    finished,
    ledger,
    print_table,
    reconcile,
    settled,
    setup_django,
    started_by_job,
    tally,
    use_prefix,
)

#: tenant -> (share of the jobs, attempts, fails its first n attempts, always fails)
TENANTS = {
    **{f"t{i}": (1.0, 1, 0, False) for i in range(6)},
    "flaky": (1.0, 3, 2, False),
    "broken": (0.5, 2, 0, True),
}


def _plan(jobs: int) -> list[tuple[str, dict[str, Any], int]]:
    rng = random.Random(7)
    names = list(TENANTS)
    weights = [TENANTS[name][0] for name in names]
    out = []
    for _ in range(jobs):
        tenant = rng.choices(names, weights)[0]
        _, attempts, fail_times, broken = TENANTS[tenant]
        data: dict[str, Any] = {"runMs": rng.randint(40, 120)}
        if fail_times:
            data["failTimes"] = fail_times
        if broken:
            data["fail"] = True
        out.append((tenant, data, attempts))
    return out


def _enqueue(batch: list[tuple[str, dict[str, Any], int]]) -> None:
    from fairqueue.enqueue.api import enqueue_jobs

    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for tenant, data, attempts in batch:
        groups.setdefault((tenant, attempts), []).append(data)
    for (tenant, attempts), payloads in groups.items():
        enqueue_jobs(JOB_TYPE, payloads, tenant_id=tenant, attempts=attempts)


def live(args: argparse.Namespace, url: str, tmp: Path, log: TextIO) -> bool:
    prefix = f"fqlive{uuid.uuid4().hex[:6]}"
    use_prefix(prefix)
    clear_usage_tables()
    client = redis.Redis.from_url(url)
    plan = _plan(args.jobs)
    loop = Loop(log)
    workers = Workers(url, prefix, tmp, log, concurrency=args.concurrency, lock_ms=args.lock_ms)
    dirty_key = f"{prefix}:{QUEUE}:fq:use:dirty"
    notes: list[str] = []
    try:
        if not wait_until(lambda: client.hexists(f"{prefix}:{QUEUE}:fq:hist", "cursor"), 60, 0.05):
            raise SystemExit("the loop did not start (see the log)")
        for _ in range(args.workers):
            workers.start()
        began = time.monotonic()
        step = max(1, round(args.rate / 10))
        kills = {len(plan) // 4: "loop", len(plan) // 2: "worker", 3 * len(plan) // 4: "loop"}
        for i in range(0, len(plan), step):
            due = began + i / args.rate
            time.sleep(max(0.0, due - time.monotonic()))
            _enqueue(plan[i : i + step])
            for at, what in kills.items():
                if i <= at < i + step:
                    if what == "loop":
                        # Counted in Redis, not yet in the database: kill -9 there.
                        wait_until(lambda: client.zcard(dirty_key) > 0, 5, 0.001)
                        notes.append(f"loop killed -9 with {client.zcard(dirty_key)} rows dirty")
                        loop.kill9_and_restart()
                    else:
                        active = client.llen(f"{prefix}:{QUEUE}:active")
                        notes.append(f"worker killed -9 with {active} jobs active in the queue")
                        workers.kill9_and_restart(0)
        if not wait_until(
            lambda: finished(client, prefix) >= len(plan), 300 + args.lock_ms / 1000, 0.1
        ):
            raise SystemExit(f"{finished(client, prefix)} of {len(plan)} jobs finished")
        drained_s = time.monotonic() - began
        if not settled(client, prefix):
            raise SystemExit("the loop did not write the whole ledger (see the log)")
    finally:
        workers.stop()
        loop.stop()
    from fairqueue.usage.ledger import write_all_usage

    attempts = workers.attempts()
    unseen = reconcile(attempts, started_by_job(client, prefix, {a.job_id for a in attempts}))
    rows = ledger()
    again = write_all_usage(QUEUE)  # nothing left to write: the same rows
    report = _live_report(args, tally(attempts), unseen, rows, notes, drained_s)
    unchanged = again.rows == 0 and ledger() == rows
    print(f"the ledger written again: {again.rows} rows, {'unchanged' if unchanged else 'CHANGED'}")
    return report and unchanged


def _live_report(
    args: argparse.Namespace,
    counted: dict[str, Any],
    unseen: dict[str, Unseen],
    rows: dict[str, tuple[int, int, int, int]],
    notes: list[str],
    drained_s: float,
) -> bool:
    """The table; whether each tenant's counts are equal (the workers' own, plus what a
    killed worker could not see, :func:`reconcile`) and the time within 1%."""
    table, exact = [], True
    totals = [0, 0, 0.0, 0, 0.0]
    for tenant in sorted(set(counted) | set(rows)):
        mine = counted.get(tenant)
        got = rows.get(tenant, (0, 0, 0, 0))
        w = (mine.attempts, mine.completed, mine.failed) if mine else (0, 0, 0)
        lost = unseen.get(tenant, Unseen())
        ok = (
            got[0] == w[0] + lost.taken
            and got[1] + got[2] == w[1] + w[2] + lost.ended
            and got[1] >= w[1]
            and got[2] >= w[2]
            and got[0] - got[1] - got[2] == lost.taken + lost.stalled
        )
        exact &= ok
        ms = mine.ms if mine else 0.0
        totals = [
            totals[0] + w[0],
            totals[1] + got[0],
            totals[2] + ms,
            totals[3] + got[3],
            totals[4] + (mine.processor_ms if mine else 0.0),
        ]
        table.append(
            {
                "tenant": tenant,
                "worker attempts / ok / failed / no end": (
                    f"{w[0]} / {w[1]} / {w[2]} / {mine.unended if mine else 0}"
                ),
                "killed worker: taken unstarted / ended unseen / stalled": (
                    f"{lost.taken} / {lost.ended} / {lost.stalled}"
                ),
                "ledger attempts / ok / failed": f"{got[0]} / {got[1]} / {got[2]}",
                "equal": "yes" if ok else "NO",
                "worker s (take to end)": f"{ms / 1000:.2f}",
                "ledger s": f"{got[3] / 1000:.2f}",
                "ledger / worker": f"{got[3] / ms:.4f}" if ms else "-",
            }
        )
    print(
        f"\nlive: {args.jobs} jobs of {len(TENANTS)} tenants at {args.rate}/s, "
        f"{args.workers} stock Node workers x {args.concurrency}, lock {args.lock_ms} ms; "
        f"drained in {drained_s:.0f} s; {'; '.join(notes)}\n"
    )
    print_table(table)
    ratio = totals[3] / totals[2] if totals[2] else float("nan")
    print(
        f"\nall: worker attempts {totals[0]}, ledger {totals[1]}; worker time "
        f"{totals[2] / 1000:.1f} s (processors alone {totals[4] / 1000:.1f} s), "
        f"ledger {totals[3] / 1000:.1f} s: "
        f"ledger / worker {ratio:.4f}"
    )
    held = exact and abs(ratio - 1) <= 0.01
    print(f"attempts exact per tenant, time within 1%: {'yes' if held else 'NO'}")
    return held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["live", "quota", "breaker"],
        default=["live", "quota", "breaker"],
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=250, help="jobs enqueued a second (live)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=10, help="each worker's")
    parser.add_argument("--lock-ms", type=int, default=5_000, help="the workers' lockDuration")
    parser.add_argument("--quota-s", type=int, default=60)
    parser.add_argument("--job-s", type=float, default=1.0)
    parser.add_argument("--breaker-s", type=float, default=12.0, help="failing before the fix")
    args = parser.parse_args(argv)
    for name, low in (("jobs", 1), ("rate", 1), ("workers", 1), ("concurrency", 1)):
        if getattr(args, name) < low:
            parser.error(f"--{name}={getattr(args, name)} is not allowed: expected >= {low}")
    tmp = TMP
    held = True
    try:
        with private_redis() as url, open(tmp / "loop.log", "w") as log:
            setup_django(url, tmp)
            if "live" in args.only:
                held &= live(args, url, tmp, log)
            if "quota" in args.only:
                from benchmarks.ledger_quota import quota_scenario

                held &= quota_scenario(args, url, tmp, log)
            if "breaker" in args.only:
                from benchmarks.ledger_quota import breaker_scenario

                held &= breaker_scenario(args, url, tmp, log)
    except BaseException:
        held = False
        raise
    finally:
        if held:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs and worker lines kept in {tmp}")
    return 0 if held else 1


if __name__ == "__main__":
    raise SystemExit(main())
