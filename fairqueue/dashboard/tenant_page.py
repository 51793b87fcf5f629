"""The tenant page: "why is tenant X slow?" from one place, and what to do about it.

For one tenant: its plan tier and the level its jobs resolve to (the classifier
included), weight, limits and pause; per queue its waiting jobs by level (from the same
backlog scan as the queue page, so both show one number), held, running and recently
failed jobs, its next jobs' positions in line, and how many of its level's jobs it
started over 5, 15 and 60 minutes. Its views and actions: :mod:`.tenant_views`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from fairqueue.broker import (
    FAILED_WINDOW,
    ORDER_WINDOW,
    BacklogScan,
    Broker,
    TenantJobs,
    get_sync_broker,
)
from fairqueue.conf import get_settings
from fairqueue.dashboard.charts import format_ms
from fairqueue.dashboard.culprits import Finding, TenantFacts, verdict
from fairqueue.dashboard.expected import describe, tenant_expected_start
from fairqueue.dashboard.failures import FailureGroup, QueueFailures, queue_failures
from fairqueue.dashboard.limited_tenants import rate_window
from fairqueue.dashboard.moment import moment, read_checked_backlog
from fairqueue.dashboard.overview import anoisy_figures
from fairqueue.dashboard.wording import format_duration, format_time, tenant_words
from fairqueue.enqueue.status import ajob_status
from fairqueue.plans import priority_from_plan
from fairqueue.scheduling.attempts import TENANT_BUCKET_S
from fairqueue.scheduling.estimate import StartEstimate
from fairqueue.scheduling.levels import LEVELS_BY_RANK
from fairqueue.scheduling.limits import TenantLimits
from fairqueue.scheduling.shares import LEVEL_NAMES, parse_bucket, tenant_window
from fairqueue.scheduling.wire import decoded_limits

#: The windows the tenant page sums its started jobs over, in minutes.
WINDOWS_MIN: Final = (5, 15, 60)
#: The window (minutes) a tenant's verdict reads its p99 and failures over.
VERDICT_MIN: Final = 15
#: Tenant ids a prefix search lists at most.
SEARCH_LIMIT: Final = 50


@dataclass(frozen=True, slots=True)
class EffectiveLevel:
    """The level a tenant's jobs resolve to by its plan, and why."""

    level: str
    tier: str | None
    why: str


@dataclass(frozen=True, slots=True)
class NextJob:
    """One of its next jobs in line: its position, id and wait so far."""

    position: int
    job_id: str
    waited: str


@dataclass(frozen=True, slots=True)
class FailedRow:
    """One of its recent failures as the page lists it."""

    job_id: str
    at: str
    attempts: int
    error_class: str
    message: str


@dataclass(frozen=True, slots=True)
class WeightRow:
    """The weight its flow of ``level`` counts in Redis now, beside the level's total."""

    level: str
    weight: float
    total: float


@dataclass(frozen=True, slots=True)
class EntitledShare:
    """What it is entitled to now in ``level``, as a percentage."""

    level: str
    share: str


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """What the tenant page shows of the tenant in one queue. ``backlog``, ``counts``,
    ``started`` and ``waits`` keep the shapes the queue page's stats use."""

    job_type: str
    queue: str
    counts: Mapping[str, int]
    waiting: Mapping[str, int | None]
    waiting_total: int | None
    backlog: Mapping[str, Any]
    held: int
    held_ids: Sequence[str]
    running: int
    running_ids: Sequence[str]
    paused: bool
    limits_in_redis: TenantLimits
    next_jobs: tuple[NextJob, ...]
    in_window: int
    order_read: int
    order_window: int
    failed: tuple[FailedRow, ...]
    failed_count: int
    failed_read: int
    failed_window: int
    failure_groups: tuple[FailureGroup, ...]
    started: tuple[Mapping[str, Any], ...]
    waits: tuple[Mapping[str, Any], ...]
    weights: tuple[WeightRow, ...]
    next_run: str
    show_in_line: bool
    verdict: tuple[Finding, ...]
    overdue: int | None
    new_job_start: str
    entitled: Mapping[str, float | None]
    entitled_shown: tuple[EntitledShare, ...]


