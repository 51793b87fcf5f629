"""Where a job is and when it will start (``job_status``), and the estimate of a new
job from what its read found (``estimate_from``, which :mod:`.start_estimates` calls):
one read-only Redis script each, the arithmetic in :mod:`fairqueue.scheduling.estimate`
(docs/design.md, "When a job will start")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from fairqueue.broker import (
    MAX_JOB_ID_LENGTH,
    Placement,
    RawEstimate,
    RawStatus,
    StatusReads,
    get_broker,
    get_sync_broker,
)
from fairqueue.conf import get_settings
from fairqueue.exceptions import InvalidJobOptionError
from fairqueue.scheduling import estimate as eta
from fairqueue.scheduling import pace
from fairqueue.scheduling.estimate import StartEstimate
from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, PriorityLevel
from fairqueue.scheduling.limits import REASON_MAX_ACTIVE, REASON_PAUSED, REASON_RATE
from fairqueue.scheduling.order import flow_step
from fairqueue.scheduling.shares import BUCKET_S

#: A tenant's account as the lookups give it: ``(account id, account weight)``.
TenantAccount = tuple[str, float]

#: The states ``job_status`` reports.
JOB_STATUS_STATES: Final = (
    "waiting",
    "held",
    "delayed",
    "active",
    "completed",
    "failed",
    "unknown",
)


@dataclass(frozen=True, slots=True)
class JobStatus:
    """Where a job is: its ``state`` (one of :data:`JOB_STATUS_STATES`), why it is held
    (``held_reason``), the jobs BullMQ pops before it (``ahead``; a held job: its
    tenant's held jobs before it) and when it is expected to start (``estimate``),
    or when it started and finished."""

    job_id: str
    job_type: str
    state: str
    estimate: StartEstimate
    held_reason: str | None = None
    started_ms: int | None = None
    finished_ms: int | None = None

    @property
    def ahead(self) -> int | None:
        return self.estimate.ahead

    @property
    def expected_start_ms(self) -> int | None:
        return self.estimate.expected_start_ms

    def public(self) -> dict[str, Any]:
        """What the status endpoint shows: no payload, no tenant, no other job."""
        est = self.estimate
        return {
            "state": self.state,
            "held_reason": self.held_reason,
            "ahead": est.ahead,
            "expected_start_ms": est.expected_start_ms,
            "earliest_start_ms": est.earliest_start_ms,
            "latest_start_ms": est.latest_start_ms,
            "confidence": est.confidence,
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
        }


def status_reader() -> StatusReads:
    return StatusReads(get_broker().conn, fairness_by=get_settings().fairness_by)


def _rate(raw: RawEstimate | RawStatus, typical_ms: float | None) -> eta.ServiceRate:
    history = raw.history
    return eta.service_rate(
        history.buckets,
        now_ms=raw.now_ms,
        since_ms=history.since_ms,
        bucket_s=BUCKET_S,
        typical_ms=typical_ms if typical_ms is not None else history.typical_ms,
        by_time=get_settings().fairness_by == "time",
    )


def _as_estimate(
    wait: eta.Wait,
    now_ms: int,
    *,
    ahead: int | None,
    reason: str | None = None,
    share: float | None = None,
    level: str | None = None,
    tag: float | None = None,
    offset_ms: int = 0,
    level_share: float | None = None,
) -> StartEstimate:
    def at(seconds: float | None) -> int | None:
        return None if seconds is None else now_ms + offset_ms + math.ceil(seconds * 1000)

    return StartEstimate(
        expected_wait_ms=None
        if wait.expected_s is None
        else offset_ms + math.ceil(wait.expected_s * 1000),
        expected_start_ms=at(wait.expected_s),
        earliest_start_ms=at(wait.low_s),
        latest_start_ms=at(wait.high_s),
        confidence=wait.confidence,
        ahead=ahead,
        held_reason=reason,
        share=share,
        level=level,
        tag=tag,
        level_share=level_share,
        admission_wait_ms=None
        if wait.admission_s is None
        else offset_ms + math.ceil(wait.admission_s * 1000),
    )


@dataclass(frozen=True, slots=True)
class _Pace:
    """What who is asking now gives a flow: its turns per second once it asks
    (``flow_per_s``: jobs, or with fairness by time worker time over the typical run,
    as the distances between tags count them), that as a share of all starts, and its
    tenant's starts per second lately (every level: the pace its held jobs are released
    at)."""

    flow_per_s: float | None = None
    share: float | None = None
    tenant_per_s: float | None = None
    level_share: float | None = None


def _pace(
    raw: RawEstimate | RawStatus,
    rate: eta.ServiceRate,
    *,
    level: PriorityLevel,
    tenant: str | None,
    tenant_weight: float,
    vt: float,
    account: TenantAccount | None = None,
    accounts: Mapping[str, TenantAccount] | None = None,
) -> _Pace:
    asking = raw.asking
    if asking is None or tenant is None or not rate.known or rate.window_s <= 0:
        return _Pace()
    flows = pace.flows_asking(
        asking, vt=vt, window_s=rate.window_s, level_served=rate.level_starts, accounts=accounts
    )
    share = pace.share_of(
        rate.jobs_per_s, flows, level.value, tenant, weight=tenant_weight, account=account
    )
    of_level = pace.share_of(
        rate.jobs_per_s,
        flows,
        level.value,
        tenant,
        weight=tenant_weight,
        of_level=True,
        account=account,
    )
    mine = sum(count for (_, name), count in asking.served.items() if name == tenant)
    # in turns (jobs, or with fairness by time worker time over the typical run): what
    # the distances between tags count
    turns_per_s = rate.turns_per_s or rate.jobs_per_s
    return _Pace(
        flow_per_s=None if share is None else share * turns_per_s,
        share=share,
        tenant_per_s=mine / rate.window_s if mine else None,
        level_share=of_level,
    )


def level_share_of(
    raw: RawEstimate,
    level: PriorityLevel,
    tenant: str,
    w: float,
    accounts: Mapping[str, TenantAccount] | None = None,
) -> float | None:
    """``tenant``'s entitlement now in ``level`` at weight ``w`` (its estimate's ``level_share``)
    from any estimate read of its queue: who is asking does not depend on who asks.
    ``accounts``: tenant -> (account id, weight) for the tenants the read gives no
    account (its own among them)."""
    rate, vt = _rate(raw, raw.placement.typical_ms), raw.placement.flow.vt
    account = (accounts or {}).get(tenant)
    return _pace(
        raw,
        rate,
        level=level,
        tenant=tenant,
        tenant_weight=w,
        vt=vt,
        account=account,
        accounts=accounts,
    ).level_share


def account_level_share_of(
    raw: RawEstimate,
    level: PriorityLevel,
    account: TenantAccount,
    accounts: Mapping[str, TenantAccount] | None = None,
) -> float | None:
    """``account``'s entitlement now in ``level`` (``(account id, weight)``), its flows all
    asking: :func:`fairqueue.scheduling.pace.account_share_of` from any estimate read of
    its queue (``accounts`` as for :func:`level_share_of`); ``None``: nothing measured."""
    rate = _rate(raw, raw.placement.typical_ms)
    asking = raw.asking
    if asking is None or not rate.known or rate.window_s <= 0:
        return None
    flows = pace.flows_asking(
        asking,
        vt=raw.placement.flow.vt,
        window_s=rate.window_s,
        level_served=rate.level_starts,
        accounts=accounts,
    )
    return pace.account_share_of(rate.jobs_per_s, flows, level.value, account[0], account[1])


def _new_job_wait(
    raw: RawEstimate | RawStatus, p: Placement, rate: eta.ServiceRate, flow_pace: _Pace, count: int
) -> eta.Wait:
    """The wait of the ``count``-th new job placed at ``p``: its flow's turns before it
    (the distance from the virtual time to where the flow goes on, in its steps of one
    turn) at its flow's pace now."""
    flow = p.flow
    start = flow.vt if flow.last is None or flow.last <= flow.vt else flow.last
    # a turn's step: the tag distance one typical run of the flow moves it by
    step = (p.tag - start) / count / (flow.cost or 1.0) if p.score is not None else 0.0
    own = (start - flow.vt) / step + (count - 1) * (flow.cost or 1.0) if step > 0 else None
    return eta.placed_wait(
        tag=p.tag if p.score is not None else None,
        level=flow.level,
        vt=flow.vt,
        ahead=p.ahead,
        rate=rate,
        own_ahead=own,
        flow_per_s=flow_pace.flow_per_s,
    )


