"""The admin dashboard's reads: a page of the pop order, a whole-backlog scan, which
scanned jobs are still waiting, and one job's detail."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fairqueue.broker.common import JOB_FIELDS as _JOB_FIELDS
from fairqueue.broker.common import MAX_PRIORITY, TAG_FLOOR, parse_job_data
from fairqueue.broker.common import SCORE_BASE as _SCORE_BASE
from fairqueue.broker.common import int_or as _int_or
from fairqueue.broker.connection import BrokerPart, guarded
from fairqueue.broker.pass_store import WaitingJob, read_jobs
from fairqueue.broker.scripts import plain_script


@dataclass(frozen=True, slots=True)
class LevelScan:
    """One level's share of a backlog scan. ``oldest_ms`` is ``None`` for no jobs."""

    waiting: int = 0
    overdue: int = 0
    oldest_ms: int | None = None


@dataclass(slots=True)
class BacklogScan:
    """What :meth:`DashboardReads.scan_backlog` found. Levels are level names, plus ``"?"`` for
    jobs whose fairqueue metadata cannot be read (the pass skips those)."""

    cutoff_ms: int
    scanned: int = 0
    levels: dict[str, LevelScan] = field(default_factory=dict)
    #: level -> tenant -> waiting jobs.
    tenants: dict[str, dict[str, int]] = field(default_factory=dict)
    #: level -> tenant -> its waiting jobs past the bound (only tenants with some).
    tenant_overdue: dict[str, dict[str, int]] = field(default_factory=dict)
    duration_ms: float = 0.0

    def add_page(self, count: int, stats: list[Any], tenants: list[Any]) -> None:
        self.scanned += count
        for level, waiting, overdue, oldest in zip(
            stats[::4], stats[1::4], stats[2::4], stats[3::4], strict=True
        ):
            seen = self.levels.get(level, LevelScan())
            oldest_ms = int(oldest) if int(oldest) >= 0 else None
            if seen.oldest_ms is not None and (oldest_ms is None or seen.oldest_ms < oldest_ms):
                oldest_ms = seen.oldest_ms
            self.levels[level] = LevelScan(
                waiting=seen.waiting + int(waiting),
                overdue=seen.overdue + int(overdue),
                oldest_ms=oldest_ms,
            )
        for level, tenant, waiting, overdue in zip(
            tenants[::4], tenants[1::4], tenants[2::4], tenants[3::4], strict=True
        ):
            by_tenant = self.tenants.setdefault(level, {})
            by_tenant[tenant] = by_tenant.get(tenant, 0) + int(waiting)
            if int(overdue):
                late = self.tenant_overdue.setdefault(level, {})
                late[tenant] = late.get(tenant, 0) + int(overdue)

    def overdue_of(self, tenant: str) -> int:
        """``tenant``'s waiting jobs past the bound, every level."""
        return sum(by_tenant.get(tenant, 0) for by_tenant in self.tenant_overdue.values())


@dataclass(frozen=True, slots=True)
class MemoryState:
    """Redis's memory as ``INFO memory`` reports it (the fullest node on a cluster)."""

    used_bytes: int
    #: ``maxmemory``; 0 means no limit.
    max_bytes: int
    policy: str

    @property
    def refuses_writes(self) -> bool:
        """Over ``maxmemory`` with ``noeviction``: Redis refuses every write (and every
        command of a MULTI) while reads keep working."""
        return (
            self.max_bytes > 0
            and self.used_bytes >= self.max_bytes
            and (self.policy == "noeviction")
        )


@dataclass(frozen=True, slots=True)
class JobDetail:
    """A job as the dashboard's detail page shows it. ``state`` is BullMQ's:
    waiting, prioritized, active, delayed, completed, failed or unknown."""

    job: WaitingJob
    state: str
    max_attempts: int | None
    processed_on_ms: int | None
    finished_on_ms: int | None


