"""The dashboard's history in Redis: the pass records a page of BullMQ's events stream
(``lua/history_record.lua``), the dashboard reads the buckets back.

Every key is ``<prefix>:<queue>:fq:hist...``, beside the queue's own keys (one hash tag
on Redis Cluster), and every bucket expires after the retention, so the history costs a
bounded amount of memory whatever the traffic: per bucket one small hash and a zset of at
most ``TENANTS_PER_BUCKET`` tenants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fairqueue.broker.connection import BrokerPart
from fairqueue.broker.passes import LockLostError
from fairqueue.broker.scripts import plain_script
from fairqueue.dashboard.history import BUCKET_S, LEVEL_NAMES, RETENTION_S, TENANTS_PER_BUCKET

#: What the backlogs need of a bucket before the window: jobs started and became ready.
_COUNT_FIELDS = [f"{kind}:{level}" for kind in ("s", "a") for level in LEVEL_NAMES]


@dataclass(frozen=True, slots=True)
class RecordedPage:
    """What one recording call did."""

    #: Stream entries read (every event, not only starts).
    read: int
    #: Started jobs recorded with their level, and those whose level could not be read.
    recorded: int
    unknown: int
    #: Milliseconds of events trimmed from the stream before the pass read them.
    gap_ms: int
    #: The page was full: more entries may be waiting.
    more: bool
    #: Level name -> (worker milliseconds of the attempts that finished, restarts of
    #: jobs that had run before) in this page.
    served: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Starts recorded per level name (retried jobs' too), and the waits (ms, ready to
    #: start on Redis's clock) of the first attempts among them, as (level name, ms):
    #: the rebalancer's metrics. Empty on the first call (it only sets the cursor).
    started_by_level: dict[str, int] = field(default_factory=dict)
    waits: tuple[tuple[str, int], ...] = ()


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
        lock_key: str,
        token: str,
        lock_ttl_ms: int,
        max_wait_ms: int,
        page_size: int = 1_000,
        max_data_bytes: int = 65_536,
        byte_budget: int = 1_048_576,
        fairness_by: str = "time",
    ) -> RecordedPage:
        """Record the next page of ``queue``'s events stream (fenced by the lock).

        Raises:
            LockLostError: another rebalancer holds the lock; nothing was recorded.
        """
        script = self.conn.script(plain_script("history_record"))
        reply = await self.conn.guard(
            script(
                keys=[
                    self.conn.key(queue, "events"),
                    self.conn.fair_key(queue, "hist"),
                    lock_key,
                    self.conn.fair_key(queue, "run"),
                    self.conn.fair_key(queue, "state"),
                    self.conn.fair_key(queue, "flows"),
                    self.conn.fair_key(queue, "fweights"),
                ],
                args=[
                    token,
                    lock_ttl_ms,
                    self.conn.key(queue, ""),
                    self.conn.fair_key(queue, "hist:"),
                    page_size,
                    BUCKET_S,
                    RETENTION_S,
                    max_wait_ms,
                    max_data_bytes,
                    TENANTS_PER_BUCKET,
                    byte_budget,
                    fairness_by,
                ],
            )
        )
        status, read, recorded, unknown, gap_ms, more = reply[:6]
        if int(status) < 0:
            raise LockLostError(queue)
        started, waits, served = (list(part) for part in reply[6:9])
        return RecordedPage(
            read=int(read),
            recorded=int(recorded),
            unknown=int(unknown),
            gap_ms=int(gap_ms),
            more=bool(int(more)),
            started_by_level={
                name: int(count) for name, count in zip(LEVEL_NAMES, started, strict=False) if count
            },
            waits=tuple(
                (LEVEL_NAMES[int(waits[i])], int(waits[i + 1])) for i in range(0, len(waits) - 1, 2)
            ),
            served={
                str(served[i]): (int(served[i + 1]), int(served[i + 2]))
                for i in range(0, len(served), 3)
            },
        )

    async def read_history(
        self, queue: str, *, now_s: int, window_s: int = RETENTION_S
    ) -> HistoryRead:
        """The buckets kept (the last ``RETENTION_S``), in one pipelined round trip: every
        field and the tenants of those in the last ``window_s``, only the started and
        became-ready counts of older ones (what the backlogs need)."""
        return await self.conn.guard(self._read_history(queue, now_s, window_s))

    async def _read_history(self, queue: str, now_s: int, window_s: int) -> HistoryRead:
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
