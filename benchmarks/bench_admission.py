"""Admission in overload, live, through every way in: does ``max_wait_ms`` hold the jobs
it admits to their bound, and leave a flow within its share alone?

Per path (Redis on ``FAIRQUEUE_REDIS_URL``, a stock Node BullMQ worker,
``benchmarks/live_worker.mjs``, concurrency 1, and the real ``manage.py rebalance_fair``
loop; a fresh prefix each): the worker's capacity C measured on a calibration backlog,
then ``--warmup-s`` and ``--seconds`` of open-loop arrivals in ``normal``: ``flood`` at
``--overload`` x C and ``calm`` at 0.1 C (within its share), every one with
``max_wait_ms=--max-wait-ms``. Paths:

* ``single``     ``enqueue_job`` per arrival
* ``batch``      the arrivals of each 10 ms tick in one ``enqueue_jobs`` (refused whole)
* ``delay_ms``   ``enqueue_job(delay_ms=--delay-ms)``, the bound counting the delay
* ``on_commit``  the arrivals of each tick as ``enqueue_on_commit`` in one transaction
* ``tasks``      the tasks backend (``MAX_WAIT_MS``), ``task.enqueue()`` per arrival

A job's wait: from its enqueue call to its start (the worker's ``processedOn``; one
machine, one clock); *late*: its start less the expected start it was admitted with
(``fqEta``), what admission misjudged. Reported per path and flow: jobs sent, refused,
and the admitted jobs' wait p50 / p99 against the bound and late p50 / p99 (the
arrivals go on, not in the figures, until the measured jobs have started, at most
``--drain-s``).

    python benchmarks/bench_admission.py [--only single ...] [--seconds 12] [--overload 3]
        [--compare OTHER_CHECKOUT] [--json FILE]

``--compare``: each path run by another checkout's copy of this script (the code before
a change) and then by this one, alternating, so both see the same load, at the capacity
the first measured (``--capacity``); one table, rows labelled ``old`` and ``new``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_eta import (  # noqa: E402
    TICK_S,
    _warm_count,
    drained_capacity,
    pct,
    warm_up,
)
from benchmarks.bench_fairness import (  # noqa: E402
    JOB_TYPE,
    LOG,
    NodeWorker,
    setup_django,
    start_loop,
    wait_for_loop,
)
from benchmarks.common import delete_prefix  # noqa: E402

PATHS = ("single", "batch", "delay_ms", "on_commit", "tasks")
#: (tenant, its rate in C): the flood's is --overload.
CALM_SHARE = 0.1


@dataclass
class Outcome:
    path: str
    sent: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    #: Jobs whose call failed otherwise: the benchmark's SQLite file locked by the loop's
    #: relay (two processes writing one SQLite file; a server database has no such wait).
    failed: Counter[str] = field(default_factory=Counter)
    #: job id -> (tenant, when its enqueue was called, measured or warm-up)
    jobs: dict[str, tuple[str, int, bool]] = field(default_factory=dict)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _sender(path: str, args: argparse.Namespace) -> Callable[[str, int], list[str]]:
    """Sends ``count`` jobs of a tenant by ``path``; the ids admitted (refused: raises)."""
    from django.db import transaction

    from benchmarks.bench_admission import admission_task as task_fn  # not __main__'s
    from fairqueue import enqueue_job, enqueue_jobs, enqueue_on_commit

    bound = {"priority_level": "normal", "max_wait_ms": args.max_wait_ms}

    def send(tenant: str, count: int) -> list[str]:
        if path == "batch":
            return [
                job.job_id
                for job in enqueue_jobs(JOB_TYPE, [{}] * count, tenant_id=tenant, **bound)
            ]
        if path == "on_commit":
            with transaction.atomic():
                return [
                    enqueue_on_commit(JOB_TYPE, {}, tenant_id=tenant, **bound).job_id
                    for _ in range(count)
                ]
        ids = []
        for _ in range(count):
            if path == "tasks":
                ids.append(str(task_fn.using(priority=0).enqueue(tenant_id=tenant).id))
            elif path == "delay_ms":
                ids.append(
                    enqueue_job(
                        JOB_TYPE, {}, tenant_id=tenant, delay_ms=args.delay_ms, **bound
                    ).job_id
                )
            else:
                ids.append(enqueue_job(JOB_TYPE, {}, tenant_id=tenant, **bound).job_id)
        return ids

    return send


def produce(
    path: str, args: argparse.Namespace, capacity: float, seconds: float, out: Outcome, warm: bool
) -> None:
    """Open-loop arrivals of the flood and the calm tenant through ``path`` (on the
    Django thread). A refused call counts its jobs refused; in a transaction (the
    ``on_commit`` path) one refusal ends the tick's transaction, its rows rolled back."""
    from django.db import OperationalError

    from fairqueue import ExpectedWaitTooLongError

    send = _sender(path, args)
    rates = {"flood": args.overload * capacity, "calm": CALM_SHARE * capacity}
    sent: Counter[str] = Counter()
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        for tenant, rate in rates.items():
            due = int(rate * elapsed) + 1 - sent[tenant]
            if due <= 0:
                continue
            sent[tenant] += due
            groups = [due] if path in ("batch", "on_commit") else [1] * due
            for count in groups:
                called = _now_ms()
                if not warm:
                    out.sent[tenant] += count
                try:
                    ids = send(tenant, count)
                except ExpectedWaitTooLongError:
                    if not warm:
                        out.refused[tenant] += count
                    continue
                except OperationalError:
                    if not warm:
                        out.failed[tenant] += count
                    continue
                for job_id in ids:
                    out.jobs[job_id] = (tenant, called, not warm)
        time.sleep(TICK_S)


