"""How good is "when will my job start?": estimates at enqueue against real starts, live,
and what ``job_status`` and ``estimate_start`` cost Redis at a million waiting jobs.

Live part (Redis on ``FAIRQUEUE_REDIS_URL``, a stock Node BullMQ worker,
``benchmarks/live_worker.mjs``, concurrency 1 so the pop order is the start order,
and the real ``manage.py rebalance_fair`` loop): per scenario, a fresh prefix, a short
calibration backlog (the worker's capacity C), ``--warmup-s`` of the scenario's own
arrivals (so the loop's history has measured its pace; not in the figures), then
``--seconds`` of open-loop arrivals, every job enqueued one by one with
``enqueue_job(..., estimate=True)`` (and ``max_wait_ms`` in ``overload``), every 5th one
asked ``job_status`` right after its add. The arrivals then go on (not in the figures)
until every measured job has started, at most ``--drain-s``: the estimate assumes the
flows backlogged now stay so, and a load that stops lets the jobs far back start sooner.

* error = |expected start - actual start| (the worker's ``processedOn``; one machine, one
  clock), against the job's actual wait; a job is *within* when the error is at most 20%
  of its wait, or 100 ms when it waited under 500 ms; *in range* when it started between
  ``earliest_start_ms`` and ``latest_start_ms``; *high p90*: the 90th percentile of the
  relative error of the jobs whose estimate said ``high``.
* every measured job counts, and the jobs enqueued within ``AFTER_CHANGE_S`` (10 s) after
  a change of load are reported again on their own.
* place in line: for the jobs asked, ``ahead`` (what ``job_status`` said) against the jobs
  the worker actually took before it, less those enqueued after the call (jobs arriving
  later with earlier turns, counted apart as ``later``).

Scenarios (C = the worker's measured capacity; changes at ``CHANGE_S`` = 6 s into the
measured phase, which then lasts at least until 10 s after the last change):

* ``backlogged``  critical, high, normal, low at 0.5 C each (normal and low backlogged)
* ``flood``       critical at 2 C beside low at 0.1 C (within its share)
* ``tenants``     normal: A and B at 1 C each, ``sparse`` at 0.05 C
* ``overload``    critical and high at 1 C, normal at 0.95 C, low at 0.05 C (within its
  share; 3 C in all), every enqueue with ``max_wait_ms=2000``: refusals per flow and the
  admitted jobs' wait p99
* ``slow``        normal: ``slow`` (jobs 4x as long) and ``fast`` at 0.3 C each
* ``step``        normal: A at 0.4 C, B at 0.8 C; A steps to 1.2 C
* ``join-leave``  normal: A at 0.8 C, B at 0.6 C; C joins at 0.8 C, B leaves 5 s later
* ``level-flood`` normal A and B at 0.5 C, low at 0.3 C; critical starts at 1.5 C
* ``failures``    normal A and B at 0.6 C; A's jobs start failing their first attempt
  (each runs again once)
* ``max-active``  normal: ``lim`` (``max_active=2``) at 1 C beside ``other`` at 0.6 C
* ``rate-limited`` normal: ``rated`` at 0.4 C held to 0.2 C by its rate limit, ``other``
  at 0.9 C
* ``quiet-weight`` normal: ``flood`` (weight 1) at 2 C beside ``quiet`` (weight 2) at
  0.05 C

``--quick`` (a CI smoke run, about 4-5 minutes): the scenarios backlogged, level-flood,
max-active and quiet-weight, 12 s of warm-up and 8 s measured (16 s with a change), no
cost part.

Cost part (a private redis-server, ``--waiting`` jobs over 400 flows): the Redis time of
``job_status`` and ``estimate_start`` scripts from its slow log (threshold 0), p50 / p99
/ max over 200 calls each.

    python benchmarks/bench_eta.py [--only flood ...] [--seconds 12] [--run-ms 10]
        [--waiting 1000000] [--skip-cost] [--skip-live] [--quick] [--dump DIR]
        [--compare OTHER_CHECKOUT]

``--compare``: each scenario run by another checkout's copy of this script (the code
before a change) and then by this one, alternating, so both see the same load of a
shared machine, at the capacity the first measured (``--capacity``); one table, rows
labelled ``old`` and ``new``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_fairness import (  # noqa: E402
    JOB_TYPE,
    LOG,
    OUT,
    NodeWorker,
    setup_django,
    start_loop,
    wait_for_loop,
)
from benchmarks.bench_limits import _plans  # noqa: E402
from benchmarks.common import REDIS_URL, delete_prefix, wait_for_redis  # noqa: E402

TICK_S = 0.01
LEVELS = ("critical", "high", "normal", "low")
STATUS_EVERY = 5


@dataclass(frozen=True)
class Source:
    level: str
    tenant: str
    share_of_c: float
    #: Its jobs run this many times as long as the others (``None``: as long).
    run_factor: float | None = None
    #: Seconds into the measured phase it starts and stops sending (``None``: from the
    #: warm-up on; to the end of the drain).
    start_s: float | None = None
    stop_s: float | None = None
    #: From this second on its jobs fail their first attempt (and run again once).
    fail_from_s: float | None = None
    #: Its tenant weight (``None``: the default).
    weight: int | None = None

    def sends_at(self, at_s: float) -> bool:
        """Whether it sends ``at_s`` seconds into the measured phase (warm-up: 0)."""
        return (self.start_s is None or at_s >= self.start_s) and (
            self.stop_s is None or at_s < self.stop_s
        )


@dataclass(frozen=True)
class Scenario:
    name: str
    sources: tuple[Source, ...]
    max_wait_ms: int | None = None
    #: Tenant -> TenantPlan fields (its limits), set before the run.
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: In the ``--quick`` run.
    quick: bool = False

    def changes_s(self) -> tuple[float, ...]:
        """Seconds into the measured phase where the load changes."""
        times = {
            at
            for source in self.sources
            for at in (source.start_s, source.stop_s, source.fail_from_s)
            if at is not None
        }
        return tuple(sorted(times))


#: Seconds into the measured phase of the first change, and the phase after a change
#: reported on its own.
CHANGE_S = 6.0
AFTER_CHANGE_S = 10.0

SCENARIOS = (
    Scenario(
        "backlogged",
        tuple(Source(lv, "t", 0.5) for lv in ("critical", "high", "normal", "low")),
        quick=True,
    ),
    Scenario("flood", (Source("critical", "f", 2.0), Source("low", "l", 0.1))),
    Scenario(
        "tenants",
        (Source("normal", "A", 1.0), Source("normal", "B", 1.0), Source("normal", "sparse", 0.05)),
    ),
    Scenario(
        "overload",
        (
            Source("critical", "t", 1.0),
            Source("high", "t", 1.0),
            Source("normal", "t", 0.95),
            Source("low", "t", 0.05),  # within its share (0.1 C)
        ),
        max_wait_ms=2000,
    ),
    Scenario("slow", (Source("normal", "slow", 0.3, run_factor=4), Source("normal", "fast", 0.3))),
    # load that changes while jobs wait (CHANGE_S into the measured phase)
    Scenario(
        "step",  # one flow's rate triples
        (
            Source("normal", "A", 0.4),
            Source("normal", "A", 0.8, start_s=CHANGE_S),
            Source("normal", "B", 0.8),
        ),
    ),
    Scenario(
        "join-leave",  # a tenant joins, later another leaves
        (
            Source("normal", "A", 0.8),
            Source("normal", "B", 0.6, stop_s=CHANGE_S + AFTER_CHANGE_S / 2),
            Source("normal", "C", 0.8, start_s=CHANGE_S),
        ),
    ),
    Scenario(
        "level-flood",  # normal and low backlogged, then critical floods
        (
            Source("normal", "A", 0.5),
            Source("normal", "B", 0.5),
            Source("low", "L", 0.3),
            Source("critical", "C", 1.5, start_s=CHANGE_S),
        ),
        quick=True,
    ),
    Scenario(
        "failures",  # one tenant's jobs start failing once (each runs again)
        (Source("normal", "A", 0.6, fail_from_s=CHANGE_S), Source("normal", "B", 0.6)),
    ),
    # limits and weights
    Scenario(
        "max-active",  # a max_active=2 tenant with a backlog beside another
        (Source("normal", "lim", 1.0), Source("normal", "other", 0.6)),
        plans={"lim": {"max_active": 2}},
        quick=True,
    ),
    Scenario(
        "rate-limited",  # a tenant held to RATED_SHARE C by its rate limit
        (Source("normal", "rated", 0.4), Source("normal", "other", 0.9)),
        plans={"rated": {"rate_duration_ms": 1000}},
    ),
    Scenario(
        "quiet-weight",  # a quiet weight-2 tenant beside a flooding weight-1 tenant
        (Source("normal", "flood", 2.0), Source("normal", "quiet", 0.05, weight=2)),
        quick=True,
    ),
)
#: The rate-limited tenant's limit, a share of the worker's capacity C.
RATED_SHARE = 0.2


@dataclass
class Sent:
    flow: str
    enqueued_ms: int
    expected_ms: int | None
    confidence: str
    said_ahead: int | None = None
    asked_at_ms: int | None = None
    #: Sent in the warm-up or the drain: in the start order, not in the figures.
    warm: bool = False
    earliest_ms: int | None = None
    latest_ms: int | None = None
    #: Sent within AFTER_CHANGE_S after a change of load.
    after_change: bool = False
    #: Its tenant's limits held it when it was enqueued.
    held: bool = False


@dataclass
class Outcome:
    scenario: str
    sent: dict[str, Sent] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    starts: dict[str, int] = field(default_factory=dict)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _payload(source: Source, run_ms: int, failing: bool) -> dict[str, Any]:
    """A job's data for the worker: its run time when not the default, and whether its
    first attempt fails."""
    payload: dict[str, Any] = (
        {} if source.run_factor is None else {"runMs": source.run_factor * run_ms}
    )
    if failing:
        payload["failTimes"] = 1
    return payload


def produce(
    scenario: Scenario,
    capacity: float,
    seconds: float,
    run_ms: int,
    out: Outcome,
    warm: bool = False,
    at_s: float | None = None,
    batched: bool = False,
) -> None:
    """Open-loop arrivals, one ``enqueue_job`` each (on the Django thread); ``warm``:
    the warm-up's or the drain's, kept apart from the figures, with the mix of ``at_s``
    seconds into the measured phase (``None``: the measured phase itself, its mix
    changing as the scenario says). ``batched`` (the drain): each tick's jobs of a flow
    in one ``enqueue_jobs`` without estimates, not recorded: an estimated enqueue costs
    10-20 ms on a loaded machine, and a producer that falls behind its rates lets the
    measured jobs far back start sooner than the load they were estimated in."""
    from fairqueue import ExpectedWaitTooLongError, enqueue_job, enqueue_jobs, job_status

    sent_count = [0] * len(scenario.sources)
    changes = scenario.changes_s()
    start = time.monotonic()
    n = 0
    while (elapsed := time.monotonic() - start) < seconds:
        now_s = elapsed if at_s is None else at_s
        after = any(0 <= now_s - change < AFTER_CHANGE_S for change in changes)
        for index, source in enumerate(scenario.sources):
            if not source.sends_at(now_s):
                sent_count[index] = int(source.share_of_c * capacity * elapsed)
                continue
            rate = source.share_of_c * capacity
            due = int(rate * elapsed) + 1 - sent_count[index]
            if batched:
                if due > 0:
                    sent_count[index] += due
                    failing = source.fail_from_s is not None and now_s >= source.fail_from_s
                    enqueue_jobs(
                        JOB_TYPE,
                        [_payload(source, run_ms, failing)] * due,
                        tenant_id=source.tenant,
                        priority_level=source.level,
                        tenant_weight=source.weight,
                        attempts=2 if failing else None,
                    )
                continue
            for _ in range(max(0, due)):
                sent_count[index] += 1
                flow = f"{source.level}/{source.tenant}"
                failing = source.fail_from_s is not None and now_s >= source.fail_from_s
                payload = _payload(source, run_ms, failing)
                try:
                    job = enqueue_job(
                        JOB_TYPE,
                        payload,
                        tenant_id=source.tenant,
                        priority_level=source.level,
                        estimate=True,
                        max_wait_ms=scenario.max_wait_ms,
                        tenant_weight=source.weight,
                        attempts=2 if failing else None,
                    )
                except ExpectedWaitTooLongError:
                    out.refused[flow] += 1
                    continue
                est = job.estimate
                assert est is not None
                enqueued = (est.expected_start_ms or 0) - (est.expected_wait_ms or 0)
                record = Sent(
                    flow,
                    enqueued,
                    est.expected_start_ms,
                    est.confidence,
                    warm=warm,
                    earliest_ms=est.earliest_start_ms,
                    latest_ms=est.latest_start_ms,
                    after_change=after and not warm,
                    held=est.held_reason is not None,
                )
                n += 1
                if n % STATUS_EVERY == 0 and not warm:
                    record.asked_at_ms = _now_ms()
                    status = job_status(JOB_TYPE, job.job_id)
                    record.said_ahead = None if status is None else status.ahead
                out.sent[job.job_id] = record
        time.sleep(TICK_S)


def warm_up(capacity: float, seconds: float) -> None:
    from fairqueue import enqueue_jobs

    start = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(capacity * elapsed) + 1 - sent
        if due > 0:
            enqueue_jobs(JOB_TYPE, [{}] * due, tenant_id="warm", priority_level="normal")
            sent += due
        time.sleep(TICK_S)


def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _figures(out: Outcome, jobs: Sequence[tuple[str, Sent]]) -> dict[str, Any]:
    """Errors of ``jobs`` (measured ones that started): relative to the wait (at least
    500 ms), within 20% (100 ms under 500 ms), the range's hits, the ``high`` ones."""
    errors, waits, rel, within, hits, ranged, high = [], [], [], 0, 0, 0, []
    confidences: Counter[str] = Counter()
    for job_id, sent in jobs:
        started = out.starts.get(job_id)
        if started is None or sent.expected_ms is None:
            continue
        wait = started - sent.enqueued_ms
        error = abs(sent.expected_ms - started)
        errors.append(error)
        waits.append(wait)
        rel.append(error / max(wait, 500))
        confidences[sent.confidence] += 1
        if error <= (100 if wait < 500 else 0.2 * wait):
            within += 1
        if sent.earliest_ms is not None and sent.latest_ms is not None:
            ranged += 1
            hits += sent.earliest_ms <= started <= sent.latest_ms
        if sent.confidence == "high":
            high.append(error / max(wait, 500))
    return {
        "jobs": len(errors),
        "wait_p50_ms": pct(waits, 0.5),
        "err_p50_ms": pct(errors, 0.5),
        "err_p90_ms": pct(errors, 0.9),
        "rel_p50": pct(rel, 0.5),
        "rel_p90": pct(rel, 0.9),
        "within": within / len(errors) if errors else None,
        "range_hit": hits / ranged if ranged else None,
        "high_jobs": len(high),
        "high_rel_p90": pct(high, 0.9),
        "confidence": dict(confidences),
    }


