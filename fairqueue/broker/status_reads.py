"""Read-only: a job's state and place in line, and where a new job of a flow would be
placed, each in one script call (``lua/job_status.lua``, ``lua/estimate_start.lua``):
O(log n) in the prioritized and held sets. The history's buckets of the rate's window go
beside it, plain HMGETs and ZRANGEs sent at the same time: the scripts would only pass
them on, and a value a script reads costs it a conversion into Lua and one back out,
about a third of a status read's Redis time when the loop records a busy history.

What comes back is raw (the clock, the flow's state, the limits, the history); the
arithmetic that turns it into a time is :mod:`fairqueue.scheduling.estimate`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fairqueue.broker.common import SCORE_BASE, TAG_FLOOR, TAG_RESOLUTION, fair_key, limits_key
from fairqueue.broker.connection import BrokerPart, Connection
from fairqueue.broker.scripts import plain_script
from fairqueue.scheduling.calibration import ERROR_BINS, WAIT_SCALE_FIELD
from fairqueue.scheduling.estimate import RATE_WINDOW_S, FlowSnapshot, HistoryBucket
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.limits import TenantLimits
from fairqueue.scheduling.pace import AskingRead
from fairqueue.scheduling.shares import BUCKET_S, LEVEL_NAMES
from fairqueue.scheduling.wire import decoded_limits

#: History buckets read: the current one and those of the rate's window before it.
RATE_BUCKETS: Final = RATE_WINDOW_S // BUCKET_S + 1
#: A history bucket's fields an estimate reads (fq:hist:<start>, as the loop's history
#: step writes them): starts and worker ms per level, each level's estimate-error bins,
#: each level's sum of the waits they expected, the virtual time and its ms at the
#: bucket's first and last sample (``vt_sample.lua``).
HISTORY_FIELDS: Final = (
    *(f"s:{level}" for level in LEVEL_NAMES),
    *(f"t:{level}" for level in LEVEL_NAMES),
    *(f"e:{level}:{k}" for level in LEVEL_NAMES for k in range(ERROR_BINS)),
    *(f"e:{level}:{WAIT_SCALE_FIELD}" for level in LEVEL_NAMES),
    "vt0",
    "vt0ms",
    "vt1",
    "vt1ms",
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _float(value: Any) -> float | None:
    text = _text(value)
    return float(text) if text else None


def _whole(value: Any) -> int | None:
    number = _float(value)
    return None if number is None else int(number)


@dataclass(frozen=True, slots=True)
class History:
    """The history's buckets of the rate's window and when recording began."""

    since_ms: int | None
    buckets: tuple[HistoryBucket, ...]
    typical_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the add script would place a new job of a flow now (the last of ``count``):
    the model's inputs (``flow``), the tag and score, and the jobs with lower scores
    plus BullMQ's wait list (popped first)."""

    flow: FlowSnapshot
    fresh: bool
    base: float
    tag: float
    score: int | None
    ahead: int
    typical_ms: float | None


@dataclass(frozen=True, slots=True)
class TenantHold:
    """What holds a tenant in a queue: its limits, pause, held and occupied jobs."""

    limits: TenantLimits
    paused: bool
    catching_up: bool
    held: int
    occupied: int


@dataclass(frozen=True, slots=True)
class RawEstimate:
    """What ``lua/estimate_start.lua`` read. ``before``: the flow's jobs placed before
    the ``count`` asked for (its delayed jobs due by then and the extra jobs given; a held
    tenant's are in ``hold.held`` instead); ``placed``: the jobs placed in all (the
    placement is the last of them)."""

    now_ms: int
    placement: Placement
    hold: TenantHold
    history: History
    before: int = 0
    placed: int = 1
    #: Who is asking now (``fqEtaAsking``): the pace its flow really gets.
    asking: AskingRead | None = None


@dataclass(frozen=True, slots=True)
class RawStatus:
    """A job as ``lua/job_status.lua`` found it. ``state``: ``waiting``, ``held``,
    ``delayed``, ``active``, ``completed``, ``failed``, ``unknown`` (another BullMQ
    state, e.g. waiting for children); ``ahead``: jobs BullMQ pops before it (for a
    held job, its tenant's held jobs before it; ``None``: not known)."""

    now_ms: int
    state: str
    ahead: int | None
    level: PriorityLevel | None
    tag: float | None
    vt: float | None
    due_ms: int | None
    processed_on_ms: int | None
    finished_on_ms: int | None
    hold: TenantHold | None
    placement: Placement | None
    history: History
    #: Who is asking now (a waiting or held job's), its tenant and counted weight.
    asking: AskingRead | None = None
    tenant: str | None = None
    tenant_weight: float | None = None
    #: Its account and the account's weight (its flow's, or a held job's), if any.
    account: tuple[str, float] | None = None


