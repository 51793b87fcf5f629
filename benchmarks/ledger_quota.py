"""``benchmarks/bench_ledger.py``'s ``quota`` and ``breaker`` scenarios (see its docstring)."""

from __future__ import annotations

import argparse
import datetime as dt
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

import redis

from benchmarks.common import wait_until
from benchmarks.ledger_parts import (
    JOB_TYPE,
    QUEUE,
    Attempt,
    Loop,
    Workers,
    clear_usage_tables,
    finished,
    print_table,
    settled,
    use_prefix,
)


def _hold(tenant: str, reason: str) -> Any:
    from fairqueue.models import TenantHold

    return TenantHold.objects.filter(tenant_id=tenant, reason=reason).order_by("-id").first()


def _events(tenant: str) -> dict[str, dt.datetime]:
    from fairqueue.models import HoldAudit

    return {
        row.event: row.created_at
        for row in HoldAudit.objects.filter(tenant_id=tenant).order_by("id")
    }


# -- quota ------------------------------------------------------------------------------------


def _run_quota(
    action: str, args: argparse.Namespace, url: str, tmp: Path, log: TextIO
) -> tuple[dict[str, Any], Workers]:
    from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
    from fairqueue.enqueue.priority import wire_tenant_plan_lookup
    from fairqueue.models import TenantPlan

    prefix = f"fqq{action}{uuid.uuid4().hex[:6]}"
    use_prefix(prefix)
    clear_usage_tables()
    TenantPlan.objects.create(tenant_id="q", plan_tier="pro")  # normal by plan
    wire_tenant_plan_lookup()
    quotas = {"pro": {"worker_seconds": args.quota_s, "period": "day", "action": action}}
    loop = Loop(log, quotas=quotas)
    client = redis.Redis.from_url(url)
    job_ms = round(args.job_s * 1000)
    workers = Workers(url, prefix, tmp, log, concurrency=1, lock_ms=30_000)
    most = int(args.quota_s / args.job_s) + 10
    try:
        if not wait_until(lambda: client.hexists(f"{prefix}:{QUEUE}:fq:hist", "cursor"), 60, 0.05):
            raise SystemExit("the loop did not start (see the log)")
        workers.start(job_ms)
        if action == "hold":  # a backlog: the hold must stop it
            enqueue_jobs(JOB_TYPE, [{"runMs": job_ms}] * most, tenant_id="q")
            wait_until(lambda: _hold("q", "quota") is not None, most * args.job_s + 30, 0.1)
            time.sleep(3 * args.job_s)  # what else starts after it, if anything
        else:  # the producer sends the next job as the last ends: no backlog
            after = 0
            for _ in range(most):
                job = enqueue_job(JOB_TYPE, {"runMs": job_ms}, tenant_id="q")
                key = f"{prefix}:{QUEUE}:{job.job_id}"
                wait_until(lambda k=key: client.hexists(k, "finishedOn"), 60, 0.005)
                if _hold("q", "quota") is not None:
                    after += 1
                    if after >= 3:
                        break
        workers.stop()
        settled(client, prefix)
    finally:
        workers.stop()
        loop.stop()
    attempts = workers.attempts()
    counted = [a for a in attempts if action == "hold" or a.level != "low"]
    used_s = sum(a.take_to_end_ms for a in counted) / 1000
    longest = max((a.take_to_end_ms for a in counted), default=0) / 1000
    hold = _hold("q", "quota")
    acted_ms = hold.created_at.timestamp() * 1000 if hold is not None else None
    last = max((a for a in counted if a.ended_ms), key=lambda a: a.ended_ms, default=None)
    row = {
        "action": action,
        "quota s": args.quota_s,
        "job s": args.job_s,
        "attempts (its level)": len(counted),
        "after it (low)": len(attempts) - len(counted),
        "worker s": f"{used_s:.2f}",
        "overrun s": f"{used_s - args.quota_s:.2f}",
        "overrun in jobs": f"{(used_s - args.quota_s) / args.job_s:.2f}",
        "acted, s before its last job ended": (
            f"{(last.ended_ms - acted_ms) / 1000:.3f}" if last and acted_ms else "-"
        ),
        "within quota + one job": "yes"
        if hold is not None and used_s <= args.quota_s + longest
        else "NO",
    }
    return row, workers