def estimate_from(
    raw: RawEstimate,
    *,
    delay_ms: int | None = None,
    tenant: str | None = None,
    count: int = 1,
    account: TenantAccount | None = None,
) -> StartEstimate:
    """The estimate of a new job from what ``lua/estimate_start.lua`` read (``tenant``:
    its tenant bucket, for its flow's pace, in ``account``; ``count``: the last of that
    many)."""
    p = raw.placement
    flow = p.flow
    rate = _rate(raw, p.typical_ms)
    flow_pace = _pace(
        raw,
        rate,
        level=flow.level,
        tenant=tenant,
        tenant_weight=flow.tenant_weight,
        vt=flow.vt,
        account=account,
    )
    wait = _new_job_wait(raw, p, rate, flow_pace, count)
    hold = raw.hold
    reason = None
    if hold.limits.holds or hold.paused:
        reason = eta.held_reason(
            hold.limits, paused=hold.paused, held_ahead=hold.held, occupied=hold.occupied
        )
        run_s = None if p.typical_ms is None else p.typical_ms / 1000
        delay = eta.held_delay_s(
            hold.limits,
            reason=reason,
            held_ahead=hold.held,
            occupied=hold.occupied,
            run_s=run_s,
            tenant_per_s=flow_pace.tenant_per_s,
        )
        wait = eta.with_delay(wait, delay)
    share = flow_pace.share
    if share is None:
        level_share = max(1, flow.total - flow.counted + flow.tenant_weight)
        share = eta.flow_share(
            level=flow.level, tenant_weight=flow.tenant_weight, level_share=level_share, rate=rate
        )
    return _as_estimate(
        wait,
        raw.now_ms,
        ahead=p.ahead,
        reason=reason,
        share=share,
        level=flow.level.value,
        tag=p.tag if p.score is not None else None,
        offset_ms=delay_ms or 0,
        level_share=flow_pace.level_share,
    )


