"""The operator console's reads and two of its writes: a tenant's jobs in one queue, a
job's place in the waiting order, a job's failure, and removing a waiting job.

Every read is bounded whatever the backlog: the waiting order is read from its front, a
page at a time, up to :data:`ORDER_WINDOW` jobs (the jobs workers take next; the pass
keeps the same window); failures from the most recent :data:`FAILED_WINDOW`; running
jobs from BullMQ's active list (as long as the workers' concurrency). A tenant's
waiting count per level comes from the dashboard's backlog scan, not from here, so the
tenant page and the queue page show the same number.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fairqueue.broker.common import as_text, int_or, limits_key, parse_job_data, tenant_in_data
from fairqueue.broker.connection import BrokerPart
from fairqueue.broker.dashboard_reads import DashboardReads
from fairqueue.broker.failure_reads import failure_class, sanitize_failure
from fairqueue.broker.pass_store import WaitingJob, pending_from_job, read_jobs
from fairqueue.broker.scripts import call_script_many, plain_script
from fairqueue.scheduling.levels import DEFAULT_TENANT, INTERNAL_TENANT, PAYLOAD_ACCOUNT_KEY
from fairqueue.scheduling.noisy import FlowWeight, InFlight
from fairqueue.scheduling.shares import LEVEL_NAMES
from fairqueue.scheduling.wire import account_member, flow_member

#: The front of the waiting order the console reads: positions, what is ahead of a job,
#: a tenant's next jobs. Beyond it, a job's position is still exact (one ZRANK).
ORDER_WINDOW: Final = 1_000
#: Jobs of the waiting order one read fetches.
ORDER_PAGE: Final = 250
#: The most recent failures read for a tenant's failed jobs.
FAILED_WINDOW: Final = 1_000
#: A tenant's next jobs and failures the console reads in full (and shows).
NEXT_SHOWN: Final = 10
FAILED_SHOWN: Final = 20
#: Running jobs read at most (BullMQ's active list is as long as the workers' slots).
ACTIVE_WINDOW: Final = 2_000
#: Jobs one "remove its waiting jobs" removes at most (it says when more remain)...
REMOVE_LIMIT: Final = 2_000
#: ...among the jobs it reads of the waiting order at most.
REMOVE_READ: Final = 100_000
#: Jobs one ``remove_waiting.lua`` call checks and removes (bounded work per call).
REMOVE_PAGE: Final = 100


@dataclass(frozen=True, slots=True)
class Removal:
    """What removing a tenant's waiting jobs did: ``removed`` still waited and are gone;
    ``started`` a worker had taken meanwhile (running or ended: left as they are);
    ``gone`` no longer existed; ``kept`` are jobs of a flow or a job scheduler, left."""

    removed: int = 0
    started: int = 0
    gone: int = 0
    kept: int = 0


def job_tenant_id(job: WaitingJob) -> str | None:
    """The tenant a job was enqueued for; ``None`` for a job without one."""
    if job.data is None:
        return None
    tenant = job.data.get("tenantId")
    return tenant if isinstance(tenant, str) and tenant else None


@dataclass(frozen=True, slots=True)
class FailedJob:
    job_id: str
    failed_at_ms: int | None
    attempts_made: int
    error_class: str
    message: str


@dataclass(slots=True)
class TenantJobs:
    """One tenant's jobs in one queue, as the console reads them."""

    held: int = 0
    held_ids: list[str] = field(default_factory=list)
    running: int = 0
    running_ids: list[str] = field(default_factory=list)
    #: Its first :data:`NEXT_SHOWN` jobs among the first :data:`ORDER_WINDOW` in line:
    #: (position, job), first first.
    next_jobs: list[tuple[int, WaitingJob]] = field(default_factory=list)
    #: Every one of its jobs among them: (position, job id).
    next_positions: list[tuple[int, str]] = field(default_factory=list)
    #: How many of its jobs are among them.
    in_window: int = 0
    #: Jobs of the order read (``ORDER_WINDOW`` or the whole order when shorter).
    order_read: int = 0
    #: Its first :data:`FAILED_SHOWN` failures among the last :data:`FAILED_WINDOW`,
    #: newest first, and how many it has among those.
    failed: list[FailedJob] = field(default_factory=list)
    failed_count: int = 0
    failed_read: int = 0
    paused: bool = False
    limits_encoded: str | None = None


