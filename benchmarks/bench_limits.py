"""Per-tenant limits with stock Node BullMQ workers and the rebalance loop running.

Each scenario runs twice in one invocation, side by side: with the limit and without it
(the same load), and prints the ratio. The consumer is one stock Node ``bullmq`` worker
(``benchmarks/live_worker.mjs``, no fairqueue code) with ``--concurrency`` slots (16);
``manage.py rebalance_fair`` runs as its own process, as in production.

* **max_active**: tenant ``lim`` (max_active 2) floods the normal level beside tenant
  ``other``, with critical and low work too. BullMQ's active list is sampled every 10 ms:
  the most of ``lim``'s jobs ever active at once must be 2. Throughput while the others
  still have work, against the same run without the limit: the goal is >= 97%.
* **rate**: tenant ``rated`` (50 jobs a second) floods beside ``other``; its starts are
  counted in consecutive 10 s windows: the goal is within 5% of 500.
* **pause**: tenants arrive at a steady rate; ``paused`` is paused for a while and
  resumed. Starts of its jobs after ``pause_tenant`` returned and before the resume must
  be 0; after the resume all of them run, in their order (inversions counted); the other
  tenants' p99 wait against the run without a pause: the goal is within 10%.
* **drain**: one tenant's ``--drain-jobs`` jobs, nothing else waiting: never held, and
  held by a pause then resumed, in alternating rounds; the resumed drain's rate against
  the never-held one (medians): the goal is >= 90%.

    .venv/bin/python benchmarks/bench_limits.py [--concurrency 16] [--run-ms 20] [--only drain]

Figures depend on the machine (a shared one is noisy): report them with their date.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_fairness import (  # noqa: E402
    JOB_TYPE,
    LOG,
    OUT,
    QUEUE,
    NodeWorker,
    fair_env,
    setup_django,
    start_loop,
    wait_for_loop,
)
from benchmarks.common import REDIS_URL, delete_prefix, stop_process  # noqa: E402

SAMPLE_S = 0.01


@dataclass
class Outcome:
    """One run: the worker's per-job records and what the sampler saw."""

    records: list[dict[str, Any]]
    most_active: int
    ids: dict[str, list[str]]
    marks: dict[str, float]


def _env(prefix: str, args: argparse.Namespace) -> None:
    import os

    from fairqueue import conf

    os.environ.update(fair_env(prefix, args))
    conf.reload_settings()


def _plans(limits: dict[str, dict[str, Any]]) -> None:
    from fairqueue.enqueue.lookups import clear_local_plans
    from fairqueue.enqueue.priority import wire_tenant_plan_lookup
    from fairqueue.models import TenantPlan

    TenantPlan.objects.all().delete()
    for tenant, fields in limits.items():
        TenantPlan.objects.create(tenant_id=tenant, plan_tier="pro", **fields)
    clear_local_plans()
    wire_tenant_plan_lookup()


def _enqueue(tenant: str, count: int, level: str = "normal") -> list[str]:
    from fairqueue.enqueue.api import enqueue_jobs

    ids: list[str] = []
    for start in range(0, count, 250):
        batch = min(250, count - start)
        ids += [
            job.job_id
            for job in enqueue_jobs(JOB_TYPE, [{}] * batch, tenant_id=tenant, priority_level=level)
        ]
    return ids


class Sampler:
    """Samples BullMQ's active list every 10 ms: the most of ``watched`` active at once."""

    def __init__(self, prefix: str, watched: set[str]) -> None:
        import redis

        self.client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.key = f"{prefix}:{QUEUE}:active"
        self.watched = watched
        self.most = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            active = self.client.lrange(self.key, 0, -1)
            self.most = max(self.most, sum(1 for job_id in active if job_id in self.watched))

    def close(self) -> int:
        self.stop.set()
        self.thread.join(5)
        self.client.close()
        return self.most