def _rollover(action: str, url: str, workers: Workers, started_before: int) -> tuple[str, bool]:
    """The next day (the clock set, the loop's steps run here): the hold or demotion
    ends, held jobs run, and the tenant's next job is at its own level."""
    from fairqueue.broker import get_sync_broker
    from fairqueue.enqueue.api import enqueue_job
    from fairqueue.rebalance.passes import rebalance_queue
    from fairqueue.rebalance.usage_step import UsageStep
    from fairqueue.usage import holds

    tomorrow = dt.datetime.combine(
        dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1), dt.time(0, 0, 5), tzinfo=dt.UTC
    )
    holds.set_clock(lambda: tomorrow)
    client = redis.Redis.from_url(url)
    prefix = workers.prefix
    try:
        step = UsageStep()
        step.run(QUEUE)  # the period is over: lifted
        lifted = _hold("q", "quota").lifted_at is not None
        job = enqueue_job(JOB_TYPE, {"runMs": 10}, tenant_id="q")
        level = job.level.value
        index = workers.start(10)
        sync = get_sync_broker()

        def drained() -> bool:
            rebalance_queue(JOB_TYPE, rebalancer="bench-rollover")
            step.run(QUEUE)
            sync.run(sync.broker.limits.release, QUEUE)
            return client.llen(f"{prefix}:{QUEUE}:fq:lim:held:q") == 0 and not (
                client.zcard(f"{prefix}:{QUEUE}:prioritized")
                or client.llen(f"{prefix}:{QUEUE}:wait")
                or client.llen(f"{prefix}:{QUEUE}:active")
            )

        done = wait_until(drained, 120, 0.25)
        workers.processes[index].terminate()
        workers.stop()
        ran = len(workers.attempts()) - started_before
        held_again = _hold("q", "quota").lifted_at is None
    finally:
        holds.set_clock(None)
    ok = lifted and done and level == "normal" and not held_again
    return (
        f"{action}: the next day, lifted {'yes' if lifted else 'NO'}; then {ran} attempts ran "
        f"({'all drained' if done else 'NOT drained'}), its new job at {level}, "
        f"{'held again' if held_again else 'not held again'}: {'yes' if ok else 'NO'}"
    ), ok


def quota_scenario(args: argparse.Namespace, url: str, tmp: Path, log: TextIO) -> bool:
    rows, notes, held = [], [], True
    for action in ("hold", "demote"):
        row, workers = _run_quota(action, args, url, tmp, log)
        rows.append(row)
        held &= row["within quota + one job"] == "yes"
        note, ok = _rollover(action, url, workers, len(workers.attempts()))
        notes.append(note)
        held &= ok
    print(
        f"\nquota: a pro tenant with a {args.quota_s} s daily quota of {args.job_s:g} s jobs, "
        "one stock Node worker slot; worker s = taking each job to its end, as the worker "
        "measured (hold: every attempt; demote: those at its own level)\n"
    )
    print_table(rows)
    for note in notes:
        print(f"rollover, {note}")
    return held


# -- breaker ----------------------------------------------------------------------------------

HEALTHY = ("h1", "h2", "h3", "h4")
POISON = "px"


def _rate(attempts: list[Attempt], tenants: set[str], lo_ms: float, hi_ms: float) -> float:
    n = sum(1 for a in attempts if a.tenant in tenants and lo_ms <= a.started_ms < hi_ms)
    return n / max(1e-9, (hi_ms - lo_ms) / 1000)


