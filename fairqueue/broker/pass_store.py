"""What the rebalance pass reads and writes: adoption of untagged jobs, the ready-time
index walk, the paged rebase, counts and the pass's status records; and the head of a
queue as the dashboard and the demo read it, and the policy's view of such a job."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from fairqueue.broker.common import (
    FAIR_KEYS,
    JOB_FIELDS,
    REBASE_MARGIN,
    REBASE_THRESHOLD,
    fair_key,
    fair_keys,
    int_or,
    parse_job_data,
)
from fairqueue.broker.connection import BrokerPart, Connection, guarded
from fairqueue.broker.lock_store import Fence
from fairqueue.broker.scripts import adopt_page_script, plain_script, stalled_page_script
from fairqueue.exceptions import LockLostError
from fairqueue.scheduling.levels import (
    DEFAULT_TENANT,
    INTERNAL_TENANT,
    PAYLOAD_LEVEL_KEY,
    PAYLOAD_TENANT_KEY,
    PriorityLevel,
    normalize_priority,
)
from fairqueue.scheduling.order import PendingJob


@dataclass(frozen=True, slots=True)
class WaitingJob:
    """A waiting job as stored by BullMQ. ``data`` is ``None`` if it is not a JSON object."""

    job_id: str
    name: str
    data: dict[str, Any] | None
    timestamp_ms: int | None
    priority: int
    attempts_made: int
    in_wait_list: bool = False
    #: The priority the producer asked for (``opts.priority``), which BullMQ keeps when
    #: ``changePriority`` rewrites ``priority``: the stable level of a foreign job.
    requested_priority: int | None = None
    #: When it became ready, the wait bound's start: its first release when its tenant's
    #: limit held it, else its first ready time (``fqReady`` in its opts, Redis's clock),
    #: else its timestamp plus its delay, the rule the pass's index follows.
    ready_ms: int | None = None


@dataclass(frozen=True, slots=True)
class AdoptedPage:
    """What one adoption call did."""

    adopted: int
    aged: int
    #: Parked jobs still without room (the tag band is full until a rebase).
    parked: int
    examined: int
    #: Jobs of tenants with limits or paused, held again instead of placed (a retry, a
    #: promoted delayed job): they start only through their tenant's limits.
    held: int = 0


@dataclass(frozen=True, slots=True)
class RecoveredStalled:
    """What one stalled-job check recovered into the fair order (``aged``: of those,
    already past the wait bound, placed at their flow's next turn)."""

    recovered: int
    aged: int
    #: Of those, jobs of tenants with limits or paused, held again instead of placed.
    held: int = 0


@dataclass(slots=True)
class IndexWalk:
    """A walk over the ready-time index: waiting jobs per level and the entries dropped
    because their job left."""

    waiting: dict[str, int] = field(default_factory=dict)
    removed: int = 0
    pages: int = 0
    #: Where the walk stopped (a second of the index and the position in its list);
    #: ``None`` when it reached the end.
    cursor: tuple[str, int] | None = None
    #: Index ids between the cursor and the walk's end, not checked (0 when done).
    left: int = 0

    def extend(self, page: IndexWalk) -> None:
        """Add the next page of the same walk."""
        for level, count in page.waiting.items():
            self.waiting[level] = self.waiting.get(level, 0) + count
        self.removed += page.removed
        self.pages += page.pages
        self.cursor, self.left = page.cursor, page.left


class PassStore(BrokerPart):
    """What the rebalance pass reads and writes. Every write takes the pass's lock token
    and is fenced inside Redis: a pass that lost its lock writes nothing more."""

    # -- the pass ---------------------------------------------------------------------

    def _adopt_keys(self, queue: str, lock_key: str) -> list[str]:
        bullmq = ("wait", "paused", "meta", "prioritized", "active", "pc", "marker")
        keys = [self.conn.key(queue, name) for name in bullmq]
        return [
            *keys,
            *fair_keys(self.conn.prefix, queue),
            lock_key,
            fair_key(self.conn.prefix, queue, "lim"),
            self.conn.key(queue, "delayed"),
            self.conn.key(queue, "events"),
            fair_key(self.conn.prefix, queue, "dly"),
        ]

    async def adopt_page(
        self,
        queue: str,
        *,
        fence: Fence,
        page_size: int,
        max_wait_ms: int,
        max_payload_bytes: int,
        dry_run: bool = False,
        fairness_by: str = "time",
    ) -> AdoptedPage:
        """Give up to ``page_size`` untagged waiting jobs (the wait list, other
        producers' small priorities, parked jobs) their fair places.

        Raises:
            LockLostError: another rebalancer holds the lock; nothing was written.
        """
        script = self.conn.script(adopt_page_script())
        reply = await self.conn.guard(
            script(
                keys=self._adopt_keys(queue, fence.lock_key),
                **fence.argv(),
                prefix=self.conn.key(queue, ""),
                page=page_size,
                bound=max_wait_ms,
                max_payload=max_payload_bytes,
                dry=int(dry_run),
                fairness=fairness_by,
            )
        )
        status, adopted, aged, parked, examined, *rest = (int(value) for value in reply)
        if status < 0:
            raise LockLostError(queue)
        return AdoptedPage(
            adopted=adopted, aged=aged, parked=parked, examined=examined, held=sum(rest)
        )

    async def recover_stalled(
        self,
        queue: str,
        *,
        fence: Fence,
        max_wait_ms: int,
        max_payload_bytes: int,
        max_stalled_count: int,
        check_ms: int,
        fairness_by: str = "time",
    ) -> RecoveredStalled:
        """Run BullMQ's own stalled-job check (jobs whose worker died: marked by the last
        check and still without a lock) and place what it recovers in the fair order in
        the same step, before a worker could take it from the front of the wait list.

        Raises:
            LockLostError: another rebalancer holds the lock; nothing was written.
        """
        bullmq = ("stalled", "wait", "active", "stalled-check", "meta", "paused", "marker")
        keys = [self.conn.key(queue, name) for name in (*bullmq, "events", "repeat")]
        keys += [self.conn.key(queue, "prioritized"), *fair_keys(self.conn.prefix, queue)]
        script = self.conn.script(stalled_page_script())
        limits = fair_key(self.conn.prefix, queue, "lim")
        reply = await self.conn.guard(
            script(
                keys=[*keys, fence.lock_key, limits, self.conn.key(queue, "delayed")],
                max_stalled=max_stalled_count,
                prefix=self.conn.key(queue, ""),
                timestamp=int(time.time() * 1000),
                gate_ms=check_ms,
                **fence.argv(),
                bound=max_wait_ms,
                max_payload=max_payload_bytes,
                fairness=fairness_by,
            )
        )
        status, recovered, aged, held = (int(value) for value in reply)
        if status < 0:
            raise LockLostError(queue)
        return RecoveredStalled(recovered=recovered, aged=aged, held=held)

    async def walk_index_page(
        self,
        queue: str,
        *,
        fence: Fence,
        max_wait_ms: int | None,
        page_size: int = 1_000,
        cursor: tuple[str, int] | None = None,
        dry_run: bool = False,
    ) -> IndexWalk:
        """One page of a walk over the ready-time index, oldest first: with
        ``max_wait_ms`` up to the jobs past the bound (counting them per level), with
        ``None`` to its end; from ``cursor`` (where the previous page stopped) or the
        start. Entries of jobs that left are dropped on the way.

        Raises:
            LockLostError: another rebalancer holds the lock.
        """
        script = self.conn.script(plain_script("index_walk"))
        keys = [
            self.conn.fair_key(queue, "ready"),
            self.conn.key(queue, "prioritized"),
            self.conn.key(queue, "delayed"),
            fence.lock_key,
        ]
        second, index = cursor if cursor is not None else ("", 0)
        bound = "" if max_wait_ms is None else max_wait_ms
        status, second, index, done, removed, flat, left = await self.conn.guard(
            script(
                keys=keys,
                **fence.argv(),
                second=second,
                index=index,
                page=page_size,
                bound=bound,
                dry=int(dry_run),
            )
        )
        if int(status) < 0:
            raise LockLostError(queue)
        page = IndexWalk(
            removed=int(removed),
            pages=1,
            cursor=None if int(done) else (str(second), int(index)),
            left=int(left),
        )
        for level, waiting in zip(flat[::2], flat[1::2], strict=True):
            page.waiting[level] = int(waiting)
        return page

    async def rebase_page(
        self,
        queue: str,
        *,
        fence: Fence,
        page_size: int = 1_000,
        threshold: int = REBASE_THRESHOLD,
        margin: int = REBASE_MARGIN,
    ) -> tuple[int, bool]:
        """Move one page of the tag band down (starting a rebase if the virtual time
        has run ``threshold`` priorities above the base). Returns (jobs moved, whether
        no rebase is left in progress).

        Raises:
            LockLostError: another rebalancer holds the lock.
        """
        script = self.conn.script(plain_script("rebase_page"))
        status, moved, done = await self.conn.guard(
            script(
                keys=[
                    self.conn.key(queue, "prioritized"),
                    *(
                        self.conn.fair_key(queue, name)
                        for name in ("state", "flows", "fweights", "jobs")
                    ),
                    fence.lock_key,
                ],
                **fence.argv(),
                prefix=self.conn.key(queue, ""),
                page=page_size,
                threshold=threshold,
                margin=margin,
            )
        )
        if int(status) < 0:
            raise LockLostError(queue)
        return int(moved), bool(int(done))

    async def forget_obliterated(
        self,
        queue: str,
        *,
        fence: Fence,
        status_names: Sequence[str] = (),
        page_size: int = 1_000,
    ) -> int | None:
        """Delete fairqueue's keys beside ``queue`` if BullMQ obliterated it (no ``id``
        counter: every add increments it, ``Queue.obliterate`` deletes it): the clock
        state, flows and their lines, the ready-time index and its lists, delayed jobs' meta
        and their flows' indexes, the history cursor and the status records
        ``status_names``. The keys deleted, or ``None`` when the queue exists (nothing
        done). The leader lock stays.

        Raises:
            LockLostError: another rebalancer holds the lock.
        """
        script = self.conn.script(plain_script("forget_obliterated"))
        others = [
            self.conn.fair_key(queue, name)
            for name in (*FAIR_KEYS, "hist", "seen", *status_names)
            if name != "ready"
        ]
        keys = [
            self.conn.key(queue, "id"),
            self.conn.fair_key(queue, "ready"),
            fence.lock_key,
            self.conn.fair_key(queue, "flows"),
            self.conn.fair_key(queue, "dly"),
        ]
        deleted = 0
        while True:
            status, count, done = await self.conn.guard(
                script(keys=[*keys, *others], **fence.argv(), page=page_size)
            )
            if int(status) < 0:
                raise LockLostError(queue)
            if int(status) == 0:
                return None if not deleted else deleted
            deleted += int(count)
            if int(done):
                return deleted

    # -- reading ----------------------------------------------------------------------

    @guarded
    async def counts(self, queue: str) -> dict[str, int]:
        """Job counts by BullMQ state."""
        states = ("wait", "prioritized", "active", "delayed", "failed", "completed")
        values = await self.conn.queue(queue).getJobCounts(*states)
        return {state: int(values.get(state, 0)) for state in states}

    # -- status records --------------------------------------------------------------

    async def write_status(self, queue: str, name: str, record: dict[str, Any]) -> None:
        """Store a small JSON status record beside the queue (e.g. the last pass)."""
        await self.conn.guard(
            self.conn.client().set(self.conn.fair_key(queue, name), json.dumps(record))
        )

    async def read_status(self, queue: str, name: str) -> dict[str, Any] | None:
        raw = await self.conn.guard(self.conn.client().get(self.conn.fair_key(queue, name)))
        return parse_job_data(cast("str | None", raw))


async def read_jobs(
    conn: Connection, queue: str, entries: Sequence[tuple[str, int | None, bool]]
) -> list[WaitingJob]:
    """The waiting jobs behind ``entries`` (id, priority or None, in the wait list),
    read in one pipeline; jobs removed or finished since their ids were read drop out."""
    if not entries:
        return []
    async with conn.client().pipeline(transaction=False) as pipe:
        for job_id, _, _ in entries:
            pipe.hmget(conn.key(queue, job_id), *JOB_FIELDS, "fqRel")
        rows = await pipe.execute()
    jobs = []
    for (job_id, priority, in_wait), row in zip(entries, rows, strict=True):
        name, data, timestamp, stored_priority, attempts_made, opts, released = row
        if name is None and data is None and timestamp is None:
            continue  # removed or finished since we read the ids
        parsed_opts = parse_job_data(opts) or {}
        requested = parsed_opts.get("priority")
        jobs.append(
            WaitingJob(
                job_id=job_id,
                name=name or "",
                data=parse_job_data(data),
                timestamp_ms=int_or(timestamp, None),
                priority=priority if priority is not None else int_or(stored_priority, 0),
                attempts_made=int_or(attempts_made, 0) or 0,
                in_wait_list=in_wait,
                requested_priority=requested if type(requested) is int else None,
                ready_ms=ready_time_ms(int_or(timestamp, None), parsed_opts, released),
            )
        )
    return jobs


def ready_time_ms(
    timestamp_ms: int | None, opts: dict[str, Any], released: str | None
) -> int | None:
    """When a job became ready (see :attr:`WaitingJob.ready_ms`): held and delayed
    time is not waiting."""
    for value in (released, opts.get("fqReady")):
        number = int_or(value, None)
        if number is not None:
            return number
    if timestamp_ms is None:
        return None
    delay = opts.get("delay")
    if isinstance(delay, int | float) and not isinstance(delay, bool) and delay > 0:
        return timestamp_ms + int(delay)
    return timestamp_ms


def pending_from_job(job: WaitingJob) -> PendingJob | None:
    """The policy's view of a job read from BullMQ (the dashboard's reads); ``None`` if
    its data cannot say.

    fairqueue's jobs carry ``tenantId`` and ``priorityLevel`` in their data; jobs from
    other producers fall back to the priority their producer asked for and the
    ``default`` tenant (docs/design.md, "Levels and priorities").
    """
    if job.data is None or job.timestamp_ms is None:
        return None
    tenant = job.data.get(PAYLOAD_TENANT_KEY)
    if tenant is None:  # JSON null: an internal job; no tenantId: another producer's
        tenant = INTERNAL_TENANT if PAYLOAD_TENANT_KEY in job.data else DEFAULT_TENANT
    elif not isinstance(tenant, str) or not tenant:
        return None
    raw_level = job.data.get(PAYLOAD_LEVEL_KEY)
    try:
        if raw_level is not None:
            level = PriorityLevel(raw_level)
        else:
            requested = job.requested_priority
            level = normalize_priority(requested if requested is not None else job.priority)
    except ValueError:
        return None
    ready = job.ready_ms if job.ready_ms is not None else job.timestamp_ms
    return PendingJob(job.job_id, level, tenant, ready)
