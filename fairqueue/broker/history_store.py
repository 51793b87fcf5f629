"""The dashboard's history in Redis: the loop records BullMQ's events stream a page at a
time (:mod:`fairqueue.broker.events`), the dashboard reads the buckets back.

Every key is ``<prefix>:<queue>:fq:hist...``, beside the queue's own keys (one hash tag
on Redis Cluster), and every bucket expires after the retention, so the history costs a
bounded amount of memory whatever the traffic: per bucket one small hash and a zset of at
most ``TENANTS_PER_BUCKET`` tenants.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairqueue.broker.connection import BrokerPart, guarded
from fairqueue.broker.events import PageReader, RecordedPage
from fairqueue.broker.lock_store import Fence
from fairqueue.broker.scripts import plain_script
from fairqueue.scheduling.attempts import TENANT_BUCKET_S, tenant_bucket
from fairqueue.scheduling.shares import BUCKET_S, LEVEL_NAMES, RETENTION_S
from fairqueue.scheduling.usage import Ledger

#: What the backlogs need of a bucket before the window: jobs started and became ready.
_COUNT_FIELDS = [f"{kind}:{level}" for kind in ("s", "a") for level in LEVEL_NAMES]


@dataclass(frozen=True, slots=True)
class HistoryRead:
    """Raw buckets as stored: start second -> (hash fields, tenant entries)."""

    buckets: dict[int, tuple[dict[str, str], list[tuple[str, float]]]]
    #: When recording began (ms), ``None`` if it never did.
    since_ms: int | None


class HistoryStore(BrokerPart):
    """The history the pass records from BullMQ's events stream, and its reads."""

    async def record_history_page(
        self,
        queue: str,
        *,
        fence: Fence,
        max_wait_ms: int,
        page_size: int = 1_000,
        max_data_bytes: int = 65_536,
        byte_budget: int = 1_048_576,
        fairness_by: str = "time",
        ledger: Ledger | None = None,
    ) -> RecordedPage:
        """Record the next page of ``queue``'s events stream (fenced by the lock).

        The page is read and worked out here, in the loop's process, and written by one
        script, once or not at all (see :mod:`fairqueue.scheduling.attempts` for why):
        at most ``page_size`` entries and about ``byte_budget`` bytes of job data; a
        job whose data is over ``max_data_bytes`` counts as started at an unknown level.

        ``ledger``: count the page's attempts into the usage ledger too, in the same
        write (:mod:`fairqueue.scheduling.usage`).

        Raises:
            LockLostError: another rebalancer holds the lock; nothing was recorded.
        """
        return await self.conn.guard(
            PageReader(self.conn, queue, fence).record(
                max_wait_ms=max_wait_ms,
                page_size=page_size,
                max_data_bytes=max_data_bytes,
                byte_budget=byte_budget,
                by_time=fairness_by == "time",
                ledger=ledger,
            )
        )

    @guarded
    async def sample_virtual_time(self, queue: str) -> None:
        """Keep where ``queue``'s virtual time stands now in the current history bucket
        (``lua/vt_sample.lua``): the start estimate reads the pace it really moved at over
        the rate's window. One O(log n) read of the head and a few writes to one hash."""
        await self.conn.script(plain_script("vt_sample"))(
            keys=[
                self.conn.fair_key(queue, "state"),
                self.conn.key(queue, "prioritized"),
                self.conn.key(queue, "wait"),
                self.conn.fair_key(queue, "hist"),
            ],
            bucket_s=BUCKET_S,
            ttl=RETENTION_S + 2 * BUCKET_S,
        )

    @guarded
    async def read_tenant_history(
        self, queue: str, tenant_id: str, *, now_s: int, window_s: int = RETENTION_S
    ) -> dict[int, dict[str, str]]:
        """A tenant's buckets of the last ``window_s`` (start second -> fields: its waits'
        bins and worker ms per level), one pipelined HGETALL per bucket."""
        prefix = self.conn.fair_key(queue, "hist:")
        last = now_s // TENANT_BUCKET_S * TENANT_BUCKET_S
        starts = list(range(last - window_s + TENANT_BUCKET_S, last + 1, TENANT_BUCKET_S))
        async with self.conn.client().pipeline(transaction=False) as pipe:
            for start in starts:
                pipe.hgetall(prefix + tenant_bucket(start, tenant_id))
            replies: list[Any] = await pipe.execute()
        return {start: fields for start, fields in zip(starts, replies, strict=True) if fields}

    @guarded
    async def recent_worker_shares(
        self,
        queue: str,
        flows: list[tuple[str, str]],
        *,
        now_s: int,
        running_ms: Mapping[tuple[str, str], float],
    ) -> dict[tuple[str, str], float]:
        """Each of ``flows``' ((level, tenant)) share of its level's worker time over its
        tenant buckets of this minute and the last, with what the attempts running now
        have run so far (``running_ms``, every running flow's: the history records an
        attempt when it ends), for the noisy rule by time. One pipelined round trip: two
        HGETs a flow and an HMGET per history bucket of that span (at most 13)."""
        if not flows:
            return {}
        prefix = self.conn.fair_key(queue, "hist:")
        first = now_s // TENANT_BUCKET_S * TENANT_BUCKET_S - TENANT_BUCKET_S
        minutes = (first, first + TENANT_BUCKET_S)
        starts = range(first, now_s // BUCKET_S * BUCKET_S + 1, BUCKET_S)
        levels = sorted({level for level, _ in flows})
        async with self.conn.client().pipeline(transaction=False) as pipe:
            for level, tenant in flows:
                for minute in minutes:
                    pipe.hget(prefix + tenant_bucket(minute, tenant), f"t:{level}")
            for start in starts:
                pipe.hmget(f"{prefix}{start}", [f"t:{level}" for level in levels])
            replies: list[Any] = await pipe.execute()
        level_ms = dict.fromkeys(levels, 0.0)
        for row in replies[2 * len(flows) :]:
            for level, value in zip(levels, row, strict=True):
                level_ms[level] += float(value or 0)
        for (level, _), ms in running_ms.items():
            if level in level_ms:
                level_ms[level] += ms
        shares = {}
        for i, (level, tenant) in enumerate(flows):
            ms = sum(float(v or 0) for v in replies[2 * i : 2 * i + 2])
            ms += running_ms.get((level, tenant), 0.0)
            if ms > 0 and level_ms[level] > 0:
                shares[(level, tenant)] = min(1.0, ms / level_ms[level])
        return shares

    @guarded
    async def read_history(
        self, queue: str, *, now_s: int, window_s: int = RETENTION_S
    ) -> HistoryRead:
        """The buckets kept (the last ``RETENTION_S``), in one pipelined round trip: every
        field and the tenants of those in the last ``window_s``, only the started and
        became-ready counts of older ones (what the backlogs need)."""
        prefix = self.conn.fair_key(queue, "hist:")
        last = now_s // BUCKET_S * BUCKET_S
        starts = list(range(last - RETENTION_S + BUCKET_S, last + BUCKET_S, BUCKET_S))
        window_start = last - window_s
        async with self.conn.client().pipeline(transaction=False) as pipe:
            pipe.hget(self.conn.fair_key(queue, "hist"), "since")
            for start in starts:
                if start > window_start:
                    pipe.hgetall(f"{prefix}{start}")
                    pipe.zrange(f"{prefix}t:{start}", 0, -1, withscores=True)
                else:
                    pipe.hmget(f"{prefix}{start}", _COUNT_FIELDS)
            replies: list[Any] = await pipe.execute()
        since = replies[0]
        buckets = {}
        at = 1
        for start in starts:
            if start > window_start:
                fields, tenants = replies[at], replies[at + 1]
                at += 2
            else:
                fields = {
                    name: value
                    for name, value in zip(_COUNT_FIELDS, replies[at], strict=True)
                    if value is not None
                }
                tenants, at = [], at + 1
            if fields or tenants:
                buckets[start] = (fields, [(member, score) for member, score in tenants])
        return HistoryRead(buckets=buckets, since_ms=int(since) if since else None)