def breaker_scenario(args: argparse.Namespace, url: str, tmp: Path, log: TextIO) -> bool:
    from fairqueue.enqueue.api import enqueue_jobs

    prefix = f"fqbrk{uuid.uuid4().hex[:6]}"
    use_prefix(prefix)
    clear_usage_tables()
    config = {"ENABLED": True, "WINDOW_S": 30, "MIN_JOBS": 20, "COOL_OFF_S": 10}
    loop = Loop(log, breaker=config)
    client = redis.Redis.from_url(url)
    workers = Workers(url, prefix, tmp, log, concurrency=4, lock_ms=30_000)
    enqueued = 0
    marks: dict[str, float] = {}
    try:
        if not wait_until(lambda: client.hexists(f"{prefix}:{QUEUE}:fq:hist", "cursor"), 60, 0.05):
            raise SystemExit("the loop did not start (see the log)")
        workers.start(50)
        began = time.monotonic()
        tick = 0
        while True:
            elapsed = time.monotonic() - began
            for tenant in HEALTHY:
                enqueue_jobs(JOB_TYPE, [{"runMs": 50}] * 3, tenant_id=tenant)
                enqueued += 3
            if elapsed >= 5:
                marks.setdefault("poison", time.time() * 1000)
                enqueue_jobs(
                    JOB_TYPE, [{"runMs": 50, "fail": True}] * 2, tenant_id=POISON, attempts=3
                )
                enqueued += 2
            tick += 1
            if tick % 5 == 0:
                events = _events(POISON)
                if "opened" in events and "opened" not in marks:
                    marks["opened"] = events["opened"].timestamp() * 1000
                if (
                    "opened" in marks
                    and "fixed" not in marks
                    and (time.time() * 1000 - marks["opened"] > 1000 * args.breaker_s)
                ):
                    workers.fix()
                    marks["fixed"] = time.time() * 1000
                if "closed" in events:
                    marks.setdefault("closed", events["closed"].timestamp() * 1000)
                if "closed" in marks and time.time() * 1000 - marks["closed"] > 5_000:
                    break
            if elapsed > 120:
                break
            time.sleep(max(0.0, began + tick * 0.1 - time.monotonic()))
        wait_until(lambda: finished(client, prefix) >= enqueued, 180, 0.2)
        settled(client, prefix)
    finally:
        workers.stop()
        loop.stop()
    return _breaker_report(workers.attempts(), marks, config, enqueued, finished(client, prefix))


def _breaker_report(
    attempts: list[Attempt],
    marks: dict[str, float],
    config: dict[str, Any],
    enqueued: int,
    done: int,
) -> bool:
    events = _events(POISON)
    print(
        f"\nbreaker: {len(HEALTHY)} healthy tenants at 30 jobs/s each, one stock Node worker "
        f"(4 slots, 50 ms jobs); from 5 s '{POISON}' at 20 jobs/s, every attempt failing "
        f"(3 attempts); breaker {config}; the fix {'' if 'fixed' in marks else 'NOT '}made "
        f"after it opened; events: {', '.join(events)}\n"
    )
    if "opened" not in marks or "closed" not in marks:
        print("the breaker did not open and close: NO")
        return False
    healthy = set(HEALTHY)
    poison_first = min(a.started_ms for a in attempts if a.tenant == POISON)
    opened, fixed, closed = marks["opened"], marks["fixed"], marks["closed"]
    before = _rate(attempts, healthy, poison_first + 1000, opened)
    after = _rate(attempts, healthy, opened + 1000, closed)
    alone = _rate(attempts, healthy, poison_first - 4000, poison_first)
    late = [a for a in attempts if a.tenant == POISON and opened + 1000 <= a.started_ms < closed]
    backlog = [a for a in attempts if a.tenant == POISON and a.started_ms >= closed]
    rows = [
        {
            "healthy tenants' attempts/s": "alone (before the failing tenant)",
            "value": f"{alone:.1f}",
        },
        {"healthy tenants' attempts/s": "beside it, breaker closed", "value": f"{before:.1f}"},
        {"healthy tenants' attempts/s": "after it opened", "value": f"{after:.1f}"},
        {"healthy tenants' attempts/s": "after / before", "value": f"{after / before:.2f}"},
    ]
    print_table(rows)
    from fairqueue.models import HoldAudit

    probes = HoldAudit.objects.filter(tenant_id=POISON, event="probe").count()
    ok = (
        len(late) <= probes
        and opened - poison_first <= 1000 * config["WINDOW_S"]
        and done >= enqueued
    )
    print(
        f"\nfailing from its first attempt to the opening: {(opened - poison_first) / 1000:.1f} s "
        f"(window {config['WINDOW_S']} s); its attempts started from 1 s after the opening "
        f"to the close: {len(late)} ({probes} probes); fixed {(fixed - opened) / 1000:.1f} s and "
        f"closed {(closed - opened) / 1000:.1f} s after the opening; then its backlog ran: "
        f"{sum(1 for a in backlog if a.ok)} of {len(backlog)} attempts completed; jobs "
        f"finished {done} of {enqueued}: {'yes' if ok else 'NO'}"
    )
    return ok