def _placement(
    reply: Sequence[Any], level: PriorityLevel, tenant_weight: int, wait_len: int
) -> Placement:
    vt, base, fresh, last, counted, horizon, total, frontier, cost, tag, score, ahead, typ = reply[
        :13
    ]
    return Placement(
        flow=FlowSnapshot(
            level=level,
            tenant_weight=tenant_weight,
            vt=_float(vt) or 0.0,
            last=_float(last),
            counted=int(counted),
            horizon=_float(horizon),
            total=int(total),
            frontier=_float(frontier),
            cost=_float(cost) or 1.0,
            spacing=_whole(reply[15]),
            frontier_spacing=_float(reply[16]),
            **_account_fields(reply[17:27]),
        ),
        fresh=bool(int(fresh)),
        base=_float(base) or 0.0,
        tag=_float(tag) or 0.0,
        score=int(_text(score)) if _text(score) else None,
        ahead=int(ahead) + wait_len,
        typical_ms=_float(typ),
    )


def _account_fields(reply: Sequence[Any]) -> dict[str, Any]:
    """A placement's account part (``fqEtaReply``): none for a flow of no account."""
    if len(reply) < 10 or not _text(reply[0]):
        return {}
    weight, tenants, counted, spacing, horizon, inner, inner_split, frontier, densest = (
        _float(v) for v in reply[1:10]
    )
    return {
        "account": _text(reply[0]),
        "account_weight": int(weight or 1),
        "account_tenants": tenants or 0.0,
        "account_counted": 1.0 if counted is None else counted,
        "account_spacing": spacing,
        "account_horizon": horizon,
        "inner": None if inner is None or inner_split is None else (inner, inner_split),
        "inner_frontier": frontier,
        "inner_densest": densest,
    }


#: Where each part of a history bucket's row (``HISTORY_FIELDS``) starts.
_LEVELS: Final = len(LEVEL_NAMES)
_BINS_AT: Final = 2 * _LEVELS
_SCALES_AT: Final = _BINS_AT + _LEVELS * ERROR_BINS
_VT_AT: Final = _SCALES_AT + _LEVELS


def _count(value: Any, missing: int = 0) -> int:
    """A bucket field as read (``None``: not written)."""
    return missing if value is None else int(float(_text(value)))


def _bucket_starts(now_ms: int) -> list[int]:
    """The history buckets of the rate's window at ``now_ms``, newest first."""
    current = now_ms // 1000 // BUCKET_S * BUCKET_S
    return [current - b * BUCKET_S for b in range(RATE_BUCKETS)]


@dataclass(frozen=True, slots=True)
class _HistoryRead:
    """What :meth:`StatusReads._read_history` read: when recording began, and per
    bucket (``starts``, newest first) its ``HISTORY_FIELDS`` as HMGET gives them and its
    most served flows (member, starts)."""

    since: Any
    starts: Sequence[int]
    rows: Sequence[Sequence[Any]]
    served: Sequence[Sequence[tuple[Any, float]]]


def _history(read: _HistoryRead, typical_ms: float | None) -> History:
    since = _text(read.since) if read.since is not None else ""
    buckets = []
    for start, fields in zip(read.starts, read.rows, strict=True):
        row = [_count(v) for v in fields[:_SCALES_AT]]
        # -1: not recorded (a bucket written before the scale was)
        scales = [_count(v, -1) for v in fields[_SCALES_AT:_VT_AT]]
        vt0, vt0_ms, vt1, vt1_ms = (_count(v) for v in fields[_VT_AT:])
        bins = row[_BINS_AT:_SCALES_AT]
        buckets.append(
            HistoryBucket(
                start_s=start,
                starts=dict(zip(LEVEL_NAMES, row[:_LEVELS], strict=True)),
                worker_ms=dict(zip(LEVEL_NAMES, row[_LEVELS:_BINS_AT], strict=True)),
                errors={
                    name: tuple(bins[i * ERROR_BINS : (i + 1) * ERROR_BINS])
                    for i, name in enumerate(LEVEL_NAMES)
                },
                expected_ms={
                    name: scales[i] for i, name in enumerate(LEVEL_NAMES) if scales[i] >= 0
                },
                vt_first=(vt0_ms, float(vt0)) if vt0_ms else None,
                vt_last=(vt1_ms, float(vt1)) if vt1_ms else None,
            )
        )
    return History(int(float(since)) if since else None, tuple(buckets), typical_ms)