def run_path(path: str, args: argparse.Namespace, db: Any) -> dict[str, Any]:
    from django.test import override_settings

    from fairqueue import conf

    prefix = f"fqadm-{uuid.uuid4().hex[:8]}"
    os.environ["FAIRQUEUE_PREFIX"] = prefix
    db.submit(conf.reload_settings).result()
    wargs = argparse.Namespace(
        concurrency=1, run_ms=args.run_ms, interval_ms=args.interval_ms, bound_ms=args.bound_ms
    )
    out = Outcome(path)
    tasks = {
        "default": {
            "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
            "OPTIONS": {"JOB_TYPES": {"default": JOB_TYPE}, "MAX_WAIT_MS": args.max_wait_ms},
        }
    }
    overridden = override_settings(TASKS=tasks)
    db.submit(overridden.enable).result()
    with LOG.open("a") as log:
        loop = start_loop(prefix, wargs, log)
        worker = NodeWorker(prefix, wargs, log)
        try:
            if not wait_for_loop(prefix, loop):
                raise RuntimeError(f"the loop did not start; see {LOG}")
            nominal = 1000 / (args.run_ms + 1)
            # a process's first enqueue loads the scripts and the lookups (seconds on a
            # loaded machine): done before the calibration, which counts its arrivals by time
            db.submit(_prime).result()
            db.submit(warm_up, nominal * 1.1, args.calibrate_s).result()
            # the calibration backlog draining (a loaded machine may start the worker late)
            deadline = time.monotonic() + 60
            while len(worker.seen) < min(100, _warm_count(prefix)) and time.monotonic() < deadline:
                time.sleep(0.1)
            while worker.process.poll() is None and len(worker.seen) < _warm_count(prefix):
                time.sleep(0.05)
            # the middle half of the drained backlog: the last seconds of the enqueues
            # swing with the machine's load (a worker still starting, or descheduled)
            capacity = args.capacity or drained_capacity(worker)
            db.submit(produce, path, args, capacity, args.warmup_s, out, True).result()
            db.submit(produce, path, args, capacity, args.seconds, out, False).result()
            measured = {job_id for job_id, (_, _, m) in out.jobs.items() if m}
            deadline = time.monotonic() + args.drain_s
            while time.monotonic() < deadline and not measured <= worker.seen:
                db.submit(produce, path, args, capacity, 2.0, out, True).result()
        finally:
            worker.stop()
            loop.terminate()
            loop.wait(15)
            db.submit(overridden.disable).result()
    waits: dict[str, list[float]] = defaultdict(list)
    unstarted: Counter[str] = Counter()
    started = {str(r["id"]): int(r["p"]) for r in worker.records if r.get("a", 0) == 0}
    for job_id, (tenant, called, is_measured) in out.jobs.items():
        if not is_measured:
            continue
        if job_id in started:
            waits[tenant].append(started[job_id] - called)
        else:
            unstarted[tenant] += 1
    late = _lateness(prefix, out, started)
    delete_prefix(prefix)
    return {
        "path": path,
        "capacity": round(capacity, 1),
        "flows": {
            tenant: {
                "sent": out.sent[tenant],
                "refused": out.refused[tenant],
                "failed": out.failed[tenant],
                "admitted": len(waits[tenant]) + unstarted[tenant],
                "not_started": unstarted[tenant],
                "wait_p50_ms": pct(waits[tenant], 0.5),
                "wait_p99_ms": pct(waits[tenant], 0.99),
                # actual start - the expected start the job was admitted with (fqEta)
                "late_p50_ms": pct(late[tenant], 0.5),
                "late_p99_ms": pct(late[tenant], 0.99),
            }
            for tenant in ("flood", "calm")
        },
    }