def _run(args, db: ThreadPoolExecutor, limits, load, *, expect: int, during=None) -> Outcome:
    """One run: plans, the loop, the worker, ``load`` (tenant -> (count, level)) enqueued
    up front, ``during(db, marks)`` meanwhile, until ``expect`` jobs finished."""
    prefix = f"fqlim-{uuid.uuid4().hex[:8]}"
    OUT.mkdir(exist_ok=True)
    log = LOG.open("a")
    db.submit(_env, prefix, args).result()
    db.submit(_plans, limits).result()
    loop = start_loop(prefix, args, log)
    worker = None
    sampler = None
    marks: dict[str, float] = {}
    try:
        if not wait_for_loop(prefix, loop):
            raise RuntimeError(f"the loop did not start; see {LOG}")
        ids = {
            tenant: db.submit(_enqueue, tenant, count, level).result()
            for tenant, (count, level) in load.items()
        }
        watched = set(ids.get("lim", []))
        sampler = Sampler(prefix, watched)
        marks["start"] = time.time()
        worker = NodeWorker(prefix, args, log)
        if during is not None:
            ids.update(during(db, marks))
            expect = sum(len(job_ids) for job_ids in ids.values())  # every job produced
        deadline = time.monotonic() + args.timeout_s
        while len(worker.records) < expect and time.monotonic() < deadline:
            time.sleep(0.05)
        if len(worker.records) < expect:
            raise RuntimeError(f"only {len(worker.records)} of {expect} jobs ran; see {LOG}")
        return Outcome(list(worker.records), sampler.close(), ids, marks)
    finally:
        if sampler is not None and not sampler.stop.is_set():
            sampler.close()
        if worker is not None:
            worker.stop()
        stop_process(loop)
        log.close()
        delete_prefix(prefix)


def _busy_throughput(records: Sequence[dict[str, Any]], others: set[str]) -> float:
    """Jobs finished per second from the first start until the last job of ``others``
    (the tenants without a limit) finished: the window in which the limited tenant's
    unused slots must go to them."""
    start = min(r["p"] for r in records)
    end = max(r["f"] for r in records if r["t"] in others)
    done = sum(1 for r in records if r["f"] <= end)
    return done / max(1e-3, (end - start) / 1000)


def max_active(args, db) -> list[str]:
    load = {
        "lim": (1500, "normal"),
        "other": (1500, "normal"),
        "crit": (400, "critical"),
        "lowt": (400, "low"),
    }
    others = {"other", "crit", "lowt"}
    limited = _run(args, db, {"lim": {"max_active": 2}}, load, expect=3800)
    plain = _run(args, db, {}, load, expect=3800)
    with_limit = _busy_throughput(limited.records, others)
    without = _busy_throughput(plain.records, others)
    return [
        "max_active 2 (tenant 'lim' flooding; 'other', critical and low work beside it):",
        f"  most of lim's jobs active at once (sampled every 10 ms): {limited.most_active} "
        f"(without the limit: {plain.most_active})",
        f"  throughput while the others had work: {with_limit:.0f} jobs/s with the limit, "
        f"{without:.0f} without: {with_limit / without:.1%} (goal >= 97%)",
    ]


def rate(args, db) -> list[str]:
    per_s = 50
    load = {
        "rated": (int(per_s * (args.rate_windows * 10 + 2)), "normal"),
        "other": (4000, "normal"),
    }
    outcome = _run(
        args,
        db,
        {"rated": {"rate_max": per_s, "rate_duration_ms": 1000}},
        load,
        expect=sum(count for count, _ in load.values()),
    )
    starts = sorted(r["p"] for r in outcome.records if r["t"] == "rated")
    first = starts[0]
    lines = [f"rate {per_s}/s (tenant 'rated' flooding beside 'other'):"]
    for window in range(args.rate_windows):
        low, high = first + window * 10_000, first + (window + 1) * 10_000
        count = sum(1 for s in starts if low <= s < high)
        lines.append(
            f"  window {window + 1}: {count} starts in 10 s = {count / 10:.1f}/s "
            f"({count / (per_s * 10) - 1:+.1%} off {per_s}/s; goal within 5%)"
        )
    return lines