def _asking(reply: Sequence[Any], history: _HistoryRead) -> AskingRead | None:
    """``fqEtaAsking``'s reply, with the flows the history's buckets saw served
    (``None``: not read)."""
    if not reply:
        return None
    values = [_text(v) for v in reply]
    totals = {name: float(values[i]) for i, name in enumerate(LEVEL_NAMES)}
    at = len(LEVEL_NAMES)
    count = int(float(values[at]))
    at += 1
    ahead = []
    accounts: dict[tuple[str, str], tuple[str, float, float]] = {}
    for _ in range(count):
        member, last, weight, held, line, account, account_weight, mates = values[at : at + 8]
        at += 8
        level, _sep, tenant = member.partition("\n")
        waiting = int(float(line)) if line else -1
        if account:
            accounts[(level, tenant)] = (account, float(account_weight), float(mates))
        ahead.append(
            (
                level,
                tenant,
                float(last),
                float(weight or 0),
                held == "1",
                None if waiting < 0 else waiting,
            )
        )
    served: dict[tuple[str, str], int] = {}
    recent: dict[tuple[str, str], int] = {}
    recent_since_s = None
    for bucket, (start, pairs) in enumerate(zip(history.starts, history.served, strict=True)):
        if bucket <= 1:  # the current bucket and the one before it, newest first
            recent_since_s = start
        for member_text, started in pairs:
            level, _sep, tenant = _text(member_text).partition("\n")
            # whole starts, as a script's reply of the score would give them
            count = int(float(started))
            served[(level, tenant)] = served.get((level, tenant), 0) + count
            if bucket <= 1:
                recent[(level, tenant)] = recent.get((level, tenant), 0) + count
    return AskingRead(
        totals=totals,
        ahead=tuple(ahead),
        served=served,
        recent=recent,
        recent_since_s=recent_since_s,
        accounts=accounts,
    )


def _hold(reply: Sequence[Any]) -> TenantHold:
    encoded, paused, catchup, held, occupied = reply
    return TenantHold(
        limits=decoded_limits(_text(encoded) or None),
        paused=bool(int(paused)),
        catching_up=bool(int(catchup)),
        held=int(held),
        occupied=int(occupied),
    )