def effective_level(plan: Any) -> EffectiveLevel:
    """The level ``plan``'s jobs get when enqueued without an explicit level (a
    ``TenantPlan`` or ``None``): its tier, else its account's, else the classifier's tier for its
    subscription, mapped to a level; normal when plans are switched off."""
    if not get_settings().priority_enabled:
        return EffectiveLevel("normal", None, "plans are switched off (JOB_PRIORITY_ENABLED)")
    if plan is None:
        return EffectiveLevel("normal", None, "no plan row: the default level")
    tier = plan.resolve_plan()
    if plan.plan_tier:
        source = "its plan tier"
    elif plan.account_id is not None and plan.account.plan_tier:
        source = "its account's tier"
    else:
        source = "the classifier, from its subscription"
    return EffectiveLevel(priority_from_plan(tier).value, tier, f"{tier}, by {source}")


async def atenant_queue(
    broker: Broker, job_type: str, tenant_id: str, *, now_ms: int
) -> dict[str, Any]:
    """What the tenant page shows of ``tenant_id`` in ``job_type``'s queue."""
    settings = get_settings()
    queue = settings.queue_for(job_type)
    counts = await broker.passes.counts(queue)
    scan, backlog = await read_checked_backlog(
        broker, queue, counts, now_ms=now_ms, max_wait_ms=settings.max_wait_ms
    )
    reads = broker.console
    window_s = max(WINDOWS_MIN) * 60
    now_s = now_ms // 1000
    jobs, recorded, mine, weights, noisy, failures = await asyncio.gather(
        reads.tenant_jobs(queue, tenant_id),
        broker.history.read_history(queue, now_s=now_s, window_s=window_s),
        broker.history.read_tenant_history(queue, tenant_id, now_s=now_s, window_s=window_s),
        reads.tenant_weights(queue, tenant_id),
        anoisy_figures(job_type, broker=broker),
        queue_failures(broker, queue, now_ms=now_ms, minutes=VERDICT_MIN),
    )
    next_estimate = None
    if jobs.next_jobs and not jobs.paused:
        status = await ajob_status(job_type, jobs.next_jobs[0][1].job_id)
        next_estimate = None if status is None or status.state != "waiting" else status.estimate
    waiting = {
        level.value: (None if scan is None else scan.tenants.get(level.value, {}).get(tenant_id, 0))
        for level in LEVELS_BY_RANK
    }
    buckets = [parse_bucket(start, f, t) for start, (f, t) in recorded.buckets.items()]
    waiting_total = None if scan is None else sum(v or 0 for v in waiting.values())
    started, waits = _windows(mine, buckets, now_s=now_s)
    facts = _facts(tenant_id, scan, waiting_total, waits, jobs, noisy, failures)
    return {
        "facts": facts,
        "failure_groups": tuple(g for g in failures.groups if tenant_words(tenant_id) in g.tenants),
        "job_type": job_type,
        "queue": queue,
        "counts": counts,
        "waiting": waiting,
        "waiting_total": waiting_total,
        "backlog": backlog,
        **_jobs(jobs, now_ms=now_ms),
        "started": started,
        "waits": waits,
        # the weight its flows count in Redis now, beside their level's total
        "weights": tuple(
            WeightRow(level=level, weight=weight, total=total)
            for level, (weight, total) in weights.items()
        ),
        "next_run": _next_run(jobs, waiting=waiting_total, estimate=next_estimate),
        # its jobs in line, only when the scan does not say it has none (one moment)
        "show_in_line": bool(jobs.next_jobs) and waiting_total != 0,
    }


def _facts(
    tenant_id: str,
    scan: BacklogScan | None,
    waiting_total: int | None,
    waits: list[dict[str, Any]],
    jobs: TenantJobs,
    noisy: dict[str, Any],
    failures: QueueFailures,
) -> TenantFacts:
    """The figures its verdict is made of, from the reads the page shows (its quota and
    breaker holds are added from the database after)."""
    limits = decoded_limits(jobs.limits_encoded, paused=jobs.paused)
    return TenantFacts(
        overdue=None if scan is None else scan.overdue_of(tenant_id),
        queue_overdue=None if scan is None else sum(f.overdue for f in scan.levels.values()),
        waiting=waiting_total,
        max_wait_ms=get_settings().max_wait_ms,
        p99_ms=next((w["p99_ms"] for w in waits if w["minutes"] == VERDICT_MIN), None),
        p99_minutes=VERDICT_MIN,
        noisy=next((n for n in noisy["tenants"] if n["tenant"] == tenant_id), None),
        paused=jobs.paused,
        held=jobs.held,
        running=jobs.running,
        max_active=limits.max_active,
        rate=(
            None
            if limits.rate_max is None
            else f"{limits.rate_max} per {rate_window(limits.rate_duration_ms)}"
        ),
        holds=(),
        failing=next(
            (
                {"text": t.text, "failed": t.failed, "attempts": t.attempts}
                for t in failures.failing
                if t.tenant == tenant_id
            ),
            None,
        ),
    )


