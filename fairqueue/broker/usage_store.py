"""The usage ledger in Redis: the day's cumulative counters the history step writes
(``lua/history_commit.lua``), read by the loop to write them to the database.

Keys, beside the queue's own (one hash tag on Redis Cluster), each expiring
:data:`~fairqueue.scheduling.usage.DAY_TTL_S` after its last write:

* ``<prefix>:<queue>:fq:use:<YYYYMMDD>``: hash, ``<stat>:<tenant>\\n<job type>`` ->
  cumulative count (stats ``a c f t w m``), and ``epoch``;
* ``<prefix>:<queue>:fq:use:dirty``: zset, ``<day>\\n<tenant>\\n<job type>`` -> the
  version of the commit that last changed the row: the rows not yet in the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from fairqueue.broker.common import as_text
from fairqueue.broker.connection import BrokerPart
from fairqueue.broker.scripts import plain_script
from fairqueue.scheduling.usage import STATS, UsageValues, split_member


@dataclass(frozen=True, slots=True)
class UsageRead:
    """One dirty ledger row as Redis holds it now."""

    member: str
    version: float
    day: str
    tenant: str
    job_type: str
    #: ``None``: the day's hash is gone (expired or lost): nothing to write.
    epoch: str | None
    values: UsageValues


class UsageStore(BrokerPart):
    """Reads of the usage ledger, and marking rows written."""

    def dirty_key(self, queue: str) -> str:
        return self.conn.fair_key(queue, "use:dirty")

    async def read_dirty(self, queue: str, limit: int = 500) -> list[UsageRead]:
        """Up to ``limit`` rows not yet in the database (oldest change first), with their
        counters: two round trips, whatever the number of tenants."""
        client = self.conn.client()
        pairs = cast(
            "list[tuple[str | bytes, float]]",
            await self.conn.guard(
                client.zrange(self.dirty_key(queue), 0, limit - 1, withscores=True)
            ),
        )
        rows: list[tuple[str, float, tuple[str, str, str] | None]] = [
            (as_text(m), float(score), split_member(as_text(m))) for m, score in pairs
        ]
        async with client.pipeline(transaction=False) as pipe:
            for _, _, parts in rows:
                if parts is None:
                    pipe.echo("")
                    continue
                day, tenant, job_type = parts
                row = f"{tenant}\n{job_type}"
                pipe.hmget(
                    self.conn.fair_key(queue, f"use:{day}"),
                    ["epoch", *(f"{stat}:{row}" for stat in STATS)],
                )
            replies = await self.conn.guard(pipe.execute())
        out = []
        for (member, version, parts), reply in zip(rows, replies, strict=True):
            day, tenant, job_type = parts or ("", "", "")
            if parts is None or not isinstance(reply, list):
                out.append(UsageRead(member, version, day, tenant, job_type, None, UsageValues()))
                continue
            epoch = None if reply[0] is None else as_text(reply[0])
            out.append(
                UsageRead(
                    member, version, day, tenant, job_type, epoch, UsageValues.from_list(reply[1:])
                )
            )
        return out

    async def mark_written(self, queue: str, rows: Sequence[UsageRead]) -> int:
        """Take rows the database now holds off the dirty set, each only if no commit
        changed it since it was read."""
        if not rows:
            return 0
        pairs: list[str | float] = []
        for row in rows:
            pairs += [row.member, repr(row.version)]
        script = self.conn.script(plain_script("usage_flushed"))
        return int(await self.conn.guard(script(keys=[self.dirty_key(queue)], rows=pairs)))

    async def running(self, queue: str, tenants: Sequence[str]) -> dict[str, tuple[int, int]]:
        """``tenants``' attempts running now in ``queue`` and their worker ms so far
        (``lua/usage_running.lua``): tenant -> (attempts, ms), those with none left out.
        One call, nothing read for no tenant."""
        if not tenants:
            return {}
        script = self.conn.script(plain_script("usage_running"))
        reply = await self.conn.guard(
            script(
                keys=[self.conn.fair_key(queue, "run")],
                job_prefix=self.conn.key(queue, ""),
                tenants=list(tenants),
            )
        )
        return {
            as_text(reply[i]): (int(reply[i + 1]), int(reply[i + 2]))
            for i in range(0, len(reply) - 2, 3)
        }

    async def pending(self, queue: str) -> int:
        """Rows not yet in the database."""
        return int(await self.conn.guard(self.conn.client().zcard(self.dirty_key(queue))))