def _tag_of(score: int, base: float, delta: float | None, cursor: float | None) -> float:
    """The finish tag a fair score keeps (``fqStartOf`` without the turn taken off)."""
    units = score - TAG_FLOOR * SCORE_BASE
    tag = base + (units // 4) / TAG_RESOLUTION
    if cursor is not None and delta is not None and score <= cursor:
        tag += delta
    return tag


class StatusReads(BrokerPart):
    """Read-only status and estimate reads of one prefix's queues."""

    def __init__(self, conn: Connection, *, fairness_by: str = "time") -> None:
        super().__init__(conn)
        self.fairness_by = fairness_by

    def _keys(self, queue: str) -> list[str]:
        prefix = self.conn.prefix
        return [
            self.conn.key(queue, "prioritized"),
            self.conn.key(queue, "wait"),
            fair_key(prefix, queue, "state"),
            fair_key(prefix, queue, "flows"),
            fair_key(prefix, queue, "fweights"),
            limits_key(prefix, queue),
        ]

    async def _read_history(self, queue: str, starts: Sequence[int]) -> _HistoryRead:
        """The history's buckets ``starts`` (``HISTORY_FIELDS`` and their most served
        flows) and when recording began: one pipelined round trip of plain reads."""
        base = fair_key(self.conn.prefix, queue, "hist")
        async with self.conn.client().pipeline(transaction=False) as pipe:
            pipe.hget(base, "since")
            for start in starts:
                pipe.hmget(f"{base}:{start}", HISTORY_FIELDS)
                pipe.zrange(f"{base}:t:{start}", 0, -1, withscores=True)
            replies: list[Any] = await pipe.execute()
        return _HistoryRead(replies[0], starts, replies[1::2], replies[2::2])

    async def _with_history(self, queue: str, call: Awaitable[Any]) -> tuple[Any, _HistoryRead]:
        """A script's reply (its first value Redis's clock, ms) and the history's buckets
        of the rate's window then, read at the same time: the buckets by this host's
        clock, read again by Redis's in the rare call where the two fall in different
        buckets (at a bucket's edge, or a clock off), so what is read is what a read
        inside the script would have read."""
        starts = _bucket_starts(int(time.time() * 1000))
        reply, history = await self.conn.guard(
            asyncio.gather(call, self._read_history(queue, starts))
        )
        wanted = _bucket_starts(int(reply[0]))
        if wanted != starts:
            history = await self.conn.guard(self._read_history(queue, wanted))
        return reply, history

    async def estimate(
        self,
        queue: str,
        *,
        level: PriorityLevel,
        tenant: str,
        tenant_weight: int,
        cost_ms: int | None = None,
        count: int = 1,
        delay_ms: int | None = None,
        extra: int = 0,
        account: tuple[str, int] | None = None,
    ) -> RawEstimate:
        """Where ``count`` new jobs of (``level``, ``tenant``) would be placed now (the
        last of them), behind what will run ahead of them without being on the clock yet
        (the flow's delayed jobs due by ``delay_ms`` from now, and ``extra`` jobs the
        caller knows of), what holds the tenant, and the rate window's history;
        ``account``: the tenant's (account id, account weight), placed in it as the add
        script would (``None``: none, the tenant is an account of its own)."""
        script = self.conn.script(plain_script("estimate_start"))
        reply, read = await self._with_history(
            queue,
            script(
                keys=[
                    *self._keys(queue),
                    fair_key(self.conn.prefix, queue, "dly"),
                    self.conn.key(queue, "delayed"),
                ],
                level=level.value,
                tenant=tenant,
                weight=tenant_weight,
                cost="" if cost_ms is None else cost_ms,
                fairness=self.fairness_by,
                count=count,
                delay=delay_ms or 0,
                extra=extra,
                account="" if account is None else account[0],
                account_weight=1 if account is None else account[1],
            ),
        )
        now, wait_len, place, *hold, before, asking = reply
        placement = _placement(place, level, tenant_weight, int(wait_len))
        return RawEstimate(
            now_ms=int(now),
            placement=placement,
            hold=_hold(hold),
            history=_history(read, placement.typical_ms),
            before=int(before),
            placed=count + int(before),
            asking=_asking(asking, read),
        )

    async def job_status(self, queue: str, job_id: str) -> RawStatus | None:
        """``job_id``'s state in ``queue`` and what its estimate needs; ``None`` when
        ``queue`` has no such job."""
        script = self.conn.script(plain_script("job_status"))
        keys = [
            *self._keys(queue),
            *(self.conn.key(queue, name) for name in ("active", "delayed", "completed")),
            self.conn.key(queue, "failed"),
            self.conn.key(queue, "paused"),
            self.conn.key(queue, job_id),
        ]
        reply, read = await self._with_history(
            queue, script(keys=keys, id=job_id, fairness=self.fairness_by)
        )
        (now, wait_len, state, ahead, score, level, tenant, due, processed, finished) = reply[:10]
        encoded, paused, catchup, held, occupied, place, clock, asking, fweight = reply[10:19]
        account, account_weight = _text(reply[19]), _float(reply[20])
        state = _text(state)
        if state == "gone":
            return None
        level_name = _text(level)
        job_level = PriorityLevel(level_name) if level_name in LEVEL_NAMES else None
        typical = None
        hold = None
        placement = None
        if state == "held":
            hold = _hold([encoded, paused, catchup, held, occupied])
            if place and job_level is not None:
                placement = _placement(place, job_level, 1, int(wait_len))
                typical = placement.typical_ms
        tag = vt = None
        if clock and _text(score):
            vt_, base, delta, cursor, typical = (_float(v) for v in clock)
            vt = vt_
            score_int = int(float(_text(score)))
            if score_int >= TAG_FLOOR * SCORE_BASE:
                tag = _tag_of(score_int, base or 0.0, delta, cursor)
        return RawStatus(
            now_ms=int(now),
            state=state,
            ahead=None if int(ahead) < 0 else int(ahead),
            level=job_level,
            tag=tag,
            vt=vt,
            due_ms=int(float(_text(due))) if _text(due) else None,
            processed_on_ms=int(float(_text(processed))) if _text(processed) else None,
            finished_on_ms=int(float(_text(finished))) if _text(finished) else None,
            hold=hold,
            placement=placement,
            history=_history(read, typical),
            asking=_asking(asking, read),
            tenant=_text(tenant) or None,
            tenant_weight=_float(fweight),
            account=(account, account_weight or 1.0) if account else None,
        )