def _jobs(jobs: TenantJobs, *, now_ms: int) -> dict[str, Any]:
    limits = decoded_limits(jobs.limits_encoded, paused=jobs.paused)
    return {
        "held": jobs.held,
        "held_ids": jobs.held_ids,
        "running": jobs.running,
        "running_ids": jobs.running_ids,
        "paused": jobs.paused,
        "limits_in_redis": limits,
        "next_jobs": tuple(
            NextJob(
                position=position,
                job_id=job.job_id,
                waited=format_duration(
                    None if job.ready_ms is None else max(0, now_ms - job.ready_ms)
                ),
            )
            for position, job in jobs.next_jobs
        ),
        "in_window": jobs.in_window,
        "order_read": jobs.order_read,
        "order_window": ORDER_WINDOW,
        "failed": tuple(
            FailedRow(
                job_id=f.job_id,
                at=format_time(f.failed_at_ms),
                attempts=f.attempts_made,
                error_class=f.error_class or "—",
                message=f.message or "—",
            )
            for f in jobs.failed[:20]
        ),
        "failed_count": jobs.failed_count,
        "failed_read": jobs.failed_read,
        "failed_window": FAILED_WINDOW,
    }


def _windows(
    mine: dict[int, dict[str, str]], buckets: list[Any], *, now_s: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per window, from its own per-minute counts (every attempt, whatever the number of
    tenants): the attempts it started and its share of each level's starts; its wait
    p50/p99 (from its own wait histogram, within one bin: about 19%) and per level its
    share of the level's worker time (``worker_share``: the text
    :func:`with_entitlement` completes)."""
    started, waits = [], []
    for minutes in WINDOWS_MIN:
        row = tenant_window(mine, buckets, now_s=now_s, minutes=minutes, bucket_s=TENANT_BUCKET_S)
        shares = [
            f"{100 * level_started['share']:.0f}% of {level}'s {level_started['level_count']}"
            for level, level_started in row["started"].items()
            if level_started["share"] is not None
        ]
        started.append(
            {
                "minutes": minutes,
                "started": sum(level["count"] for level in row["started"].values()),
                "share": "; ".join(shares) or "—",
            }
        )
        waits.append(
            {
                "minutes": minutes,
                "waits": row["waits"],
                "p50_ms": row["p50_ms"],
                "p99_ms": row["p99_ms"],
                "p50": format_ms(row["p50_ms"]),
                "p99": format_ms(row["p99_ms"]),
                "worker": row["worker"],
                "worker_share": _worker_share(row["worker"], {}),
            }
        )
    return started, waits


def _worker_share(worker: dict[str, Any], entitled: dict[str, float | None]) -> str:
    shares = []
    for level, used in worker.items():
        if used["share"] is None:
            continue
        text = f"{level}: {100 * used['share']:.0f}% of {format_ms(used['level_ms'])}"
        if entitled.get(level) is not None:
            text += f" (entitled {100 * (entitled[level] or 0):.0f}% now)"
        shares.append(text)
    return "; ".join(shares) or "—"


def _entitled(job_type: str, tenant_id: str, level: str) -> float | None:
    """Its max-min share of ``level`` now, as its start estimate there counts it."""
    try:
        return tenant_expected_start(job_type, tenant_id, level).level_share
    except ValueError:  # a level its plan does not let it use
        return None


def with_entitlement(found: dict[str, Any], entitled: dict[str, float | None]) -> None:
    """Its waits' rows with what it is entitled to now in each level (``entitled``: level ->
    its max-min share of the level given who is asking, the estimate's
    ``level_share``, :func:`fairqueue.scheduling.pace.current_shares`): the same figure
    the start estimates use, not its weight over the level's counted weights."""
    found["entitled"] = entitled
    found["entitled_shown"] = tuple(
        EntitledShare(level=level, share=f"{100 * share:.0f}%")
        for level in LEVEL_NAMES
        if (share := entitled.get(level)) is not None
    )
    for row in found["waits"]:
        row["worker_share"] = _worker_share(row["worker"], entitled)