def _waiting_wait(raw: RawStatus, rate: eta.ServiceRate) -> tuple[eta.Wait, _Pace]:
    """A waiting job's wait and its flow's share: its flow's jobs before it (the distance
    from the virtual time to its tag, in its flow's steps now) at its flow's pace."""
    own = None
    flow_pace = _Pace()
    level, vt = raw.level, raw.vt or 0.0
    if raw.tag is not None and level is not None and raw.asking is not None:
        weight = raw.tenant_weight or 1.0
        total = max(raw.asking.totals.get(level.value, 0.0), weight)
        step = flow_step(DEFAULT_FAIR_WEIGHTS[level], 1, 1) * total / weight
        grouped = raw.asking.accounts.get((level.value, raw.tenant or ""))
        if grouped is not None:  # its account's part, split among the account's flows
            step *= max(grouped[2], weight) / grouped[1]
        own = max(0.0, (raw.tag - vt) / step - 1)
        flow_pace = _pace(
            raw,
            rate,
            level=level,
            tenant=raw.tenant,
            tenant_weight=weight,
            vt=vt,
            account=raw.account,
        )
    wait = eta.placed_wait(
        tag=raw.tag,
        level=level,
        vt=vt,
        ahead=raw.ahead or 0,
        rate=rate,
        own_ahead=own,
        flow_per_s=flow_pace.flow_per_s,
    )
    return wait, flow_pace


