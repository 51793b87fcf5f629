"""What the dashboard and the console read of per-tenant limits in Redis: a tenant's
waiting count as ``max_waiting`` counts it, the held totals, and the limited tenants
listed. Bounded whatever the number of tenants: totals are summed inside Redis a page at
a time, and at most :data:`STATUS_TENANTS` tenants are read in full.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from fairqueue.broker.common import as_text, limits_key
from fairqueue.broker.connection import BrokerPart
from fairqueue.broker.scripts import plain_script
from fairqueue.scheduling.hierarchy import ACCOUNT_MARK
from fairqueue.scheduling.limits import TenantLimits
from fairqueue.scheduling.wire import decoded_limits

#: Tenants one call of the dashboard's walk over the tenants holding jobs reads (one
#: LLEN each inside Redis: about 2 ms a call, so other clients wait at most that long).
READ_CHUNK: Final = 1_000
#: Tenants the dashboard's read lists at most.
STATUS_TENANTS: Final = 200
#: Held job ids the dashboard's read returns per listed tenant.
STATUS_HELD_IDS: Final = 10


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


class LimitReads(BrokerPart):
    """The reads of one prefix's limited tenants (:class:`.limit_store.LimitStore` adds the
    writes)."""

    async def is_paused(self, queue: str, tenant_id: str) -> bool:
        """Whether ``tenant_id`` is paused in ``queue`` (for any reason). One round trip."""
        base = limits_key(self.conn.prefix, queue)
        return bool(await self.conn.guard(self.conn.client().hexists(f"{base}:paused", tenant_id)))

    async def waiting(self, queue: str, tenant_id: str) -> int:
        """A tenant's jobs waiting in ``queue`` as ``max_waiting`` counts them (an
        account's, over all its tenants, for ``ACCOUNT_MARK + account_id``): every
        unfinished job that is not running (held, delayed, released and not taken yet, or
        waiting out a retry's backoff), and the jobs that batches being added have
        reserved room for (``tenant_limits.lua``'s ``fqWaitingOf``)."""
        base = limits_key(self.conn.prefix, queue)
        client = self.conn.client()
        async with client.pipeline(transaction=False) as pipe:
            if tenant_id.startswith(ACCOUNT_MARK):  # an account's, over all its tenants
                account = tenant_id[len(ACCOUNT_MARK) :]
                pipe.scard(f"{base}:aheld:{account}")  # held until due included
                pipe.smembers(f"{base}:aout:{account}")
                pipe.hvals(f"{base}:resv:{tenant_id}")
                held, out, reserved = await self.conn.guard(pipe.execute())
                later = 0
            else:
                pipe.llen(f"{base}:held:{tenant_id}")
                pipe.zcard(f"{base}:later:{tenant_id}")
                pipe.smembers(f"{base}:out:{tenant_id}")
                pipe.hvals(f"{base}:resv:{tenant_id}")
                held, later, out, reserved = await self.conn.guard(pipe.execute())
        waiting = int(held) + int(later)
        now_ms = int(time.time() * 1000)
        for entry in reserved:
            left, _, expires = as_text(entry).partition(":")
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
            cursor = as_text(reply[0])
            holding += int(reply[2])
            held += int(reply[3])
            pairs = zip(reply[4::2], reply[5::2], strict=True)
            best += [(as_text(tenant), int(count)) for tenant, count in pairs]
            best = sorted(best, key=lambda item: (-item[1], item[0]))[:top]
            if cursor == "0":
                return holding, held, best

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
        chosen = sorted(as_text(tenant) for tenant in paused)[:listed]
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
                        limits=decoded_limits(
                            as_text(encoded) or None, paused=bool(int(is_paused))
                        ),
                        catching_up=bool(int(catchup)),
                        held_jobs=tuple(as_text(job_id) for job_id in ids),
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
            found.update(t for t in map(as_text, page) if t not in taken)
            if not int(cursor):
                break
        return sorted(found)[:count]