def _steady(tenants: Sequence[str], seconds: float, per_s: float, pause_at=None, resume_at=None):
    """A producer: ``per_s`` jobs a second per tenant for ``seconds``; pauses tenant
    ``paused`` at ``pause_at`` s and resumes it at ``resume_at`` s (marks their times)."""

    def during(db: ThreadPoolExecutor, marks: dict[str, float]) -> dict[str, list[str]]:
        from fairqueue import pause_tenant, resume_tenant

        ids: dict[str, list[str]] = {tenant: [] for tenant in tenants}
        start = time.monotonic()
        step = 0.05
        tick = 0
        while time.monotonic() - start < seconds:
            tick += 1
            for tenant in tenants:
                count = int(per_s * step * tick) - int(per_s * step * (tick - 1))
                if count:
                    ids[tenant] += db.submit(_enqueue, tenant, count).result()
            elapsed = time.monotonic() - start
            if pause_at is not None and "paused" not in marks and elapsed >= pause_at:
                db.submit(pause_tenant, "paused").result()
                marks["paused"] = time.time()
            if resume_at is not None and "resuming" not in marks and elapsed >= resume_at:
                marks["resuming"] = time.time()
                db.submit(resume_tenant, "paused").result()
            time.sleep(max(0.0, start + step * tick - time.monotonic()))
        return ids

    return during


def _p99_wait(records: Sequence[dict[str, Any]], tenants: set[str]) -> float:
    waits = sorted(r["p"] - r["ts"] for r in records if r["t"] in tenants)
    return waits[int(0.99 * (len(waits) - 1))] if waits else 0.0


def pause(args, db) -> list[str]:
    tenants = ("paused", "a", "b")
    seconds, per_s = 12.0, args.concurrency * 1000 / args.run_ms * 0.6 / len(tenants)
    expect = int(seconds * per_s) * len(tenants) - len(tenants) * 2
    paused = _run(
        args, db, {"paused": {}}, {}, expect=expect,
        during=_steady(tenants, seconds, per_s, pause_at=3.0, resume_at=8.0),
    )  # fmt: skip
    plain = _run(
        args, db, {"paused": {}}, {}, expect=expect, during=_steady(tenants, seconds, per_s)
    )
    mine = [r for r in paused.records if r["t"] == "paused"]
    pause_ms, resume_ms = paused.marks["paused"] * 1000, paused.marks["resuming"] * 1000
    during = sum(1 for r in mine if pause_ms <= r["p"] < resume_ms)
    position = {job_id: index for index, job_id in enumerate(paused.ids["paused"])}
    after = sorted(
        (r for r in mine if r["p"] >= resume_ms), key=lambda r: (r["p"], position[r["id"]])
    )
    order = [position[r["id"]] for r in after]
    inversions = sum(1 for x, y in zip(order, order[1:], strict=False) if y < x)
    ran = {r["id"] for r in mine}
    with_pause = _p99_wait(paused.records, {"a", "b"})
    without = _p99_wait(plain.records, {"a", "b"})
    # while it is paused (its share goes to the others) and after the resume (its
    # backlog takes its fair share again), each against the same stretch of the plain run
    phases = {
        "while paused": (
            pause_ms - paused.marks["start"] * 1000,
            resume_ms - paused.marks["start"] * 1000,
        ),
        "after the resume": (resume_ms - paused.marks["start"] * 1000, float("inf")),
    }
    phase_lines = []
    for name, (low, high) in phases.items():
        mine_p99 = _p99_wait(_between(paused.records, paused.marks["start"], low, high), {"a", "b"})
        base_p99 = _p99_wait(_between(plain.records, plain.marks["start"], low, high), {"a", "b"})
        phase_lines.append(
            f"    {name}: {mine_p99:.0f} ms against {base_p99:.0f} ms "
            f"({mine_p99 / max(base_p99, 1):.2f}x)"
        )
    return [
        f"pause/resume (3 tenants arriving at {per_s:.0f}/s each, 'paused' paused 3 s..8 s):",
        f"  starts of the paused tenant between pause_tenant returning and the resume: {during}",
        f"  after the resume: {len(ran)} of its {len(paused.ids['paused'])} jobs ran; "
        f"{inversions} out of order among the {len(after)} released after the resume "
        "(same-ms starts on 16 slots counted in order)",
        f"  others' p99 wait: {with_pause:.0f} ms with the pause, {without:.0f} ms without "
        f"({with_pause / max(without, 1):.2f}x; goal within 10%)",
        *phase_lines,
    ]