def _held_status(raw: RawStatus, job_type: str, job_id: str) -> JobStatus:
    """A held job's status: the time until its tenant's release pace reaches it, then its
    flow's place."""
    state = raw.state
    level = raw.level.value if raw.level is not None else None
    none = eta.Wait(None, None, None, "none")
    hold = raw.hold
    if hold is None or raw.placement is None:  # the queue is paused, or no level known
        est = _as_estimate(none, raw.now_ms, ahead=raw.ahead, reason=REASON_PAUSED)
        return JobStatus(job_id, job_type, state, est, held_reason=REASON_PAUSED)
    held_ahead = raw.ahead or 0
    reason = eta.held_reason(
        hold.limits, paused=hold.paused, held_ahead=held_ahead, occupied=hold.occupied
    )
    if reason is None:  # room now: released at the next release step
        if hold.limits.max_active is not None:
            reason = REASON_MAX_ACTIVE
        elif hold.limits.rate_max is not None:
            reason = REASON_RATE
        else:
            reason = REASON_PAUSED if hold.catching_up else None
    p = raw.placement
    rate = _rate(raw, p.typical_ms)
    flow_pace = _pace(
        raw,
        rate,
        level=p.flow.level,
        tenant=raw.tenant,
        tenant_weight=p.flow.tenant_weight,
        vt=p.flow.vt,
        account=raw.account,
    )
    wait = _new_job_wait(raw, p, rate, flow_pace, 1)
    run_s = None if p.typical_ms is None else p.typical_ms / 1000
    delay = eta.held_delay_s(
        hold.limits,
        reason=eta.held_reason(
            hold.limits, paused=hold.paused, held_ahead=held_ahead, occupied=hold.occupied
        ),
        held_ahead=held_ahead,
        occupied=hold.occupied,
        run_s=run_s,
        tenant_per_s=flow_pace.tenant_per_s,
    )
    est = _as_estimate(
        eta.with_delay(wait, delay),
        raw.now_ms,
        ahead=raw.ahead,
        reason=reason,
        level=level,
        share=flow_pace.share,
        level_share=flow_pace.level_share,
    )
    return JobStatus(job_id, job_type, state, est, held_reason=reason)


def status_from(raw: RawStatus, job_type: str, job_id: str) -> JobStatus:
    """A job's status from what ``lua/job_status.lua`` read."""
    state = raw.state
    level = raw.level.value if raw.level is not None else None
    none = eta.Wait(None, None, None, "none")
    if state == "waiting":
        rate = _rate(raw, None)
        wait, flow_pace = _waiting_wait(raw, rate)
        est = _as_estimate(
            wait,
            raw.now_ms,
            ahead=raw.ahead,
            level=level,
            tag=raw.tag,
            share=flow_pace.share,
            level_share=flow_pace.level_share,
        )
        return JobStatus(job_id, job_type, state, est)
    if state == "held":
        return _held_status(raw, job_type, job_id)
    if state == "delayed" and raw.due_ms is not None:
        ahead = None
        wait = eta.Wait(max(0.0, (raw.due_ms - raw.now_ms) / 1000), None, None, "medium")
        est = _as_estimate(wait, raw.now_ms, ahead=ahead, level=level)
        est = StartEstimate(
            est.expected_wait_ms,
            est.expected_start_ms,
            est.expected_start_ms,
            None,
            "medium",
            None,
            level=level,
        )
        return JobStatus(job_id, job_type, state, est)
    started = raw.processed_on_ms
    if state in ("active", "completed", "failed"):
        est = StartEstimate(0, started, started, started, "high", 0, level=level)
        return JobStatus(
            job_id, job_type, state, est, started_ms=started, finished_ms=raw.finished_on_ms
        )
    est = _as_estimate(none, raw.now_ms, ahead=raw.ahead, level=level)
    return JobStatus(job_id, job_type, state, est)


def _check_job_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not job_id or len(job_id) > MAX_JOB_ID_LENGTH:
        raise InvalidJobOptionError(
            f"job_id={job_id!r}"[:300]
            + f" is not allowed: expected a non-empty string of at most {MAX_JOB_ID_LENGTH} "
            "characters (an EnqueuedJob's job_id)"
        )
    return job_id


async def _job_status(queue: str, job_type: str, job_id: str) -> JobStatus | None:
    raw = await status_reader().job_status(queue, job_id)
    return None if raw is None else status_from(raw, job_type, job_id)


def job_status(job_type: str, job_id: str) -> JobStatus | None:
    """Where job ``job_id`` of ``job_type`` is and when it is expected to start, or
    ``None`` when the queue has no such job (never added, or removed). One Redis round
    trip, read-only, O(log n) in the waiting jobs.

    Raises:
        UnknownJobTypeError, InvalidJobOptionError: bad input.
        BrokerUnavailableError, BrokerRejectedError: Redis trouble.
    """
    queue = get_settings().queue_for(job_type)
    job_id = _check_job_id(job_id)
    sync = get_sync_broker()
    return sync.run(_job_status, queue, job_type, job_id)


async def ajob_status(job_type: str, job_id: str) -> JobStatus | None:
    """:func:`job_status` for async views, awaited on the caller's event loop."""
    queue = get_settings().queue_for(job_type)
    return await _job_status(queue, job_type, _check_job_id(job_id))
