"""What the rebalance pass reads and writes: the head of a queue, jobs by id, overdue
jobs deep in a backlog, counts, BullMQ priorities, the tag band rebase and the pass's
status records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from ..levels import PAYLOAD_LEVEL_KEY, PAYLOAD_TENANT_KEY
from .common import (
    _JOB_FIELDS,
    _SCORE_BASE,
    BACK_OF_LINE,
    WINDOW_BAND_TOP,
    _int_or,
    parse_job_data,
)
from .scripts import _META_WIDTH

if TYPE_CHECKING:
    from .connection import BrokerCore as _Base
else:
    _Base = object


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


@dataclass(frozen=True, slots=True)
class WaitingSnapshot:
    """The head of a queue: the wait list, then the window band, then the tag band head."""

    jobs: list[WaitingJob]
    #: Jobs behind ``jobs`` in the prioritized set (not read).
    behind: int
    #: Lowest priority among jobs not read; new window priorities must stay below it.
    upper_bound: int
    tag_band_head: int | None
    #: How many prioritized-set entries were read (the rank where a deep scan starts).
    prioritized_read: int = 0


@dataclass(frozen=True, slots=True)
class OverdueJobs:
    """Overdue jobs found deep in a backlog: some ids, and how many there are in all."""

    job_ids: list[str]
    total: int


@dataclass(slots=True)
class WriteResult:
    written: int = 0
    missing: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    round_trips: int = 0


class RebalancingMixin(_Base):
    """:class:`Broker`'s reads and writes for the rebalance pass (mixed in; uses
    ``BrokerCore``'s plumbing)."""

    # -- reading ----------------------------------------------------------------------

    async def read_head(self, queue: str, *, window: int, max_window_band: int) -> WaitingSnapshot:
        """Read the head of the pop order: the wait list, the whole window band (up to
        ``max_window_band`` jobs) and enough of the tag band to fill ``window``."""
        return await self._guard(self._read_head(queue, window, max_window_band))

    async def _read_head(self, queue: str, window: int, max_window_band: int):
        prioritized = self.key(queue, "prioritized")
        async with self.client().pipeline(transaction=False) as pipe:
            # BullMQ pops the wait list from its right end: read the next ones to pop.
            pipe.lrange(self.key(queue, "wait"), -max_window_band, -1)
            pipe.zrangebyscore(
                prioritized,
                0,
                f"({WINDOW_BAND_TOP * _SCORE_BASE}",
                start=0,
                num=max_window_band + 1,
                withscores=True,
            )
            pipe.zrangebyscore(
                prioritized,
                WINDOW_BAND_TOP * _SCORE_BASE,
                "+inf",
                start=0,
                num=window + 1,
                withscores=True,
            )
            pipe.zcard(prioritized)
            wait_ids, band, tag_band, total = await pipe.execute()
        wait_ids.reverse()  # into pop order
        if len(band) > max_window_band:
            # More window-band jobs than we may read: stay below the first one left out.
            upper_bound = int(band[max_window_band][1] // _SCORE_BASE)
            band, tag_entries, tag_band_head = band[:max_window_band], [], None
        else:
            upper_bound = WINDOW_BAND_TOP
            fill = max(0, window - len(band) - len(wait_ids))
            tag_entries = tag_band[:fill]
            rest = tag_band[fill:]
            tag_band_head = int(rest[0][1] // _SCORE_BASE) if rest else None
        entries = [(job_id, 0, True) for job_id in wait_ids] + [
            (job_id, int(score // _SCORE_BASE), False) for job_id, score in band + tag_entries
        ]
        return WaitingSnapshot(
            jobs=await self._read_meta(queue, entries),
            behind=max(0, total - len(band) - len(tag_entries)),
            upper_bound=upper_bound,
            tag_band_head=tag_band_head,
            prioritized_read=len(band) + len(tag_entries),
        )

    async def read_jobs(
        self, queue: str, job_ids: Sequence[str], *, payload: bool = True
    ) -> list[WaitingJob]:
        """Read jobs by id (skipping ids whose job hash is gone).

        With ``payload=False`` the payload is parsed inside Redis and ``data`` holds only
        fairqueue's keys (``tenantId``, ``priorityLevel``): what the rebalance pass needs,
        without moving payloads over the wire.
        """
        entries = [(job_id, None, False) for job_id in job_ids]
        reader = self._read_jobs if payload else self._read_meta
        return await self._guard(reader(queue, entries))

    async def _read_meta(
        self, queue: str, entries: Sequence[tuple[str, int | None, bool]]
    ) -> list[WaitingJob]:
        if not entries:
            return []
        script = self._state().scripts["meta"]
        by_id = {job_id: (priority, in_wait) for job_id, priority, in_wait in entries}
        rows: list[Any] = []
        for start in range(0, len(entries), 5_000):
            chunk = [job_id for job_id, _, _ in entries[start : start + 5_000]]
            rows.extend(await script(keys=[], args=[self.key(queue, ""), *chunk]))
        jobs = []
        for offset in range(0, len(rows), _META_WIDTH):
            (
                job_id,
                name,
                timestamp,
                stored,
                attempts,
                is_object,
                tenant,
                tenant_flag,
                level,
                req,
            ) = rows[offset : offset + _META_WIDTH]
            data: dict[str, Any] | None = None
            if int(is_object):
                data = {}
                if int(tenant_flag) == 1:
                    data[PAYLOAD_TENANT_KEY] = tenant
                elif int(tenant_flag) == 2:
                    data[PAYLOAD_TENANT_KEY] = 0  # present but not a string: invalid
                if level:
                    data[PAYLOAD_LEVEL_KEY] = level
            priority, in_wait = by_id[job_id]
            jobs.append(
                WaitingJob(
                    job_id=job_id,
                    name=name,
                    data=data,
                    timestamp_ms=_int_or(timestamp, None),
                    priority=priority if priority is not None else _int_or(stored, 0),
                    attempts_made=_int_or(attempts, 0) or 0,
                    in_wait_list=in_wait,
                    requested_priority=None if int(req) < 0 else int(req),
                )
            )
        return jobs

    async def _read_jobs(
        self, queue: str, entries: Sequence[tuple[str, int | None, bool]]
    ) -> list[WaitingJob]:
        if not entries:
            return []
        async with self.client().pipeline(transaction=False) as pipe:
            for job_id, _, _ in entries:
                pipe.hmget(self.key(queue, job_id), *_JOB_FIELDS)
            rows = await pipe.execute()
        jobs = []
        for (job_id, priority, in_wait), row in zip(entries, rows, strict=True):
            name, data, timestamp, stored_priority, attempts_made, opts = row
            if name is None and data is None and timestamp is None:
                continue  # removed or finished since we read the ids
            requested = (parse_job_data(opts) or {}).get("priority")
            jobs.append(
                WaitingJob(
                    job_id=job_id,
                    name=name or "",
                    data=parse_job_data(data),
                    timestamp_ms=_int_or(timestamp, None),
                    priority=priority if priority is not None else _int_or(stored_priority, 0),
                    attempts_made=_int_or(attempts_made, 0) or 0,
                    in_wait_list=in_wait,
                    requested_priority=requested if type(requested) is int else None,
                )
            )
        return jobs

    async def find_overdue(
        self,
        queue: str,
        *,
        cutoff_ms: int,
        start: int,
        page_size: int = 10_000,
        oldest: int | None = None,
    ) -> OverdueJobs:
        """Jobs in the prioritized set from rank ``start`` on, enqueued before
        ``cutoff_ms``: all of their ids in pop order, or only the ``oldest`` N, oldest
        first; ``total`` counts them all. Pages through the set inside Redis
        (``page_size`` jobs per script call)."""
        found = await self._guard(self._find_overdue(queue, cutoff_ms, start, page_size))
        total = len(found)
        if oldest is not None:
            found.sort(key=lambda item: (item[1], item[0]))
            del found[oldest:]
        return OverdueJobs([job_id for job_id, _ in found], total=total)

    async def _find_overdue(self, queue, cutoff_ms, start, page_size) -> list[tuple[str, int]]:
        script = self._state().scripts["overdue"]
        found: list[tuple[str, int]] = []
        position = start
        while True:
            scanned, flat = await script(
                keys=[self.key(queue, "prioritized")],
                args=[position, position + page_size - 1, cutoff_ms, self.key(queue, "")],
            )
            found.extend(zip(flat[::2], (int(ts) for ts in flat[1::2]), strict=True))
            position += page_size
            if scanned < page_size:
                return found

    async def counts(self, queue: str) -> dict[str, int]:
        """Job counts by BullMQ state."""
        states = ("wait", "prioritized", "active", "delayed", "failed", "completed")
        return await self._guard(self._counts(queue, states))

    async def _counts(self, queue, states):
        values = await self.queue(queue).getJobCounts(*states)
        return {state: int(values.get(state, 0)) for state in states}

    # -- writing ----------------------------------------------------------------------

    async def set_priorities(
        self, queue: str, changes: Sequence[tuple[str, int]], *, batch_size: int = 1_000
    ) -> WriteResult:
        """Write BullMQ priorities with BullMQ's own ``changePriority`` script, a batch
        per EVALSHA.

        A job that vanished (finished or removed) is reported in ``missing`` and never
        stops the others.
        """
        return await self._guard(self._set_priorities(queue, changes, batch_size))

    async def _set_priorities(self, queue, changes, batch_size):
        script = self._state().scripts["change"]
        keys = [
            self.key(queue, "wait"),
            self.key(queue, "paused"),
            self.key(queue, "meta"),
            self.key(queue, "prioritized"),
            self.key(queue, "active"),
            self.key(queue, "pc"),
            self.key(queue, "marker"),
        ]
        prefix = self.key(queue, "")
        result = WriteResult()
        for start in range(0, len(changes), batch_size):
            batch = changes[start : start + batch_size]
            args: list[Any] = [prefix]
            for job_id, priority in batch:
                args += [job_id, priority]
            try:
                codes = await script(keys=keys, args=args)
            except ResponseError:
                # An error inside the script stops its batch (jobs before the error may
                # have moved): report the batch as failed and go on; the next pass plans
                # from what Redis holds then.
                result.failed.extend(job_id for job_id, _ in batch)
                result.round_trips += 1
                continue
            result.round_trips += 1
            for (job_id, _), code in zip(batch, codes, strict=True):
                if int(code) < 0:
                    result.missing.append(job_id)
                else:
                    result.written += 1
        return result

    async def rebase_tag_band(self, queue: str, shift: int) -> int:
        """Shift the tag band down by ``shift`` priorities (order unchanged)."""
        script = self._state().scripts["rebase"]
        return await self._guard(
            script(
                keys=[self.key(queue, "prioritized"), self.fair_key(queue, "tags")],
                args=[WINDOW_BAND_TOP, shift, BACK_OF_LINE - 1, self.key(queue, "")],
            )
        )

    async def write_status(self, queue: str, name: str, record: dict[str, Any]) -> None:
        """Store a small JSON status record beside the queue (e.g. the last pass)."""
        await self._guard(self.client().set(self.fair_key(queue, name), json.dumps(record)))

    async def read_status(self, queue: str, name: str) -> dict[str, Any] | None:
        raw = await self._guard(self.client().get(self.fair_key(queue, name)))
        return parse_job_data(raw)