def _drain_once(args, db, *, held: bool) -> float:
    """Jobs a second of one tenant's ``--drain-jobs`` jobs, nothing else waiting: never
    held (added, then drained), or held by a pause and then resumed."""
    count = args.drain_jobs

    def during(db: ThreadPoolExecutor, marks: dict[str, float]) -> dict[str, list[str]]:
        from fairqueue import pause_tenant, resume_tenant

        if held:
            db.submit(pause_tenant, "drain").result()
        ids = db.submit(_enqueue, "drain", count).result()
        if held:
            time.sleep(0.5)  # the worker is up and idle, everything held
            marks["resuming"] = time.time()
            db.submit(resume_tenant, "drain").result()
        return {"drain": ids}

    outcome = _run(args, db, {}, {}, expect=count, during=during)
    starts = sorted(r["p"] for r in outcome.records)
    ends = sorted(r["f"] for r in outcome.records)
    return count / max(1e-3, (ends[-1] - starts[0]) / 1000)


def drain(args, db) -> list[str]:
    plain, resumed = [], []
    for _ in range(args.drain_rounds):  # alternating: the machine's noise hits both
        plain.append(_drain_once(args, db, held=False))
        resumed.append(_drain_once(args, db, held=True))
    plain_rate, resumed_rate = sorted(plain)[len(plain) // 2], sorted(resumed)[len(resumed) // 2]
    return [
        f"resume drain ({args.drain_jobs} jobs of one tenant, nothing else waiting, "
        f"{args.drain_rounds} alternating rounds, medians):",
        f"  never held {plain_rate:.0f} jobs/s ({', '.join(f'{r:.0f}' for r in plain)}), "
        f"held then resumed {resumed_rate:.0f} jobs/s "
        f"({', '.join(f'{r:.0f}' for r in resumed)}): {resumed_rate / plain_rate:.1%} "
        "(goal >= 90%)",
    ]


def _between(records, start_s: float, low_ms: float, high_ms: float):
    """The records whose job was enqueued ``low_ms..high_ms`` after the run started."""
    return [r for r in records if low_ms <= r["ts"] - start_s * 1000 < high_ms]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--run-ms", type=int, default=20)
    parser.add_argument("--interval-ms", type=int, default=5000)
    parser.add_argument("--bound-ms", type=int, default=300_000)
    parser.add_argument("--rate-windows", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--drain-jobs", type=int, default=20_000)
    parser.add_argument("--drain-rounds", type=int, default=3)
    parser.add_argument("--only", choices=("max_active", "rate", "pause", "drain"), default=None)
    args = parser.parse_args(argv)
    db = setup_django()
    scenarios = {"max_active": max_active, "rate": rate, "pause": pause, "drain": drain}
    lines = [
        f"benchmarks/bench_limits.py {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"one stock Node worker, {args.concurrency} slots, jobs of {args.run_ms} ms, the loop "
        "running"
    ]
    for name, scenario in scenarios.items():
        if args.only in (None, name):
            lines += scenario(args, db)
            print("\n".join(lines), flush=True)
            lines = []
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