def _next_run(jobs: TenantJobs, *, waiting: int | None, estimate: StartEstimate | None) -> str:
    """When its next job is likely to start: its place in line and the estimate
    :func:`fairqueue.job_status` gives that job, the figure its job page shows (a rate of
    all starts ignores its share and its level's). With no job waiting (the scan's count,
    the one the page shows) it says so, whatever the order read a moment apart found."""
    if jobs.paused:
        return "not while it is paused"
    if waiting == 0 or not jobs.next_jobs:
        if jobs.held:
            return "when its limit gives it room (its jobs are held)"
        if waiting == 0:
            return "it has no job waiting"
        if jobs.order_read >= ORDER_WINDOW:
            return f"not among the first {ORDER_WINDOW} jobs in line"
        return "it has no job waiting"
    position = jobs.next_jobs[0][0]
    if estimate is None:  # it started or left between the two reads
        return f"position {position} in line"
    return f"position {position} in line: {describe(estimate)}"


@dataclass(frozen=True, slots=True)
class TenantData:
    """What Redis holds of a tenant, read at one moment: one entry per queue (its
    counts, findings, jobs, waits and shares, as :func:`atenant_queue` reads them)."""

    read_at: Mapping[str, Any]
    queues: tuple[TenantQueue, ...]


def tenant_page_data(tenant_id: str) -> TenantData:
    """Everything the tenant page shows of ``tenant_id`` (sync callers).

    Raises:
        BrokerError: Redis failed.
    """
    sync = get_sync_broker()
    now_ms = int(time.time() * 1000)

    async def read_all() -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(
                *(
                    atenant_queue(sync.broker, job_type, tenant_id, now_ms=now_ms)
                    for job_type in get_settings().queues
                )
            )
        )

    holds = _db_holds(tenant_id)
    shown = []
    for found in sync.run(read_all):
        facts = replace(found.pop("facts"), holds=holds.get(found["job_type"], ()))
        found["verdict"] = verdict(facts)
        found["overdue"] = facts.overdue
        # where a job of the tenant enqueued now would be placed, and when it would start
        new_job = tenant_expected_start(found["job_type"], tenant_id)
        found["new_job_start"] = new_job.text
        levels = {level for row in found["waits"] for level in row["worker"]}
        levels |= {w.level for w in found["weights"]}
        # its plan's level too: a paused or held tenant has no flow counted, yet a share
        levels |= {new_job.level} if new_job.level else set()
        with_entitlement(
            found, {level: _entitled(found["job_type"], tenant_id, level) for level in levels}
        )
        found["started"] = tuple(found["started"])
        found["waits"] = tuple(found["waits"])
        shown.append(TenantQueue(**found))
    return TenantData(read_at=moment(now_ms), queues=tuple(shown))


def _db_holds(tenant_id: str) -> dict[str, tuple[tuple[str, str], ...]]:
    """Its open quota and breaker holds per job type (``""``: every type), in words."""
    from fairqueue.models.usage_models import TenantHold

    found: dict[str, list[tuple[str, str]]] = {}
    rows = TenantHold.objects.filter(tenant_id=tenant_id, lifted_at__isnull=True)
    for hold in rows:
        if hold.reason == TenantHold.BREAKER:
            text = (
                f"The breaker holds its {hold.job_type} jobs since "
                f"{hold.created_at:%Y-%m-%d %H:%M:%S} UTC: nearly all of them failed "
                f"({hold.state}); a probe job closes it when it completes."
            )
        else:
            until = f" until {hold.until:%Y-%m-%d %H:%M:%S} UTC" if hold.until else ""
            done = "held" if hold.action == TenantHold.HOLD else "demoted to a lower level"
            text = f"Over its quota: its jobs are {done}{until}."
        for job_type in [hold.job_type] if hold.job_type else list(get_settings().queues):
            found.setdefault(job_type, []).append((hold.reason, text))
    return {job_type: tuple(items) for job_type, items in found.items()}