class DashboardReads(BrokerPart):
    """The admin dashboard's reads, read-only. Each costs O(page) per call except
    :meth:`scan_backlog`, which the dashboard runs synchronously only for small backlogs."""

    async def is_paused(self, queue: str) -> bool:
        """Whether ``queue`` is paused (``queue.pause()`` from Node or Python sets its
        ``meta`` hash's ``paused`` field; workers take nothing until it is resumed)."""
        paused = await self.conn.guard(
            self.conn.client().hget(self.conn.key(queue, "meta"), "paused")
        )
        return paused is not None and str(paused) not in ("", "0")

    async def memory_state(self) -> MemoryState | None:
        """Redis's memory use and limit, or ``None`` when ``INFO`` cannot be read (an ACL
        that forbids it, a server that hides it): the page then says nothing of it."""
        try:
            info = await self.conn.client().info("memory")
        except Exception:  # a read for a banner only: never fail the page on it
            return None
        nodes = [info] if "used_memory" in info else list(info.values())
        states = []
        for node in nodes:
            if isinstance(node, dict) and "used_memory" in node:
                states.append(
                    MemoryState(
                        used_bytes=_int_or(node.get("used_memory"), 0) or 0,
                        max_bytes=_int_or(node.get("maxmemory"), 0) or 0,
                        policy=str(node.get("maxmemory_policy") or ""),
                    )
                )
        if not states:
            return None
        return max(states, key=lambda state: (state.refuses_writes, state.used_bytes))

    @guarded
    async def read_page(self, queue: str, *, start: int, count: int) -> list[WaitingJob]:
        """The waiting jobs at pop positions ``start .. start+count-1`` (0-based), in the
        order a BullMQ worker takes them: the wait list, then the prioritized set. Costs
        O(count) whatever the backlog, so the dashboard can page deep into it."""
        if count <= 0:
            return []
        script = self.conn.script(plain_script("dashboard_page"))
        _, flat = await script(
            keys=[self.conn.key(queue, "wait"), self.conn.key(queue, "prioritized")],
            first=start,
            last=start + count - 1,
        )
        entries = [
            (str(job_id), int(float(score)) // _SCORE_BASE, score == "0")
            for job_id, score in zip(flat[::2], flat[1::2], strict=True)
        ]
        return await read_jobs(self.conn, queue, entries)

    async def head_unplaced(self, queue: str, *, window: int) -> tuple[int, int]:
        """(jobs compared, of them unplaced) over the first ``window`` jobs in pop order:
        the wait list's (all unplaced) and the prioritized set's whose score lies outside
        fairqueue's tag band. One script call on the scores alone (``lua/order_head.lua``),
        O(log n) whatever the backlog: no job is read."""
        script = self.conn.script(plain_script("order_head"))
        compared, unplaced = await self.conn.guard(
            script(
                keys=[self.conn.key(queue, "wait"), self.conn.key(queue, "prioritized")],
                window=window,
                floor=TAG_FLOOR * _SCORE_BASE,
                cap=MAX_PRIORITY * _SCORE_BASE,
            )
        )
        return int(compared), int(unplaced)

    @guarded
    async def scan_backlog(
        self, queue: str, *, cutoff_ms: int, page_size: int = 5_000, max_jobs: int = 2_000_000
    ) -> BacklogScan:
        """Per-level waiting and overdue counts, oldest enqueue time and per-tenant counts
        over the whole waiting backlog, plus every overdue job.

        Runs inside Redis in pages of ``page_size`` jobs (each page blocks Redis for a few
        ms), so it costs O(backlog): about 6 ms per 1,000 jobs. Jobs moving while it runs
        may be missed or counted twice; the result is a snapshot, not a transaction.
        """
        started = time.perf_counter()
        script = self.conn.script(plain_script("dashboard_scan"))
        result = BacklogScan(cutoff_ms=cutoff_ms)
        prefix = self.conn.key(queue, "")
        for mode, key, cursor in (
            ("list", self.conn.key(queue, "wait"), "0"),
            ("zset", self.conn.key(queue, "prioritized"), "-inf"),
        ):
            while result.scanned < max_jobs:
                count, cursor, stats, tenants = await script(
                    keys=[key],
                    mode=mode,
                    cursor=cursor,
                    count=page_size,
                    cutoff=cutoff_ms,
                    prefix=prefix,
                )
                result.add_page(int(count), stats, tenants)
                if int(count) < page_size:
                    break
        result.duration_ms = (time.perf_counter() - started) * 1000
        return result

    @guarded
    async def read_job_detail(self, queue: str, job_id: str) -> JobDetail | None:
        """One job's stored fields and its BullMQ state; ``None`` if there is no such job
        (or the id names one of the queue's own keys rather than a job)."""
        async with self.conn.client().pipeline(transaction=False) as pipe:
            pipe.hmget(self.conn.key(queue, job_id), *_JOB_FIELDS, "processedOn", "finishedOn")
            pipe.zscore(self.conn.key(queue, "prioritized"), job_id)
            pipe.lpos(self.conn.key(queue, "wait"), job_id)
            pipe.lpos(self.conn.key(queue, "active"), job_id)
            pipe.zscore(self.conn.key(queue, "delayed"), job_id)
            pipe.zscore(self.conn.key(queue, "completed"), job_id)
            pipe.zscore(self.conn.key(queue, "failed"), job_id)
            replies = await pipe.execute(raise_on_error=False)
        row = replies[0]
        if isinstance(row, Exception) or all(value is None for value in row[:3]):
            return None  # no job, or a key of another type (WRONGTYPE)
        name, data, timestamp, priority, attempts_made, opts, processed, finished = row
        state = "unknown"
        for label, found in zip(
            ("prioritized", "waiting", "active", "delayed", "completed", "failed"),
            replies[1:],
            strict=True,
        ):
            if found is not None and not isinstance(found, Exception):
                state = label
                break
        parsed_opts = parse_job_data(opts) or {}
        requested = parsed_opts.get("priority")
        max_attempts = parsed_opts.get("attempts")
        return JobDetail(
            job=WaitingJob(
                job_id=job_id,
                name=name or "",
                data=parse_job_data(data),
                timestamp_ms=_int_or(timestamp, None),
                # Waiting, its place is its score (the hash keeps the cap, where BullMQ
                # re-adds a job that runs again).
                priority=(
                    int(float(replies[1])) // _SCORE_BASE
                    if state == "prioritized"
                    else _int_or(priority, 0) or 0
                ),
                attempts_made=_int_or(attempts_made, 0) or 0,
                in_wait_list=state == "waiting",
                requested_priority=requested if type(requested) is int else None,
            ),
            state=state,
            max_attempts=max_attempts if type(max_attempts) is int else None,
            processed_on_ms=_int_or(processed, None),
            finished_on_ms=_int_or(finished, None),
        )