@dataclass(frozen=True, slots=True)
class Place:
    """Where a waiting job stands: its 1-based position in the pop order, and what is
    ahead of it (when it is within the window) by level and by tenant."""

    position: int
    ahead_by_level: dict[str, int]
    ahead_by_tenant: list[tuple[str | None, int]]
    #: Whether everything ahead of it was read (it stands within the window).
    complete: bool
    #: Jobs of its own flow (level and tenant) ahead of it.
    same_flow_ahead: int = 0

    @property
    def ahead(self) -> int:
        """Jobs ahead of it: the one count every sentence of its page uses."""
        return self.position - 1


class ConsoleReads(BrokerPart):
    """The console's reads over one prefix's queues."""

    async def order_front(self, queue: str, count: int = ORDER_WINDOW) -> list[WaitingJob]:
        """The first ``count`` jobs of the pop order, read a page at a time."""
        jobs: list[WaitingJob] = []
        dashboard = DashboardReads(self.conn)
        for start in range(0, count, ORDER_PAGE):
            page = await dashboard.read_page(
                queue, start=start, count=min(ORDER_PAGE, count - start)
            )
            jobs += page
            if len(page) < min(ORDER_PAGE, count - start):
                break
        return jobs

    async def tenant_jobs(self, queue: str, tenant_id: str) -> TenantJobs:
        """``tenant_id``'s held, running, next and recently failed jobs in ``queue``.

        Its jobs are picked out inside Redis (``lua/tenant_jobs.lua``, one pipelined
        round trip of bounded calls: the first :data:`ORDER_WINDOW` of the order a page
        of :data:`ORDER_PAGE` a call, the first :data:`ACTIVE_WINDOW` running jobs, the
        last :data:`FAILED_WINDOW` failures), so only its own come back; then the first
        :data:`NEXT_SHOWN` of its next jobs and :data:`FAILED_SHOWN` of its failures are
        read in full."""
        client = self.conn.client()
        script = plain_script("tenant_jobs")
        keys = [self.conn.key(queue, name) for name in ("wait", "prioritized", "active", "failed")]
        common = {
            "tenant": tenant_id,
            "prefix": self.conn.key(queue, ""),
            "verbatim": int(_verbatim_in_json(tenant_id)),
        }
        parts = [("active", 0, ACTIVE_WINDOW - 1), ("failed", 0, FAILED_WINDOW - 1)]
        parts += [
            ("front", start, start + ORDER_PAGE - 1) for start in range(0, ORDER_WINDOW, ORDER_PAGE)
        ]
        calls = [(keys, {"part": part, "first": a, "last": b, **common}) for part, a, b in parts]
        (held, held_ids, paused, encoded), (active, failed, *front) = await self.conn.guard(
            asyncio.gather(self._held_of(queue, tenant_id), call_script_many(client, script, calls))
        )
        found = TenantJobs(
            held=int(held),
            held_ids=[as_text(v) for v in held_ids],
            paused=bool(paused),
            limits_encoded=None if encoded is None else as_text(encoded),
            running_ids=[as_text(v) for v in active[1::2]],
            failed_read=int(failed[0]),
            failed_count=len(failed[1::2]),
        )
        found.running = len(found.running_ids)
        for page in front:
            found.order_read += int(page[0])
            found.in_window += len(page[1::2])
            found.next_positions += [
                (int(position), as_text(job_id))
                for job_id, position in zip(page[1::2], page[2::2], strict=True)
            ]
        shown_failed = [
            (as_text(job_id), int(float(score)))
            for job_id, score in zip(failed[1::2], failed[2::2], strict=True)
        ][:FAILED_SHOWN]
        await self._read_shown(queue, found, shown_failed)
        return found

    async def _held_of(self, queue: str, tenant_id: str) -> list[Any]:
        """A tenant's held count, first held ids, pause and limits (one round trip)."""
        base = limits_key(self.conn.prefix, queue)
        async with self.conn.client().pipeline(transaction=False) as pipe:
            pipe.llen(f"{base}:held:{tenant_id}")
            pipe.lrange(f"{base}:held:{tenant_id}", 0, 19)
            pipe.hexists(f"{base}:paused", tenant_id)
            pipe.hget(base, tenant_id)
            return list(await pipe.execute())

    async def _read_shown(
        self, queue: str, found: TenantJobs, failed: list[tuple[str, int]]
    ) -> None:
        """The shown next jobs (as the order reads them) and failures, read in full."""
        nexts = found.next_positions[:NEXT_SHOWN]
        jobs = await read_jobs(self.conn, queue, [(job_id, None, False) for _, job_id in nexts])
        by_id = {job.job_id: job for job in jobs}
        found.next_jobs = [(pos, by_id[job_id]) for pos, job_id in nexts if job_id in by_id]
        if not failed:
            return
        async with self.conn.client().pipeline(transaction=False) as pipe:
            for job_id, _ in failed:
                pipe.hmget(self.conn.key(queue, job_id), "atm", "failedReason", "stacktrace")
            rows = await self.conn.guard(pipe.execute())
        for (job_id, score), (attempts, reason, trace) in zip(failed, rows, strict=True):
            reason_text = None if reason is None else as_text(reason)
            trace_text = None if trace is None else as_text(trace)
            found.failed.append(
                FailedJob(
                    job_id=job_id,
                    failed_at_ms=score,
                    attempts_made=int_or(attempts, 0) or 0,
                    error_class=failure_class(reason_text, trace_text),
                    message=sanitize_failure(reason_text),
                )
            )

    async def place(self, queue: str, job: WaitingJob, state: str) -> Place | None:
        """Where a waiting job stands in the pop order (``None`` when it is not waiting)."""
        if state not in ("waiting", "prioritized"):
            return None
        client = self.conn.client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.llen(self.conn.key(queue, "wait"))
            pipe.lpos(self.conn.key(queue, "wait"), job.job_id)
            pipe.zrank(self.conn.key(queue, "prioritized"), job.job_id)
            wait_len, in_list, rank = await self.conn.guard(pipe.execute())
        if in_list is not None:  # popped from the right end: the last pushed goes last
            position = int(wait_len) - int(in_list)
        elif rank is not None:
            position = int(wait_len) + int(rank) + 1
        else:
            return None
        ahead = await self.order_front(queue, min(position, ORDER_WINDOW))
        # Jobs move between the rank and the read: where the read found it is its place,
        # so the position and the counts by level and tenant are of one moment.
        found_at = next((i for i, other in enumerate(ahead) if other.job_id == job.job_id), None)
        if found_at is not None:
            position, ahead = found_at + 1, ahead[:found_at]
        else:
            ahead = ahead[: position - 1]
        by_level: dict[str, int] = {}
        by_tenant: dict[str | None, int] = {}
        mine = pending_from_job(job)
        same_flow = 0
        for other in ahead:
            if other.job_id == job.job_id:
                continue
            pending = pending_from_job(other)
            level = pending.priority_level.value if pending else "?"
            by_level[level] = by_level.get(level, 0) + 1
            tenant = job_tenant_id(other)
            by_tenant[tenant] = by_tenant.get(tenant, 0) + 1
            if (
                mine
                and pending
                and (pending.priority_level, pending.tenant_id)
                == (
                    mine.priority_level,
                    mine.tenant_id,
                )
            ):
                same_flow += 1
        top = sorted(by_tenant.items(), key=lambda item: (-item[1], item[0] or ""))[:5]
        return Place(
            position=position,
            ahead_by_level=by_level,
            ahead_by_tenant=top,
            complete=position - 1 <= ORDER_WINDOW,
            same_flow_ahead=same_flow,
        )

    async def in_flight(self, queue: str) -> InFlight:
        """Running jobs per (level, tenant) from BullMQ's active list (at most
        :data:`ACTIVE_WINDOW`), each level's weight of flows with work, the running
        tenants' flows, and their accounts (a job's ``accountId``) with each (level,
        account)'s counted weight: what :func:`noisy_tenants` and :func:`noisy_accounts`
        need; and how many accounts run them (a tenant without one counting as its own;
        jobs of no tenant and internal work none); per (level, tenant) the ms its running
        jobs have run so far (``processedOn`` to now). Three round trips."""
        client = self.conn.client()
        active = await self.conn.guard(
            client.lrange(self.conn.key(queue, "active"), 0, ACTIVE_WINDOW - 1)
        )
        async with client.pipeline(transaction=False) as pipe:
            for job_id in active:
                pipe.hmget(self.conn.key(queue, as_text(job_id)), "data", "processedOn")
            pipe.hmget(self.conn.fair_key(queue, "state"), *(f"W:{n}" for n in LEVEL_NAMES))
            *rows, weights = await self.conn.guard(pipe.execute())
        now_ms = time.time() * 1000
        running: dict[tuple[str, str], int] = {}
        ran_ms: dict[tuple[str, str], float] = {}
        accounts: set[tuple[bool, str]] = set()
        owners: dict[str, str] = {}
        for data, processed in rows:
            parsed = parse_job_data(None if data is None else as_text(data))
            if parsed is None:
                continue
            account = parsed.get(PAYLOAD_ACCOUNT_KEY)
            level = parsed.get("priorityLevel")
            level = level if level in LEVEL_NAMES else "normal"
            tenant = parsed.get("tenantId")
            if tenant is None and "tenantId" in parsed:
                tenant = INTERNAL_TENANT  # an internal job (JSON null)
            tenant = tenant if isinstance(tenant, str) and tenant else DEFAULT_TENANT
            running[(level, tenant)] = running.get((level, tenant), 0) + 1
            since = int_or(processed, None)
            if since is not None:
                ran_ms[(level, tenant)] = ran_ms.get((level, tenant), 0.0) + max(
                    0.0, now_ms - since
                )
            if isinstance(account, str) and account:
                accounts.add((True, account))
                owners[tenant] = account
            elif tenant not in (DEFAULT_TENANT, INTERNAL_TENANT):
                accounts.add((False, tenant))
        members = [flow_member(level, tenant) for level, tenant in running]
        grouped = sorted({(lv, owners[t]) for lv, t in running if t in owners})
        flows: dict[tuple[str, str], FlowWeight] = {}
        account_flows: dict[tuple[str, str], FlowWeight] = {}
        if members:
            async with client.pipeline(transaction=False) as pipe:
                fweights = self.conn.fair_key(queue, "fweights")
                pipe.hmget(fweights, *members)
                pipe.zmscore(self.conn.fair_key(queue, "flows"), members)
                found_weights, scores = await self.conn.guard(pipe.execute())
            for key, weight, score in zip(running, found_weights, scores, strict=True):
                flows[key] = FlowWeight(int_or(weight, 1) or 1, score is not None)
            if grouped:  # packed as msgpack: read inside Redis (lua/account_states.lua)
                script = self.conn.script(plain_script("account_states"))
                states = await self.conn.guard(
                    script(
                        keys=[fweights],
                        members=[account_member(lv, a) for lv, a in grouped],
                    )
                )
                for key, state in zip(grouped, states, strict=True):
                    # no state kept: none of its flows has work (its weight then by the jobs)
                    weight = int(float(state[1])) if state else 1
                    account_flows[key] = FlowWeight(weight, bool(state))
        level_weights = {
            level: int_or(value, 0) or 0 for level, value in zip(LEVEL_NAMES, weights, strict=True)
        }
        return InFlight(running, level_weights, flows, len(accounts), owners, account_flows, ran_ms)

    async def tenant_weights(self, queue: str, tenant_id: str) -> dict[str, tuple[int, int]]:
        """Per level where ``tenant_id``'s flow has work: (the weight it counts, the sum
        its level counts over the flows with work). One round trip."""
        members = [flow_member(level, tenant_id) for level in LEVEL_NAMES]
        async with self.conn.client().pipeline(transaction=False) as pipe:
            pipe.hmget(self.conn.fair_key(queue, "fweights"), *members)
            pipe.hmget(self.conn.fair_key(queue, "state"), *(f"W:{n}" for n in LEVEL_NAMES))
            counted, totals = await self.conn.guard(pipe.execute())
        return {
            level: (int_or(weight, 0) or 0, int_or(total, 0) or 0)
            for level, weight, total in zip(LEVEL_NAMES, counted, totals, strict=True)
            if weight is not None
        }

    async def held_levels(self, queue: str, job_ids: list[str]) -> dict[str, str]:
        """The level each of ``job_ids`` (held jobs) was held with (its limits meta), one
        HMGET: job id -> level, for those still held."""
        if not job_ids:
            return {}
        metas = await self.conn.guard(
            self.conn.client().hmget(f"{limits_key(self.conn.prefix, queue)}:meta", job_ids)
        )
        return {
            job_id: as_text(meta).split("\n", 1)[0]
            for job_id, meta in zip(job_ids, metas, strict=True)
            if meta is not None
        }

    async def delayed_until(self, queue: str, job_id: str) -> int | None:
        """When a delayed job is due (ms; a held job's is in the year 9999)."""
        score = await self.conn.guard(
            self.conn.client().zscore(self.conn.key(queue, "delayed"), job_id)
        )
        return None if score is None else int(float(score)) // 4096  # BullMQ's score

    async def failure(self, queue: str, job_id: str) -> tuple[str, str]:
        """A failed job's error class and sanitized message (``("", "")`` for none)."""
        reason, trace = await self.conn.guard(
            self.conn.client().hmget(self.conn.key(queue, job_id), "failedReason", "stacktrace")
        )
        text = None if reason is None else as_text(reason)
        return (
            failure_class(text, None if trace is None else as_text(trace)),
            sanitize_failure(text),
        )

    async def remove_job(self, queue: str, job_id: str) -> bool:
        """Remove a job that no worker holds, with BullMQ's own ``removeJob`` (every list,
        set and key of the job). A held job leaves its tenant's held list at once (the
        tenant page counts that list: a paused tenant's release step would not pop it
        until resumed); fairqueue's other indexes forget it as the pass and the release
        step find it gone. Returns whether it was removed."""
        client = self.conn.client()
        data = await self.conn.guard(client.hget(self.conn.key(queue, job_id), "data"))
        removed = await self.conn.guard(self.conn.queue(queue).remove(job_id))
        tenant = tenant_in_data(data)
        if removed and tenant is not None:
            base = limits_key(self.conn.prefix, queue)
            async with client.pipeline(transaction=False) as pipe:
                # the list and its rank index (tenant_limits.lua), one round trip
                pipe.lrem(f"{base}:held:{tenant}", 0, job_id)
                pipe.zrem(f"{base}:hrank:{tenant}", job_id)
                unheld, _ = await self.conn.guard(pipe.execute())
            if unheld:
                await self.conn.guard(client.hdel(f"{base}:meta", job_id))
        return bool(removed)

    async def remove_waiting(self, queue: str, tenant_id: str, job_ids: Sequence[str]) -> Removal:
        """Remove those of ``job_ids`` (the tenant's, from :meth:`waiting_ids_of`) that
        still wait, :data:`REMOVE_PAGE` per script call (``lua/remove_waiting.lua``):
        each is checked and removed in one step, so a job a worker took since it was
        listed is never deleted, and is counted as started."""
        script = self.conn.script(plain_script("remove_waiting"))
        base = limits_key(self.conn.prefix, queue)
        keys = [
            self.conn.key(queue, "prioritized"),
            self.conn.key(queue, "delayed"),
            self.conn.key(queue, "wait"),
            self.conn.key(queue, "paused"),
            self.conn.key(queue, "meta"),
            self.conn.key(queue, "events"),
            f"{base}:held:{tenant_id}",
            f"{base}:meta",
            f"{base}:hrank:{tenant_id}",
        ]
        done = Removal()
        for at in range(0, len(job_ids), REMOVE_PAGE):
            page = list(job_ids[at : at + REMOVE_PAGE])
            reply = await self.conn.guard(
                script(keys=keys, prefix=self.conn.key(queue, ""), ids=page)
            )
            removed, started, gone, kept = (int(n) for n in reply)
            done = Removal(
                done.removed + removed,
                done.started + started,
                done.gone + gone,
                done.kept + kept,
            )
        return done

    async def waiting_ids_of(
        self, queue: str, tenant_id: str, limit: int = REMOVE_LIMIT
    ) -> list[str]:
        """Up to ``limit`` of a tenant's jobs that no worker has taken: its held jobs, then
        its jobs in the waiting order (read from the front, a page at a time)."""
        base = limits_key(self.conn.prefix, queue)
        held = await self.conn.guard(
            self.conn.client().lrange(f"{base}:held:{tenant_id}", 0, limit - 1)
        )
        ids = [as_text(v) for v in held]
        dashboard = DashboardReads(self.conn)
        start = 0
        while len(ids) < limit and start < REMOVE_READ:
            page = await dashboard.read_page(queue, start=start, count=ORDER_PAGE)
            if not page:
                break
            ids += [job.job_id for job in page if job_tenant_id(job) == tenant_id]
            start += len(page)
        return ids[:limit]


def _verbatim_in_json(text: str) -> bool:
    """Whether ``text`` appears as itself inside any JSON encoder's string (printable
    ASCII none escapes): then a job whose data lacks it is not the tenant's."""
    return all(" " <= char <= "~" and char not in '"\\/' for char in text)
