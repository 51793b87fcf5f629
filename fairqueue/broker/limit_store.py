"""Per-tenant limits in Redis: releasing held jobs, pausing, and what the dashboard reads.

The add script holds a limited tenant's jobs (``lua/include/tenant_limits.lua``); this module runs
``lua/release_held.lua``, the one script that decides a tenant's room and moves its held
jobs to their fair places, so every caller (the loop, ``fairqueue_worker``, an enqueue)
releases through the same atomic step and no job is released twice.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fairqueue.broker.common import fair_key, fair_keys
from fairqueue.broker.connection import BrokerPart, Connection
from fairqueue.broker.scripts import plain_script, release_held_script, retry_failed_script
from fairqueue.scheduling.limits import TenantLimits

#: Held jobs one release call moves at most: 200 placements hold Redis a few ms, and the
#: loop's next step (20 ms later) moves the next 200, so a resumed backlog of thousands
#: flows out at about 10,000 jobs a second without stalling other clients' commands.
RELEASE_BUDGET: Final = 200
#: Waiting jobs a pause's scan for the tenant's untracked jobs reads per call.
SCAN_PAGE: Final = 500
#: Waiting jobs a weight change's re-placement visits per script call (a page of the
#: prioritized set: about a millisecond of Redis), and the pages the change's own call
#: runs before it leaves the rest to the loop's ticks.
REPLACE_PAGE: Final = 500
REPLACE_PAGES_AT_ONCE: Final = 8
#: Tenants one call of the dashboard's walk over the tenants holding jobs reads (one
#: LLEN each inside Redis: about 2 ms a call, so other clients wait at most that long).
READ_CHUNK: Final = 1_000
#: Tenants' limits one HSET of a rebuild writes.
_REBUILD_CHUNK: Final = 1_000
#: Tenants the dashboard's read lists at most.
STATUS_TENANTS: Final = 200
#: Held job ids the dashboard's read returns per listed tenant.
STATUS_HELD_IDS: Final = 10

_RETRY_KEYS: Final = ("failed", "prioritized", "delayed", "events", "marker")
_BULLMQ_KEYS: Final = (
    "prioritized",
    "delayed",
    "active",
    "completed",
    "failed",
    "marker",
    "meta",
    "events",
)


@dataclass(frozen=True, slots=True)
class Released:
    """What one release call did: jobs released, jobs still held (of the tenants it
    looked at) by the limit that holds them, and when a rate window next opens."""

    released: int = 0
    held: int = 0
    #: ms until a rate-limited tenant gets room again (``None``: no rate window pending).
    wake_ms: int | None = None
    by_max_active: int = 0
    by_rate: int = 0
    by_paused: int = 0

    @property
    def by_reason(self) -> dict[str, int]:
        return {"max_active": self.by_max_active, "rate": self.by_rate, "paused": self.by_paused}


@dataclass(frozen=True, slots=True)
class TenantState:
    """One limited tenant in one queue, for the dashboard: its jobs running (in BullMQ's
    active list), occupying slots (released, not finished), held, and its limits."""

    tenant_id: str
    running: int
    occupied: int
    held: int
    limits: TenantLimits
    #: Resumed, and its held jobs still draining a few at a time.
    catching_up: bool = False
    #: Its first held jobs, in the order they will be released.
    held_jobs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LimitsStatus:
    """A queue's limited tenants as the dashboard shows them: exact totals over every
    tenant, and at most :data:`STATUS_TENANTS` of them listed (paused ones first, then
    those holding the most jobs, then others with limits)."""

    tenants: list[TenantState]
    #: Jobs held, over every tenant.
    held_total: int = 0
    #: Tenants with held jobs.
    holding: int = 0
    #: Tenants with limits in this queue (as their latest enqueue or edit stored them).
    limited: int = 0
    #: Tenants paused in this queue.
    paused: int = 0

    @property
    def held_not_listed(self) -> int:
        """Jobs held by the tenants not listed: with the listed ones', the total."""
        return self.held_total - sum(state.held for state in self.tenants)

    @property
    def holding_not_listed(self) -> int:
        """Tenants with held jobs that are not listed."""
        return self.holding - sum(1 for state in self.tenants if state.held)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """Where a job stands: whether its hash exists, whether it is in BullMQ's completed
    or failed set, and its attempts made (each failed attempt adds one)."""

    exists: bool
    completed: bool
    failed: bool
    attempts_made: int