def analyse(out: Outcome) -> dict[str, Any]:
    by_flow: dict[str, list[float]] = defaultdict(list)
    signed: dict[str, list[float]] = defaultdict(list)
    measured = [(job_id, sent) for job_id, sent in out.sent.items() if not sent.warm]
    for job_id, sent in measured:
        started = out.starts.get(job_id)
        if started is None or sent.expected_ms is None:
            continue
        wait = started - sent.enqueued_ms
        by_flow[sent.flow].append(wait)
        flow = f"{sent.flow} (held)" if sent.held else sent.flow
        signed[flow].append((sent.expected_ms - started) / max(wait, 500))
    after = [(job_id, sent) for job_id, sent in measured if sent.after_change]
    # place in line: jobs popped before each asked job, in start order
    order = sorted(out.starts.items(), key=lambda item: (item[1], int(item[0])))
    position = {job_id: index for index, (job_id, _) in enumerate(order)}
    exact, near, diffs, later_total, asked = 0, 0, [], 0, 0
    for job_id, sent in out.sent.items():
        if sent.said_ahead is None or sent.warm or job_id not in position:
            continue
        asked += 1
        asked_at = sent.asked_at_ms or 0
        # taken after the call (those taken before it were not ahead of it then)
        before = [jid for jid, started in order[: position[job_id]] if started >= asked_at]
        later = sum(1 for jid in before if jid in out.sent and out.sent[jid].enqueued_ms > asked_at)
        diff = len(before) - later - sent.said_ahead
        diffs.append(abs(diff))
        later_total += later
        near += abs(diff) <= 1
        exact += diff == 0
    unestimated = sum(1 for s in out.sent.values() if s.expected_ms is None and not s.warm)
    return {
        "scenario": out.scenario,
        **_figures(out, measured),
        "after_change": _figures(out, after) if after else None,
        "unestimated": unestimated,
        "asked": asked,
        "place_exact": exact / asked if asked else None,
        "place_within_1": near / asked if asked else None,
        "place_off_p90": pct(diffs, 0.9),
        "later_arrivals_mean": later_total / asked if asked else None,
        "refused": dict(out.refused),
        "admitted_wait_p99_ms": {flow: pct(w, 0.99) for flow, w in sorted(by_flow.items())},
        "signed_rel_p50": {flow: pct(e, 0.5) for flow, e in sorted(signed.items())},
    }