def _prime() -> None:
    from fairqueue import enqueue_job

    enqueue_job(JOB_TYPE, {}, tenant_id="warm", priority_level="normal")


def _lateness(prefix: str, out: Outcome, started: dict[str, int]) -> dict[str, list[float]]:
    """Per flow, how late each measured job started against the expected start it was
    admitted with (``fqEta`` in its opts): what admission misjudged, apart from the wait."""
    import redis

    from benchmarks.common import REDIS_URL

    ids = [i for i, (_, _, measured) in out.jobs.items() if measured and i in started]
    client = redis.Redis.from_url(REDIS_URL)
    try:
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(f"{prefix}:{JOB_TYPE}:{job_id}", "opts")
        opts = pipe.execute()
    finally:
        client.close()
    late: dict[str, list[float]] = defaultdict(list)
    for job_id, raw in zip(ids, opts, strict=True):
        eta = json.loads(raw).get("fqEta") if raw else None
        if eta is not None:
            late[out.jobs[job_id][0]].append(started[job_id] - int(eta))
    return late


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.0f}"


def compare(args: argparse.Namespace, argv: list[str]) -> list[dict[str, Any]]:
    """``--compare``: every path with the other checkout and this one, side by side
    (:func:`benchmarks.common.side_by_side`), each row labelled."""
    from benchmarks.common import side_by_side

    rows = []

    def capacity_of(out: Path) -> float | None:
        rows = json.loads(out.read_text())
        return rows[0]["capacity"] if rows else None

    for label, _path, out in side_by_side(
        "bench_admission.py", args.compare, list(args.only), "--only", argv, capacity_of
    ):
        for row in json.loads(out.read_text()):
            row["path"] = f"{row['path']} {label}"
            rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=PATHS, default=list(PATHS))
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--warmup-s", type=float, default=6.0)
    parser.add_argument("--calibrate-s", type=float, default=3.0)
    parser.add_argument("--drain-s", type=float, default=20.0)
    parser.add_argument("--run-ms", type=int, default=10)
    parser.add_argument("--interval-ms", type=int, default=250)
    parser.add_argument("--bound-ms", type=int, default=60_000, help="QUEUE_FAIR_MAX_WAIT_MS")
    parser.add_argument("--overload", type=float, default=3.0, help="the flood's rate, in C")
    parser.add_argument("--max-wait-ms", type=int, default=3_000)
    parser.add_argument("--delay-ms", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--capacity",
        type=float,
        default=None,
        help="the worker's capacity C (jobs/s) to offer the load at, instead of measuring it",
    )
    parser.add_argument(
        "--compare",
        type=Path,
        default=None,
        help="another checkout (the code before a change): each path run with it, then "
        "with this one, alternating, in one table",
    )
    args = parser.parse_args(argv)
    if args.compare is not None:
        rows = compare(args, list(argv if argv is not None else sys.argv[1:]))
    else:
        db = setup_django()
        rows = [run_path(path, args, db) for path in args.only]
        db.shutdown()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))
    print()
    print(
        f"admission in {args.overload:g}x overload: flood at {args.overload:g} C and calm at "
        f"{CALM_SHARE:g} C in normal, max_wait_ms={args.max_wait_ms}; waits from the enqueue call"
    )
    print()
    print(
        f"{'path':<14} {'C/s':>6} {'flow':<6} {'sent':>6} {'refused':>8} {'failed':>7} "
        f"{'admitted':>9} {'wait p50':>9} {'p99':>7} {'p99/bound':>9} {'late p50':>9} {'p99':>7}"
    )
    for row in rows:
        for tenant, flow in row["flows"].items():
            p99 = flow["wait_p99_ms"]
            ratio = "-" if p99 is None else f"{p99 / args.max_wait_ms:.2f}"
            print(
                f"{row['path']:<14} {row['capacity']:>6} {tenant:<6} {flow['sent']:>6} "
                f"{flow['refused']:>8} {flow['failed']:>7} {flow['admitted']:>9} "
                f"{_fmt(flow['wait_p50_ms']):>9} "
                f"{_fmt(p99):>7} {ratio:>9} {_fmt(flow.get('late_p50_ms')):>9} "
                f"{_fmt(flow.get('late_p99_ms')):>7}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
else:  # imported by name once Django is set up (@task reads the settings)
    try:  # Django 6: its own django.tasks; Django 5.2: the django-tasks backport
        from django.tasks import task
    except ImportError:
        from django_tasks import task

    @task()
    def admission_task(tenant_id: str | None = None) -> int:
        """The tasks path's task (the stock worker sleeps its run time; nothing runs it)."""
        return 1
