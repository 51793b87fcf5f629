"""Per-tenant limits in Redis: releasing held jobs, pausing, and what the dashboard reads.

The add script holds a limited tenant's jobs (``lua/include/tenant_limits.lua``); this module runs
``lua/release_held.lua``, the one script that decides a tenant's room and moves its held
jobs to their fair places, so every caller (the loop, ``fairqueue_worker``, an enqueue)
releases through the same atomic step and no job is released twice.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from fairqueue.broker.common import as_text, fair_key, fair_keys, limits_key
from fairqueue.broker.connection import Connection
from fairqueue.broker.limit_reads import LimitReads
from fairqueue.broker.scripts import plain_script
from fairqueue.scheduling.limits import TenantLimits
from fairqueue.scheduling.wire import encoded_limits

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
#: Tenants' limits one call of a rebuild's ``limits_restore.lua`` writes (and one HSCAN
#: page of its read of the copy).
_REBUILD_CHUNK: Final = 1_000
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
class CopyRead:
    """A queue's copy of the limits as a rebuild read it before reading the database:
    tenant -> encoded limits, tenant -> its count of pause changes (``L:pchg``), account
    -> encoded limits (``L:acc``) and tenant -> its account (``L:tacct``)."""

    limits: dict[str, str]
    pause_changes: dict[str, str]
    accounts: dict[str, str] = field(default_factory=dict)
    tenant_accounts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AccountCopy:
    """The database's account limits as a rebuild brings them: account -> encoded limits
    (those with limits), and their tenants -> account."""

    limits: Mapping[str, str]
    tenants: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """Where a job stands: whether its hash exists, whether it is in BullMQ's completed
    or failed set, and its attempts made (each failed attempt adds one)."""

    exists: bool
    completed: bool
    failed: bool
    attempts_made: int


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


def parse_released(reply: Sequence[Any]) -> Released:
    released, held, wake, by_active, by_rate, by_paused = (int(value) for value in reply)
    return Released(released, held, None if wake < 0 else wake, by_active, by_rate, by_paused)


class LimitStore(LimitReads):
    """Releasing, pausing and rebuilding the held jobs and limits of one prefix's queues
    (the reads the dashboard makes are :class:`.limit_reads.LimitReads`'s).

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
        in one script. The loop asks every 50 ms, mostly of queues with nothing held: the
        ``EXISTS`` of the tenant set answers that for a fraction of the script's cost, and
        of BullMQ's wait list and the limits hash whether a limited tenant's jobs may wait
        there outside its limits (``Queue.retryJobs`` of its failed jobs), which the call
        takes back; one round trip.
        """
        if tenants is None:
            base = limits_key(self.conn.prefix, queue)
            async with self.conn.client().pipeline(transaction=False) as pipe:
                pipe.exists(f"{base}:tenants")
                pipe.exists(base)
                pipe.exists(self.conn.key(queue, "wait"))
                held, limited, waiting = await self.conn.guard(pipe.execute())
            if not held and not (limited and waiting):
                return Released()
        script = self.conn.script(plain_script("release_held"))
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
        base = limits_key(self.conn.prefix, queue)
        key = f"{base}:paused"
        client = self.conn.client()
        script = self.conn.script(plain_script("release_held"))
        keys = release_keys(self.conn.prefix, queue)
        await self.conn.guard(client.hincrby(f"{base}:pchg", tenant_id, 1))  # see rebuild
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
        if await self.conn.guard(client.llen(f"{base}:held:{tenant_id}")):
            await self.conn.guard(client.hset(f"{base}:catchup", tenant_id, 1))
        await self.conn.guard(client.hdel(key, tenant_id))
        await self._sync_holds(queue)
        return (await self.release(queue, [tenant_id])).released

    async def probe(self, queue: str, tenant_id: str) -> str | None:
        """Release one held job of a paused tenant, the first in its order, at its fair
        place (an open breaker's probe); the tenant stays paused. Returns the job's id,
        ``None`` when none was released (nothing held)."""
        script = self.conn.script(plain_script("release_held"))
        args = release_args(self.conn.prefix, queue, [tenant_id], self.fairness_by, "probe")
        args["most"] = 1
        reply = await self.conn.guard(script(keys=release_keys(self.conn.prefix, queue), **args))
        job_id = as_text(reply[6]) if len(reply) > 6 else ""
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
            attempts_made=int(as_text(made)) if made is not None else 0,
        )

    async def _sync_holds(self, queue: str) -> None:
        """Tell the add script (through the flag its clock read carries) whether any tenant
        of ``queue`` is paused or catching up."""
        script = self.conn.script(plain_script("release_held"))
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
        script = self.conn.script(plain_script("release_held"))
        keys = release_keys(self.conn.prefix, queue)
        args = release_args(self.conn.prefix, queue, [tenant_id], "time", "scan")
        args["most"] = SCAN_PAGE
        moved = 0
        for where in ("prioritized", "wait", "delayed"):
            score, member, ties = "", "", 0
            while True:
                scan = {"cursor_score": score, "cursor_member": member, "where": where}
                reply = await self.conn.guard(
                    script(keys=keys, **args, **scan, boundary=first or "", cursor_ties=ties)
                )
                moved += int(reply[0])
                score, member = as_text(reply[1]), as_text(reply[2])
                ties = int(reply[4]) if len(reply) > 4 else 0
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
        if not await self.conn.guard(client.hset(key, tenant_id, encoded_limits(limits))):
            return 0  # had limits here already: its jobs since then are tracked
        return await self._hold_untracked(queue, tenant_id)

    async def set_account_limits(
        self, queue: str, account_id: str, limits: TenantLimits, tenants: Sequence[str]
    ) -> None:
        """Store an account's limits (its save: one write for the account, not one per
        tenant), or forget them when it has none; ``tenants``, those of its tenants with
        held jobs here, are visited at the release step's next call (new limits may give
        them room)."""
        key = limits_key(self.conn.prefix, queue)
        client = self.conn.client()
        if limits.max_active is None and limits.rate_max is None and limits.max_waiting is None:
            await self.conn.guard(client.hdel(f"{key}:acc", account_id))
        else:
            await self.conn.guard(client.hset(f"{key}:acc", account_id, encoded_limits(limits)))
        if tenants:
            await self.conn.guard(client.zadd(f"{key}:due", dict.fromkeys(tenants, 0), lt=True))

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
            if not reply or as_text(reply[0]) != "busy":
                break
            # A change of the same flow still in progress: its jobs are placed first.
            while not await self._replace_page(queue, as_text(reply[1])):
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
                if await self._replace_page(queue, as_text(flow)):
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
        job_id: str = "",
    ) -> tuple[int, int]:
        """Retry up to ``limit`` failed jobs of ``queue`` (of ``tenant_id`` only, unless
        ``None``; the failed job ``job_id`` only, when given), oldest failure first, a page
        of :data:`SCAN_PAGE` per script call: each placed by the fair clock, or held when
        its tenant has limits or is paused (then released within them). Returns
        (retried, of which held)."""
        script = self.conn.script(plain_script("retry_failed"))
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
                    job=job_id,
                )
            )
            retried += int(reply[0])
            held += int(reply[1])
            score, member = as_text(reply[2]), as_text(reply[3])
            if int(reply[4]) or job_id:
                break
        if held:
            await self.release(queue, None if tenant_id is None else [tenant_id])
        return retried, held

    async def synced(self, queue: str) -> bool:
        """Whether Redis holds the database's copy of ``queue``'s limits and pauses (the
        mark :meth:`rebuild` leaves; gone when Redis lost fairqueue's keys)."""
        base = limits_key(self.conn.prefix, queue)
        return bool(await self.conn.guard(self.conn.client().exists(f"{base}:synced")))

    async def read_copy(self, queue: str) -> CopyRead:
        """``queue``'s copy of the tenants' limits and its pause changes as they stand,
        read in pages: what :meth:`rebuild` compares against, read before the database."""
        base = limits_key(self.conn.prefix, queue)
        return CopyRead(
            await self._read_hash(base),
            await self._read_hash(f"{base}:pchg"),
            await self._read_hash(f"{base}:acc"),
            await self._read_hash(f"{base}:tacct"),
        )

    async def _read_hash(self, key: str) -> dict[str, str]:
        client = self.conn.client()
        entries: dict[str, str] = {}
        cursor = 0
        while True:
            cursor, page = await self.conn.guard(client.hscan(key, cursor, count=_REBUILD_CHUNK))
            fields = cast("dict[Any, Any]", page)  # HSCAN without NOVALUES: field -> value
            entries.update((as_text(field), as_text(value)) for field, value in fields.items())
            if not int(cursor):
                return entries

    async def _restore(
        self, key: str, wanted: Mapping[str, str], before: Mapping[str, str]
    ) -> None:
        """``wanted``'s entries written to hash ``key`` where it still holds what it held
        in ``before`` (``lua/limits_restore.lua``), a chunk a call."""
        restore = self.conn.script(plain_script("limits_restore"))
        rows = [(name, before.get(name, ""), value) for name, value in wanted.items()]
        for start in range(0, len(rows), _REBUILD_CHUNK):
            chunk = rows[start : start + _REBUILD_CHUNK]
            await self.conn.guard(
                restore(keys=[key], rows=[value for row in chunk for value in row])
            )

    async def rebuild(
        self,
        queue: str,
        limits: Mapping[str, str],
        paused: Collection[str],
        before: CopyRead,
        accounts: AccountCopy | None = None,
    ) -> int:
        """Bring the database's limits and pauses to ``queue`` (``limits``: tenant ->
        :func:`~fairqueue.scheduling.wire.encoded_limits`, ``paused``: the tenants it says
        are paused), then leave the mark :meth:`synced` reads.

        ``accounts``: the accounts' limits and their tenants, brought back the same way
        (an account's limits then hold again before any of its tenants enqueues).

        ``before`` is the copy as :meth:`read_copy` read it before the database was read:
        what changed since is newer than the rows and stays. A tenant's limits an add or a
        saved plan wrote meanwhile are kept (``lua/limits_restore.lua``); a tenant paused
        or resumed meanwhile is left as it is. Otherwise a tenant paused in the database
        and not in Redis is paused here as ``pause_tenant`` does (its takeable jobs
        pulled back, its untracked ones held); a pause an add made while Redis had
        forgotten (``'add'``) that the database does not confirm is lifted. A pause set by
        ``pause_tenant`` is never lifted here (its database write may not have committed
        yet). Returns the jobs pulled back or released."""
        base = limits_key(self.conn.prefix, queue)
        client = self.conn.client()
        await self._restore(base, limits, before.limits)
        if accounts is not None:  # account limits, and which tenants they hold
            await self._restore(f"{base}:acc", accounts.limits, before.accounts)
            await self._restore(f"{base}:tacct", accounts.tenants, before.tenant_accounts)
        current = {
            as_text(tenant): as_text(how)
            for tenant, how in (await self.conn.guard(client.hgetall(f"{base}:paused"))).items()
        }
        moved = 0
        for tenant in sorted(set(paused)):
            if tenant not in current:
                changes = await self.conn.guard(client.hget(f"{base}:pchg", tenant))
                if (as_text(changes) if changes else None) == before.pause_changes.get(tenant):
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