def measure_capacity(worker: NodeWorker, seconds: float) -> float:
    """Jobs the worker finished per second over the last ``seconds`` of a backlog, or
    since its first job finished when that was later (a worker slow to start on a loaded
    machine would otherwise count its start-up as idle capacity)."""
    now = _now_ms()
    finished = sorted(r["f"] for r in worker.records if r.get("f"))
    done = [f for f in finished if f >= now - seconds * 1000]
    if len(done) < 2:
        return 1.0
    span_s = max(0.5, (now - max(done[0], now - seconds * 1000)) / 1000)
    return max(1.0, len(done) / span_s)


def drained_capacity(worker: NodeWorker) -> float:
    """Jobs per second the worker finished over the middle half of the calibration's
    backlog, once drained: the last seconds of the enqueues (``measure_capacity``) may
    catch a worker still starting on a loaded machine."""
    finished = sorted(r["f"] for r in worker.records if r.get("f"))
    if len(finished) < 8:
        return measure_capacity(worker, 3)
    low, high = finished[len(finished) // 4], finished[3 * len(finished) // 4]
    span_s = (high - low) / 1000
    return max(1.0, (len(finished) // 2) / span_s) if span_s > 0 else 1.0


def run_live(scenario: Scenario, args: argparse.Namespace, db: Any) -> dict[str, Any]:
    import os

    from fairqueue import conf

    prefix = f"fqeta-{uuid.uuid4().hex[:8]}"
    os.environ["FAIRQUEUE_PREFIX"] = prefix
    db.submit(conf.reload_settings).result()
    wargs = argparse.Namespace(
        concurrency=1, run_ms=args.run_ms, interval_ms=args.interval_ms, bound_ms=args.bound_ms
    )
    out = Outcome(scenario.name)
    with LOG.open("a") as log:
        loop = start_loop(prefix, wargs, log)
        worker = NodeWorker(prefix, wargs, log)
        try:
            if not wait_for_loop(prefix, loop):
                raise RuntimeError(f"the loop did not start; see {LOG}")
            nominal = 1000 / (args.run_ms + 1)
            db.submit(_plans, {}).result()
            db.submit(warm_up, nominal * 1.5, args.calibrate_s).result()
            while worker.process.poll() is None:  # the calibration's backlog drained
                if len(worker.seen) >= _warm_count(prefix):
                    break
                time.sleep(0.05)
            capacity = args.capacity or drained_capacity(worker)
            plans = {tenant: dict(fields) for tenant, fields in scenario.plans.items()}
            for fields in plans.values():
                if "rate_duration_ms" in fields:
                    fields["rate_max"] = max(1, round(RATED_SHARE * capacity))
            db.submit(_plans, plans).result()
            # the scenario's own mix, so the measured pace is its own (not in the figures)
            db.submit(
                produce, scenario, capacity, args.warmup_s, args.run_ms, out, True, 0.0
            ).result()
            seconds = args.seconds
            if scenario.changes_s():
                seconds = max(seconds, max(scenario.changes_s()) + AFTER_CHANGE_S)
            db.submit(produce, scenario, capacity, seconds, args.run_ms, out).result()
            # The load goes on (not in the figures) until the measured jobs have started:
            # an estimate assumes the flows backlogged now stay so, and a load that
            # stops lets the jobs far back start sooner.
            measured = {job_id for job_id, sent in out.sent.items() if not sent.warm}
            deadline = time.monotonic() + args.drain_s
            while time.monotonic() < deadline and not measured <= worker.seen:
                db.submit(
                    produce, scenario, capacity, 2.0, args.run_ms, out, True, seconds, True
                ).result()
        finally:
            worker.stop()
            loop.terminate()
            loop.wait(15)
    for record in worker.records:
        if str(record["id"]) in out.sent and record.get("a", 0) == 0:  # warm-up's too
            out.starts[str(record["id"])] = int(record["p"])
    if args.debug_history:
        _compare_history(prefix, worker.records)
    if args.dump is not None:
        _dump(args.dump / f"{scenario.name}.jsonl", out)
    delete_prefix(prefix)
    result = analyse(out)
    result["capacity"] = round(capacity, 1)
    return result


def _dump(path: Path, out: Outcome) -> None:
    """Every job sent (``warm``: the warm-up's and the drain's), one JSON line each: its
    flow, enqueue, expected start, range, confidence and actual start (ms), to see which
    term of an estimate is wrong."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as file:
        for job_id, sent in out.sent.items():
            row = {"id": job_id, **vars(sent), "started_ms": out.starts.get(job_id)}
            file.write(json.dumps(row) + "\n")


def _compare_history(prefix: str, records: list[dict[str, Any]]) -> None:
    """The history's starts per 10 s bucket and level against the worker's own."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    mine: Counter[tuple[int, str]] = Counter()
    for record in records:
        mine[(int(record["p"]) // 10_000 * 10, str(record["l"]))] += 1
    for start in sorted({b for b, _ in mine}):
        row = client.hgetall(f"{prefix}:bench:fq:hist:{start}")
        print(
            start,
            {lv: (int(row.get(f"s:{lv}", 0)), mine[(start, lv)]) for lv in LEVELS},
            file=sys.stderr,
        )
    client.close()


def _warm_count(prefix: str) -> int:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return int(client.get(f"{prefix}:bench:id") or 0)
    finally:
        client.close()


def run_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Redis time of the two scripts at ``--waiting`` waiting jobs (a private server)."""
    import redis

    from benchmarks.bench_release_scale import script_names, start_redis
    from fairqueue.broker import Broker, NewJob, SyncBroker
    from fairqueue.broker.scripts import plain_script
    from fairqueue.broker.status_reads import StatusReads
    from fairqueue.scheduling.levels import PriorityLevel

    process, url, _folder = start_redis()
    try:
        client = redis.Redis.from_url(url)
        wait_for_redis(client)
        broker = SyncBroker(Broker(url, "fqcost"))
        reads = StatusReads(broker.broker.conn)
        levels = list(PriorityLevel)
        flows = [(levels[i % 4], f"t{i}") for i in range(400)]
        ids: list[str] = []
        started = time.monotonic()
        for start in range(0, args.waiting, 250):
            level, tenant = flows[(start // 250) % len(flows)]
            count = min(250, args.waiting - start)
            added = broker.add_jobs("bench", [NewJob("x", {}, level, tenant=tenant)] * count)
            ids.append(added[random.randrange(count)].job_id)
        fill_s = time.monotonic() - started
        names = {
            plain_script("job_status").sha: "job_status",
            plain_script("estimate_start").sha: "estimate_start",
        }
        names.update({k: v for k, v in script_names().items() if k not in names})
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100000)
        client.slowlog_reset()
        for job_id in random.sample(ids, min(200, len(ids))):
            broker.run(reads.job_status, "bench", job_id)
        for level, tenant in random.sample(flows, 200):
            broker.run(
                reads.estimate, "bench", level=level, tenant=tenant, tenant_weight=1, count=1
            )
        times: dict[str, list[float]] = defaultdict(list)
        for entry in client.slowlog_get(100000):
            command = entry["command"]
            if isinstance(command, bytes):
                command = command.decode(errors="replace")
            parts = command.split()
            if len(parts) > 1 and parts[0].upper() == "EVALSHA" and parts[1] in names:
                times[names[parts[1]]].append(entry["duration"])
        waiting = client.zcard("fqcost:bench:prioritized")
        broker.close()
        return {
            "waiting": waiting,
            "fill_s": round(fill_s, 1),
            **{
                name: {
                    "calls": len(us),
                    "p50_us": statistics.median(us),
                    "p99_us": pct(us, 0.99),
                    "max_us": max(us),
                }
                for name, us in times.items()
                if name in ("job_status", "estimate_start")
            },
        }
    finally:
        process.terminate()
        process.wait(15)


def _fmt(value: Any, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}{suffix}"
    return f"{value}{suffix}"


def print_live(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'scenario':<17} {'C/s':>6} {'jobs':>5} {'wait p50':>9} {'err p50':>8} "
        f"{'rel p50':>8} {'rel p90':>8} {'within':>7} {'in range':>8} {'high':>5} "
        f"{'high p90':>8} | {'10 s after a change: jobs':>25} {'rel p50':>8} {'rel p90':>8} "
        f"{'in range':>8}"
    )
    for r in rows:
        after = r.get("after_change") or {}
        print(
            f"{r['scenario']:<17} {_fmt(r['capacity']):>6} {r['jobs']:>5} "
            f"{_fmt(r['wait_p50_ms'], 'ms'):>9} {_fmt(r['err_p50_ms'], 'ms'):>8} "
            f"{_fmt(r['rel_p50']):>8} {_fmt(r['rel_p90']):>8} {_fmt(r['within']):>7} "
            f"{_fmt(r['range_hit']):>8} {r['high_jobs']:>5} {_fmt(r['high_rel_p90']):>8} | "
            f"{_fmt(after.get('jobs')):>25} {_fmt(after.get('rel_p50')):>8} "
            f"{_fmt(after.get('rel_p90')):>8} {_fmt(after.get('range_hit')):>8}"
        )
    print(
        f"\n{'scenario':<13} {'place exact':>11} {'<=1':>6} {'off p90':>7} {'later':>6}  confidence"
    )
    for r in rows:
        print(
            f"{r['scenario']:<13} {_fmt(r['place_exact']):>11} {_fmt(r['place_within_1']):>6} "
            f"{_fmt(r['place_off_p90']):>7} {_fmt(r['later_arrivals_mean']):>6}  {r['confidence']}"
        )
    for r in rows:
        shown = {flow: round(v, 2) for flow, v in r["signed_rel_p50"].items()}
        print(f"{r['scenario']}: (expected - actual) / wait, median per flow: {shown}")
    for r in rows:
        if r["refused"] or r["scenario"] == "overload":
            print(
                f"{r['scenario']}: refused {r['refused'] or 'none'}; admitted wait p99 (ms) "
                f"{ {k: round(v) for k, v in r['admitted_wait_p99_ms'].items()} }"
            )


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    """``--compare``: the live scenarios with the other checkout and this one, side by
    side (:func:`benchmarks.common.side_by_side`), each row labelled."""
    from benchmarks.common import side_by_side

    names = [
        s.name
        for s in SCENARIOS
        if (s.name in args.only if args.only else not args.quick or s.quick)
    ]
    rows = []

    def capacity_of(path: Path) -> float | None:
        rows = json.loads(path.read_text()).get("live", [])
        return rows[0]["capacity"] if rows else None

    for label, _name, path in side_by_side(
        "bench_eta.py", args.compare, names, "--only", [*argv, "--skip-cost"], capacity_of
    ):
        for row in json.loads(path.read_text()).get("live", []):
            row["scenario"] = f"{row['scenario']} {label}"
            rows.append(row)
    print_live(rows)
    if args.json:
        args.json.write_text(json.dumps({"live": rows}, indent=2, default=str))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--calibrate-s", type=float, default=5.0)
    # longer than the estimate's rate window (20-30 s), so it measures the scenario's pace
    parser.add_argument("--warmup-s", type=float, default=30.0)
    parser.add_argument("--drain-s", type=float, default=90.0)
    parser.add_argument("--run-ms", type=int, default=10)
    parser.add_argument("--interval-ms", type=int, default=250)
    parser.add_argument("--bound-ms", type=int, default=5000)
    parser.add_argument("--waiting", type=int, default=1_000_000)
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--debug-history", action="store_true")
    parser.add_argument("--skip-live", action="store_true")
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
        help="another checkout (the code before a change): each scenario run with it, "
        "then with this one, alternating, in one table",
    )
    parser.add_argument(
        "--dump", type=Path, default=None, help="a folder: every measured job per scenario"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: the scenarios marked quick, shorter phases, no cost part",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup_s, args.calibrate_s = 8.0, 12.0, 5.0
        args.drain_s, args.skip_cost = 30.0, True
    OUT.mkdir(parents=True, exist_ok=True)
    if args.compare is not None:
        return compare(args, list(argv if argv is not None else sys.argv[1:]))
    results: dict[str, Any] = {}
    if not args.skip_live:
        db = setup_django()
        rows = []
        for scenario in SCENARIOS:
            if args.only and scenario.name not in args.only:
                continue
            if args.quick and not args.only and not scenario.quick:
                continue
            row = run_live(scenario, args, db)
            rows.append(row)
            print(f"... {scenario.name} done", file=sys.stderr)
        print_live(rows)
        results["live"] = rows
    if not args.skip_cost:
        if args.skip_live:
            setup_django()
        cost = run_cost(args)
        print(
            f"\nat {cost['waiting']:,} waiting (filled in {cost['fill_s']} s), Redis time per call:"
        )
        for name in ("job_status", "estimate_start"):
            if name in cost:
                c = cost[name]
                print(
                    f"  {name:<15} p50 {c['p50_us']} us  p99 {c['p99_us']} us  max {c['max_us']} us"
                    f"  ({c['calls']} calls)"
                )
        results["cost"] = cost
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