def limits_key(prefix: str, queue: str) -> str:
    """The queue's limits hash; the other limit keys hang beside it (``tenant_limits.lua``)."""
    return fair_key(prefix, queue, "lim")


def release_keys(prefix: str, queue: str) -> list[str]:
    """The release script's keys, in its order."""
    return [
        *(f"{prefix}:{queue}:{name}" for name in _BULLMQ_KEYS),
        *fair_keys(prefix, queue),
        limits_key(prefix, queue),
        f"{prefix}:{queue}:wait",
    ]


def release_args(
    prefix: str, queue: str, tenants: Sequence[str] | None, fairness_by: str, mode: str
) -> dict[str, Any]:
    """``release_held.lua``'s arguments by name (its optional 'scan' ones aside)."""
    return {
        "prefix": f"{prefix}:{queue}:",
        "fairness": fairness_by,
        "mode": mode,
        "tenants": "\n".join(tenants) if tenants else "",
        "most": RELEASE_BUDGET,
    }


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_released(reply: Sequence[Any]) -> Released:
    released, held, wake, by_active, by_rate, by_paused = (int(value) for value in reply)
    return Released(released, held, None if wake < 0 else wake, by_active, by_rate, by_paused)


class LimitStore(BrokerPart):
    """Releasing, pausing and reading the held jobs of one prefix's queues.

    A release places jobs by the fair clock, so it counts what the broker's adds count
    (``fairness_by``, the ``FAIRNESS_BY`` setting): every caller (the loop, a pass,
    ``fairqueue_worker``, a resume, an admin edit) places alike."""

    def __init__(self, conn: Connection, *, fairness_by: str = "time") -> None:
        super().__init__(conn)
        self.fairness_by = fairness_by

    async def release(self, queue: str, tenants: Sequence[str] | None = None) -> Released:
        """Release the held jobs of ``tenants`` that have room now, at their fair places
        (``None``: the loop's step, over the tenants due for a visit; docs/design.md,
        "Releasing at scale").

        Safe from any number of callers at once: the room is decided and the jobs moved
        in one script. The loop asks every 50 ms, mostly of queues with nothing held: an
        ``EXISTS`` of the tenant set answers that for a fraction of the script's cost.
        """
        if tenants is None and not await self.conn.guard(
            self.conn.client().exists(f"{limits_key(self.conn.prefix, queue)}:tenants")
        ):
            return Released()
        script = self.conn.script(release_held_script())
        reply = await self.conn.guard(
            script(
                keys=release_keys(self.conn.prefix, queue),
                **release_args(self.conn.prefix, queue, tenants, self.fairness_by, "release"),
            )
        )
        return parse_released(reply)

    async def set_paused(self, queue: str, tenant_id: str, paused: bool) -> int:
        """Pause (then pull back the tenant's jobs no worker has taken, so none of them
        starts once this returns) or resume (then release what has room). Returns the
        jobs pulled back or released."""
        key = f"{limits_key(self.conn.prefix, queue)}:paused"
        client = self.conn.client()
        script = self.conn.script(release_held_script())
        keys = release_keys(self.conn.prefix, queue)
        if paused:
            await self.conn.guard(client.hset(key, tenant_id, 1))
            await self._sync_holds(queue)
            reply = await self.conn.guard(
                script(
                    keys=keys,
                    **release_args(self.conn.prefix, queue, [tenant_id], "time", "pullback"),
                )
            )
            return int(reply[0]) + await self._hold_untracked(queue, tenant_id)
        # Until its held jobs are out, it drains with what the others leave (a few
        # takeable at a time): its backlog does not stand ahead of their new arrivals.
        base = limits_key(self.conn.prefix, queue)
        if await self.conn.guard(client.llen(f"{base}:held:{tenant_id}")):
            await self.conn.guard(client.hset(f"{base}:catchup", tenant_id, 1))
        await self.conn.guard(client.hdel(key, tenant_id))
        await self._sync_holds(queue)
        return (await self.release(queue, [tenant_id])).released

    async def probe(self, queue: str, tenant_id: str) -> str | None:
        """Release one held job of a paused tenant, the first in its order, at its fair
        place (an open breaker's probe); the tenant stays paused. Returns the job's id,
        ``None`` when none was released (nothing held)."""
        script = self.conn.script(release_held_script())
        args = release_args(self.conn.prefix, queue, [tenant_id], self.fairness_by, "probe")
        args["most"] = 1
        reply = await self.conn.guard(script(keys=release_keys(self.conn.prefix, queue), **args))
        job_id = _text(reply[6]) if len(reply) > 6 else ""
        return job_id or None

    async def job_outcome(self, queue: str, job_id: str) -> JobOutcome:
        """Where one job stands in BullMQ's own keys (one round trip)."""
        client = self.conn.client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.zscore(self.conn.key(queue, "completed"), job_id)
            pipe.zscore(self.conn.key(queue, "failed"), job_id)
            pipe.hmget(self.conn.key(queue, job_id), ["atm", "attemptsMade", "timestamp"])
            completed, failed, fields = await self.conn.guard(pipe.execute())
        made = fields[0] if fields[0] is not None else fields[1]
        return JobOutcome(
            exists=fields[2] is not None,
            completed=completed is not None,
            failed=failed is not None,
            attempts_made=int(_text(made)) if made is not None else 0,
        )

    async def _sync_holds(self, queue: str) -> None:
        """Tell the add script (through the flag its clock read carries) whether any tenant
        of ``queue`` is paused or catching up."""
        script = self.conn.script(release_held_script())
        await self.conn.guard(
            script(
                keys=release_keys(self.conn.prefix, queue),
                **release_args(self.conn.prefix, queue, None, "time", "holds"),
            )
        )

    async def _hold_untracked(self, queue: str, tenant_id: str) -> int:
        """Hold a pausing (or newly limited) tenant's jobs that fairqueue never held
        (added before it had limits): its takeable jobs, a page of the prioritized set per
        call in score order, then a page of BullMQ's wait list per call; and its delayed
        jobs not held, a page of the delayed set per call, each held until it is due. So
        none of them starts once the pause returns (or beyond the new limit), whether it
        was waiting or delayed. Rare and bounded per call; O(backlog) overall."""
        base = limits_key(self.conn.prefix, queue)
        first = await self.conn.guard(self.conn.client().lindex(f"{base}:held:{tenant_id}", 0))
        script = self.conn.script(release_held_script())
        keys = release_keys(self.conn.prefix, queue)
        args = release_args(self.conn.prefix, queue, [tenant_id], "time", "scan")
        args["most"] = SCAN_PAGE
        moved = 0
        for where in ("prioritized", "wait", "delayed"):
            score, member = "", ""
            while True:
                scan = {"cursor_score": score, "cursor_member": member, "where": where}
                reply = await self.conn.guard(
                    script(keys=keys, **args, **scan, boundary=first or "")
                )
                moved += int(reply[0])
                score, member = str(reply[1]), str(reply[2])
                if int(reply[3]):
                    break
        return moved

    async def set_limits(self, queue: str, tenant_id: str, limits: TenantLimits) -> int:
        """Store a tenant's limits (an admin edit: the release step uses them before the
        tenant's next enqueue would), or forget them when it has none. A tenant that had
        none in ``queue`` has its takeable jobs added before then held too (as a pause
        does), so the new limit holds for its whole backlog, not only for later jobs:
        returns the jobs so held."""
        key = limits_key(self.conn.prefix, queue)
        client = self.conn.client()
        # Visited at the release step's next call: new limits may give it room.
        await self.conn.guard(client.zadd(f"{key}:due", {tenant_id: 0}, lt=True))
        if not limits.holds:
            await self.conn.guard(client.hdel(key, tenant_id))
            return 0
        if not await self.conn.guard(client.hset(key, tenant_id, limits.encoded())):
            return 0  # had limits here already: its jobs since then are tracked
        return await self._hold_untracked(queue, tenant_id)

    async def set_weight(self, queue: str, tenant_id: str, weight: int) -> int:
        """A tenant's new weight, counted at once by each of its flows with work in
        ``queue`` and by their levels' totals (``reweight.lua``): its next jobs and the
        other tenants' of its levels are placed by it. Its waiting jobs are placed again
        at the new weight (``reweight_page.lua``): the first pages here, the rest at the
        loop's next ticks (:meth:`replace_pages`). Returns the flows changed (0: none had
        work, or none counted another weight)."""
        while True:
            reply = await self._replace_script(
                queue, mode="begin", who=tenant_id, amount=int(weight)
            )
            if not reply or _text(reply[0]) != "busy":
                break
            # A change of the same flow still in progress: its jobs are placed first.
            while not await self._replace_page(queue, _text(reply[1])):
                pass
        script = self.conn.script(plain_script("reweight"))
        changed = await self.conn.guard(
            script(
                keys=[fair_key(self.conn.prefix, queue, name) for name in ("state", "fweights")],
                tenant=tenant_id,
                weight=int(weight),
            )
        )
        await self.replace_pages(queue, pages=REPLACE_PAGES_AT_ONCE)
        return int(changed)

    async def replace_pages(self, queue: str, *, pages: int) -> bool:
        """Go on with the weight changes whose waiting jobs are being placed again, at
        most ``pages`` pages of :data:`REPLACE_PAGE` jobs. Returns whether any is left."""
        flows = await self.conn.guard(
            self.conn.client().hkeys(fair_key(self.conn.prefix, queue, "rw"))
        )
        for flow in flows:
            while pages > 0:
                pages -= 1
                if await self._replace_page(queue, _text(flow)):
                    break
            else:
                return True
        return False

    async def _replace_page(self, queue: str, flow: str) -> bool:
        prefix = f"{self.conn.prefix}:{queue}:"
        reply = await self._replace_script(
            queue, mode="page", who=flow, amount=REPLACE_PAGE, prefix=prefix
        )
        return bool(int(reply[2]))

    async def _replace_script(self, queue: str, **args: Any) -> Any:
        keys = [
            self.conn.key(queue, "prioritized"),
            *(fair_key(self.conn.prefix, queue, name) for name in ("state", "flows")),
            *(fair_key(self.conn.prefix, queue, name) for name in ("fweights", "rw")),
        ]
        script = self.conn.script(plain_script("reweight_page"))
        return await self.conn.guard(script(keys, **args))

    async def retry_failed(
        self,
        queue: str,
        tenant_id: str | None,
        *,
        limit: int,
        max_wait_ms: int,
        max_payload_bytes: int,
    ) -> tuple[int, int]:
        """Retry up to ``limit`` failed jobs of ``queue`` (of ``tenant_id`` only, unless
        ``None``), oldest failure first, a page of :data:`SCAN_PAGE` per script call: each
        placed by the fair clock, or held when its tenant has limits or is paused (then
        released within them). Returns (retried, of which held)."""
        script = self.conn.script(retry_failed_script())
        keys = [
            *(f"{self.conn.prefix}:{queue}:{name}" for name in _RETRY_KEYS),
            *fair_keys(self.conn.prefix, queue),
            limits_key(self.conn.prefix, queue),
        ]
        score, member, retried, held = "", "", 0, 0
        while retried < limit:
            reply = await self.conn.guard(
                script(
                    keys=keys,
                    prefix=f"{self.conn.prefix}:{queue}:",
                    fairness=self.fairness_by,
                    tenant=tenant_id or "",
                    page=min(SCAN_PAGE, limit - retried),
                    from_score=score,
                    from_member=member,
                    bound=max_wait_ms,
                    max_payload=max_payload_bytes,
                )
            )
            retried += int(reply[0])
            held += int(reply[1])
            score, member = _text(reply[2]), _text(reply[3])
            if int(reply[4]):
                break
        if held:
            await self.release(queue, None if tenant_id is None else [tenant_id])
        return retried, held

    async def synced(self, queue: str) -> bool:
        """Whether Redis holds the database's copy of ``queue``'s limits and pauses (the
        mark :meth:`rebuild` leaves; gone when Redis lost fairqueue's keys)."""
        base = limits_key(self.conn.prefix, queue)
        return bool(await self.conn.guard(self.conn.client().exists(f"{base}:synced")))

    async def rebuild(self, queue: str, limits: Mapping[str, str], paused: Collection[str]) -> int:
        """Bring the database's limits and pauses to ``queue`` (``limits``: tenant ->
        :meth:`TenantLimits.encoded`, ``paused``: the tenants it says are paused), then
        leave the mark :meth:`synced` reads. A tenant paused in the database and not in
        Redis is paused here as ``pause_tenant`` does (its takeable jobs pulled back, its
        untracked ones held); a pause an add made while Redis had forgotten (``'add'``)
        that the database does not confirm is lifted. A pause set by ``pause_tenant`` is
        never lifted here (its database write may not have committed yet). Returns the
        jobs pulled back or released."""
        base = limits_key(self.conn.prefix, queue)
        client = self.conn.client()
        items = list(limits.items())
        for start in range(0, len(items), _REBUILD_CHUNK):
            chunk: Mapping[Any, Any] = dict(items[start : start + _REBUILD_CHUNK])
            await self.conn.guard(client.hset(base, mapping=chunk))
        current = {
            _text(tenant): _text(how)
            for tenant, how in (await self.conn.guard(client.hgetall(f"{base}:paused"))).items()
        }
        moved = 0
        for tenant in sorted(set(paused)):
            if tenant not in current:
                moved += await self.set_paused(queue, tenant, True)
            elif current[tenant] == "add":  # the database confirms it
                await self.conn.guard(client.hset(f"{base}:paused", tenant, 1))
        for tenant, how in sorted(current.items()):
            if how == "add" and tenant not in paused:
                moved += await self.set_paused(queue, tenant, False)
        await self.conn.guard(client.set(f"{base}:synced", 1))
        # Every tenant visited again (a sweep, a page a step): the new limits may give room.
        await self.conn.guard(client.set(f"{base}:sweep", 0))
        return moved

    async def waiting(self, queue: str, tenant_id: str) -> int:
        """A tenant's jobs waiting in ``queue`` as ``max_waiting`` counts them: every
        unfinished job that is not running (held, delayed, released and not taken yet, or
        waiting out a retry's backoff), and the jobs that batches being added have
        reserved room for (``tenant_limits.lua``'s ``fqWaitingOf``)."""
        base = limits_key(self.conn.prefix, queue)
        client = self.conn.client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.llen(f"{base}:held:{tenant_id}")
            pipe.zcard(f"{base}:later:{tenant_id}")
            pipe.smembers(f"{base}:out:{tenant_id}")
            pipe.hvals(f"{base}:resv:{tenant_id}")
            held, later, out, reserved = await self.conn.guard(pipe.execute())
        waiting = int(held) + int(later)
        now_ms = int(time.time() * 1000)
        for entry in reserved:
            left, _, expires = _text(entry).partition(":")
            if left.isdigit() and expires.isdigit() and int(expires) > now_ms:
                waiting += int(left)
        out = list(out)
        if not out:
            return waiting
        async with client.pipeline(transaction=False) as pipe:
            pipe.zmscore(self.conn.key(queue, "prioritized"), out)
            pipe.zmscore(self.conn.key(queue, "delayed"), out)
            takeable, delayed = await self.conn.guard(pipe.execute())
        return waiting + sum(
            1 for a, b in zip(takeable, delayed, strict=True) if a is not None or b is not None
        )

    async def _walk_holding(self, queue: str, top: int) -> tuple[int, int, list[tuple[str, int]]]:
        """Every tenant with held jobs in ``queue``, counted inside Redis a page of
        :data:`READ_CHUNK` tenants per script call (one connection, no reply per tenant):
        (tenants holding, jobs held, the ``top`` holding the most, most first)."""
        script = self.conn.script(plain_script("limits_walk"))
        keys = [limits_key(self.conn.prefix, queue)]
        cursor, holding, held = "0", 0, 0
        best: list[tuple[str, int]] = []
        while True:
            reply = await self.conn.guard(
                script(keys=keys, cursor=cursor, count=READ_CHUNK, top=top)
            )
            cursor = _text(reply[0])
            holding += int(reply[2])
            held += int(reply[3])
            pairs = zip(reply[4::2], reply[5::2], strict=True)
            best += [(_text(tenant), int(count)) for tenant, count in pairs]
            best = sorted(best, key=lambda item: (-item[1], item[0]))[:top]
            if cursor == "0":
                return holding, held, best

    async def held_count(self, queue: str) -> int:
        """Jobs held in ``queue``, over every tenant (summed a page at a time in Redis)."""
        return (await self._walk_holding(queue, 0))[1]

    async def held_job_ids_of(
        self, queue: str, tenant_ids: Sequence[str], count: int = 20
    ) -> dict[str, list[str]]:
        """:meth:`held_job_ids` of several tenants in one pipeline (one connection, one
        round trip), not one read each at once (which exhausted the client's pool)."""
        if not tenant_ids:
            return {}
        base = limits_key(self.conn.prefix, queue)
        async with self.conn.client().pipeline(transaction=False) as pipe:
            for tenant in tenant_ids:
                pipe.lrange(f"{base}:held:{tenant}", 0, count - 1)
            replies = await self.conn.guard(pipe.execute())
        return {tenant: list(ids) for tenant, ids in zip(tenant_ids, replies, strict=True)}

    async def status(
        self, queue: str, *, listed: int = STATUS_TENANTS, held_ids: int = STATUS_HELD_IDS
    ) -> LimitsStatus:
        """The dashboard's view of ``queue``'s limited tenants, bounded whatever their
        number: exact totals (jobs held and tenants holding them, summed inside Redis a
        page at a time; tenants limited and paused, by HLEN) and at most ``listed``
        tenants read in full (one script call): paused tenants first (they are what an
        operator acts on), then those holding the most jobs, then others with limits.
        A snapshot over a few calls, not a transaction: jobs moving meanwhile may be
        counted on either side of their move."""
        base = limits_key(self.conn.prefix, queue)
        client = self.conn.client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.hlen(base)
            pipe.hlen(f"{base}:paused")
            pipe.hscan(f"{base}:paused", 0, count=listed)
            limited, paused_count, (_, paused) = await self.conn.guard(pipe.execute())
        chosen = sorted(_text(tenant) for tenant in paused)[:listed]
        holding, held_total, most = await self._walk_holding(queue, listed)
        seen = set(chosen)
        chosen += [tenant for tenant, _ in most if tenant not in seen][: listed - len(chosen)]
        if len(chosen) < listed and limited:
            chosen += await self._some_limited(queue, listed - len(chosen), set(chosen))
        states: list[TenantState] = []
        if chosen:
            script = self.conn.script(plain_script("limits_rows"))
            rows = await self.conn.guard(
                script(keys=[base, self.conn.key(queue, "active")], shown=held_ids, tenants=chosen)
            )
            for tenant, row in zip(chosen, rows, strict=True):
                encoded, is_paused, catchup, held, occupied, running, ids = row
                states.append(
                    TenantState(
                        tenant_id=tenant,
                        running=int(running),
                        occupied=int(occupied),
                        held=int(held),
                        limits=TenantLimits.from_encoded(
                            _text(encoded) or None, paused=bool(int(is_paused))
                        ),
                        catching_up=bool(int(catchup)),
                        held_jobs=tuple(_text(job_id) for job_id in ids),
                    )
                )
        if holding == len(most) and set(chosen) >= {tenant for tenant, _ in most}:
            # Every tenant holding jobs is listed: the totals are the rows' own, read in
            # one call, so they add up (the walk ran a moment earlier).
            held_total = sum(state.held for state in states)
            holding = sum(1 for state in states if state.held)
        return LimitsStatus(
            tenants=states,
            held_total=held_total,
            holding=holding,
            limited=int(limited),
            paused=int(paused_count),
        )

    async def _some_limited(self, queue: str, count: int, taken: set[str]) -> list[str]:
        """Up to ``count`` tenants with limits not in ``taken``, by id among those read: a
        few HSCAN pages of the limits hash, never all of it (``taken`` holds at most
        :data:`STATUS_TENANTS`, so reading ``count`` + that many entries is enough)."""
        base = limits_key(self.conn.prefix, queue)
        client = self.conn.client()
        found: set[str] = set()
        cursor: int = 0
        while len(found) < count:
            cursor, page = await self.conn.guard(client.hscan(base, cursor, count=count))
            found.update(t for t in map(_text, page) if t not in taken)
            if not int(cursor):
                break
        return sorted(found)[:count]

    async def tenant_states(self, queue: str) -> list[TenantState]:
        """The tenants :meth:`status` lists (at most :data:`STATUS_TENANTS`)."""
        return (await self.status(queue)).tenants

    async def held_job_ids(self, queue: str, tenant_id: str, count: int = 20) -> list[str]:
        """The first ``count`` held jobs of a tenant, in the order they will be released."""
        base = limits_key(self.conn.prefix, queue)
        found = await self.conn.guard(
            self.conn.client().lrange(f"{base}:held:{tenant_id}", 0, count - 1)
        )
        return [_text(job_id) for job_id in found]
