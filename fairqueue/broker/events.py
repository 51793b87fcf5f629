"""Reading one page of BullMQ's events stream for the history, and writing what it says.

The loop reads the page and the started jobs' hashes with plain commands, works the page
out in its own process (:mod:`fairqueue.scheduling.attempts`), and writes the result with
one script (``lua/history_commit.lua``) that checks the leader lock and that the cursor
is still the one the page was read from: so a page is recorded once or not at all, and
Redis, which every producer and worker shares, only serves reads and applies per-bucket
and per-flow writes. What an entry or a job hash says is read in
:mod:`fairqueue.broker.stream_rows`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis.client import NEVER_DECODE

from fairqueue.broker.connection import Connection
from fairqueue.broker.lock_store import Fence
from fairqueue.broker.scripts import call_script, plain_script
from fairqueue.broker.stream_rows import (
    FAST_ETA,
    START_FIELDS,
    ms_of,
    number_of,
    parse_event,
    parse_start,
    raw_of,
    text_of,
)
from fairqueue.exceptions import LockLostError
from fairqueue.scheduling import attempt_events, attempts, usage
from fairqueue.scheduling.attempt_events import Event, Run, Start
from fairqueue.scheduling.calibration import MAX_SCALED_WAIT_MS, WAIT_SCALE_FIELD, error_bin
from fairqueue.scheduling.shares import BUCKET_S, LEVEL_NAMES, RETENTION_S, TENANTS_PER_BUCKET
from fairqueue.scheduling.shares import wait_bin as _wait_bin

_RAW = {NEVER_DECODE: True}
#: XRANGE named in bytes: redis-py then applies no reply callback (its parsing of every
#: entry into a dict would cost the loop more than all the rest of the page's work).
_XRANGE = b"XRANGE"


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
    #: First attempts of jobs enqueued with an estimate: (level name, predicted start
    #: less actual start, ms), for ``queue_fair_start_estimate_error_seconds``.
    estimate_errors: tuple[tuple[str, int], ...] = ()


class PageReader:
    """One recording call's reads and its write."""

    def __init__(self, conn: Connection, queue: str, fence: Fence) -> None:
        self.conn, self.queue = conn, queue
        self.lock_key, self.token, self.lock_ttl_ms = fence.lock_key, fence.token, fence.ttl_ms
        self.events_key = conn.key(queue, "events")
        self.hist_key = conn.fair_key(queue, "hist")
        #: The page's first attempts enqueued with an estimate: (level, error ms).
        self.estimate_errors: list[tuple[str, int]] = []
        #: The same as history fields: (start ms, level, ratio bin, expected wait ms), for
        #: the estimates' ranges and confidence (``scheduling/calibration.py``).
        self.estimate_bins: list[tuple[int, str, int, int]] = []

    async def record(
        self,
        *,
        max_wait_ms: int,
        page_size: int,
        max_data_bytes: int,
        byte_budget: int,
        by_time: bool,
        ledger: usage.Ledger | None = None,
    ) -> RecordedPage:
        client = self.conn.client()
        cursor, ord_text, since = await client.hmget(self.hist_key, "cursor", "ord", "since")
        # Which buckets are still kept (older ones are not written): the loop's clock,
        # as Redis's own TIME is not a keyed command (Redis Cluster); they expire on
        # Redis's clock either way.
        now_s = int(time.time())
        found = await self._page(
            cast("str | None", cursor),
            int(ord_text or 0),
            cast("str | None", since),
            page_size,
            now_s,
        )
        if found is None:  # the first call set the cursor (or another moved it)
            return RecordedPage(read=0, recorded=0, unknown=0, gap_ms=0, more=False)
        entries, ord_, gap = found
        full = len(entries) >= page_size
        events, starts, kept, spent = await self._read_starts(
            entries, max_data_bytes, byte_budget, full=full
        )
        runs = await self._read_runs(events)
        state = await self._read_state(starts.values(), runs.values()) if by_time else {}
        page = attempts.record_page(
            events,
            starts,
            runs,
            state,
            now_s=now_s,
            bucket_s=BUCKET_S,
            retention_s=RETENTION_S,
            bound_ms=max_wait_ms,
            by_time=by_time,
            wait_bin=_wait_bin,
        )
        for bucket, ms in gap.items():
            row = page.buckets.setdefault(bucket, {})
            row["g"] = row.get("g", 0) + ms
        oldest = now_s - RETENTION_S
        for at_ms, level, index, expected_ms in self.estimate_bins:
            bucket = attempts.bucket_of(at_ms, BUCKET_S)
            if bucket >= oldest:
                row = page.buckets.setdefault(bucket, {})
                name = f"e:{level}:{index}"
                row[name] = row.get(name, 0) + 1
                # the waits those estimates were made for (their scale, summed)
                scale = f"e:{level}:{WAIT_SCALE_FIELD}"
                row[scale] = row.get(scale, 0) + expected_ms
        last = text_of(kept[-1][0]) if kept else ""
        use = await self._usage(ledger, events, starts, runs) if ledger is not None else None
        written = await self._commit(
            cast(str, cursor or ""), last, ord_ + len(kept), page, use, ledger
        )
        if written < 0:
            raise LockLostError(self.queue)
        if written == 0:  # another call recorded this page first: read again
            return RecordedPage(read=0, recorded=0, unknown=0, gap_ms=0, more=True)
        return _recorded(page, len(kept), gap, more=full or spent, errors=self.estimate_errors)

    async def _page(
        self, cursor: str | None, ord_: int, since: str | None, page_size: int, now_s: int
    ) -> tuple[list, int, dict[int, int]] | None:
        """The stream entries after the cursor, the cursor's ordinal and the milliseconds
        trimmed away unread per bucket; ``None`` when there is nothing to read yet."""
        if cursor:
            # While the cursor's own entry is in the stream nothing after it was trimmed
            # (BullMQ trims from the front): read from it, inclusive, and drop it.
            read = await self._xrange(cursor, page_size + 1)
            if read and read[0][0] == raw_of(cursor):
                return read[1:], ord_, {}
        seek = await self.conn.script(plain_script("history_seek"))(
            keys=[self.events_key, self.hist_key, self.lock_key],
            token=self.token,
            ttl=self.lock_ttl_ms,
            cursor=cursor or "",
        )
        status = int(seek[0])
        if status < 0:
            raise LockLostError(self.queue)
        if status == 0:
            return None
        start, inclusive, ord_, lost, first_ms = seek[1:6]
        ord_, since_ms = int(ord_), int(since or 0)
        gap: dict[int, int] = {}
        if int(lost) > 0:
            gap = attempts.gap_buckets(
                ms_of(raw_of(cast(str, cursor))),  # trimmed entries: a cursor was set
                int(first_ms),
                oldest_s=attempts.oldest_bucket(now_s, BUCKET_S, RETENTION_S),
                since_ms=since_ms,
                bucket_s=BUCKET_S,
            )
        low = start if int(inclusive) else f"({start}"
        return await self._xrange(low, page_size), ord_, gap

    async def _read_starts(
        self, entries: list, max_data_bytes: int, byte_budget: int, *, full: bool = False
    ) -> tuple[list[Event], dict[str, Start | None], list, bool]:
        """The page's events and its started jobs' hashes, up to the data budget: the
        entries kept are those before the one at which the budget ran out, less a last
        re-add whose ``stalled`` may follow unread (``attempt_events.cut_before_trailing_retry``);
        a re-add a ``stalled`` follows is a lost attempt (``attempt_events.fold_stalls``)."""
        parsed = [parse_event(entry_id, fields) for entry_id, fields in entries]
        pending = list(dict.fromkeys(e.job_id for e in parsed if e and e.kind == "start"))
        rows: dict[str, list] = {}
        if pending:
            keys = [self.conn.key(self.queue, job_id) for job_id in pending]
            flat = await self._raw_script("history_rows", keys, budget=byte_budget)
            width = len(START_FIELDS)
            for i in range(0, len(flat), width):
                rows[pending[i // width]] = flat[i : i + width]
        events: list[Event] = []
        starts: dict[str, Start | None] = {}
        self.estimate_errors = []
        self.estimate_bins = []
        kept_count, used = 0, 0
        for event in parsed:
            if used > byte_budget:
                break
            kept_count += 1
            if event is None:
                continue
            events.append(event)
            if event.kind == "start":
                row = rows.get(event.job_id)
                if row is None:  # beyond the rows the budget let the read bring
                    kept_count -= 1
                    events.pop()
                    break
                used += len(row[4]) if row[4] else 0
                start = starts[event.job_id] = parse_start(row, max_data_bytes)
                predicted = FAST_ETA.search(row[3] or b"")
                if predicted and start is not None and start.level and start.first_attempt:
                    promised = int(predicted.group(1))
                    self.estimate_errors.append((start.level, promised - event.at_ms))
                    ready = min(start.ready_ms, event.at_ms)
                    index = error_bin(event.at_ms - ready, promised - ready)
                    expected = min(MAX_SCALED_WAIT_MS, max(0, promised - ready))
                    self.estimate_bins.append((event.at_ms, start.level, index, expected))
        kinds = [event.kind if event else None for event in parsed[:kept_count]]
        cut = full or kept_count < len(entries) or used > byte_budget
        keep = attempt_events.cut_before_trailing_retry(kinds, cut=cut)
        if keep < kept_count:
            kept_count = keep
            events.pop()
        return attempt_events.fold_stalls(events), starts, entries[:kept_count], used > byte_budget

    async def _xrange(self, low: str, count: int) -> list:
        """Entries from ``low`` as Redis sends them, ``[id, [field, value, ...]]`` in
        bytes: redis-py's own parsing into dicts costs the loop six times the read."""
        return await self.conn.client().execute_command(
            _XRANGE, self.events_key, low, "+", "COUNT", count, **_RAW
        )

    async def _raw_script(self, name: str, keys: list[str], **args: Any) -> Any:
        """A read-only script's reply in bytes (job data need not be UTF-8)."""
        script = plain_script(name)
        argv = script.args(**args)
        return await call_script(self.conn.client(), script.sha, script.source, keys, argv, **_RAW)

    async def _read_runs(self, events: list[Event]) -> dict[str, Run]:
        wanted = attempt_events.runs_to_read(events)
        if not wanted:
            return {}
        key = self.conn.fair_key(self.queue, "run")
        texts = await self.conn.client().execute_command("HMGET", key, *wanted, **_RAW)
        runs = {}
        for job_id, text in zip(wanted, texts, strict=True):
            run = Run.decode(text_of(text)) if text is not None else None
            if run is not None:
                runs[job_id] = run
        return runs

    async def _read_state(self, starts: Any, runs: Any) -> dict[str, float]:
        names = attempt_events.state_fields(starts, runs)
        key = self.conn.fair_key(self.queue, "state")
        values = await self.conn.client().execute_command(
            "HMGET", key, *[raw_of(name) for name in names], **_RAW
        )
        state = {}
        for name, value in zip(names, values, strict=True):
            number = number_of(value) if value is not None else None
            if number is not None:
                state[name] = number
        return state

    async def _usage(
        self,
        ledger: usage.Ledger,
        events: list[Event],
        starts: dict[str, Start | None],
        runs: dict[str, Run],
    ) -> usage.PageUsage:
        """The ledger's counts of the page; a queue shared by several job types reads its
        jobs' names (BullMQ's job name is the job type), one pipelined HGET each."""
        names: dict[str, str] = {}
        if len(ledger.job_types) != 1:
            ids = list(dict.fromkeys(e.job_id for e in events))
            if ids:
                async with self.conn.client().pipeline(transaction=False) as pipe:
                    for job_id in ids:
                        pipe.execute_command(
                            "HGET", self.conn.key(self.queue, job_id), "name", **_RAW
                        )
                    replies = await pipe.execute()
                names = {
                    job_id: text_of(name)
                    for job_id, name in zip(ids, replies, strict=True)
                    if name is not None and text_of(name) in ledger.job_types
                }
        only = ledger.job_types[0] if len(ledger.job_types) == 1 else usage.UNKNOWN_JOB_TYPE
        return usage.page_usage(events, starts, runs, lambda job_id: names.get(job_id, only))

    async def _commit(
        self,
        cursor: str,
        last: str,
        ord_: int,
        page: attempts.PageRecord,
        use: usage.PageUsage | None = None,
        ledger: usage.Ledger | None = None,
    ) -> int:
        sections: list[Any] = []

        def section(items: list[Any], width: int) -> None:
            sections.append(len(items) // width)
            sections.extend(items)

        # A tenant's buckets go with the level buckets: the same increments and expiry.
        rows: list[tuple[Any, dict[str, int]]] = [*page.buckets.items()]
        rows.extend((raw_of(name), row) for name, row in page.tenant_rows.items())
        section([x for b, row in rows for name, n in row.items() for x in (b, name, n)], 3)
        section(
            [
                x
                for b, row in page.tenants.items()
                for member, n in row.items()
                for x in (b, raw_of(member), n)
            ],
            3,
        )
        section([raw_of(job_id) for job_id in page.ended_runs], 1)
        section(
            [
                x
                for job_id, run in page.started_runs.items()
                for x in (raw_of(job_id), raw_of(run.encode()))
            ],
            2,
        )
        section([x for name, text in page.state_writes.items() for x in (raw_of(name), text)], 2)
        section(
            [x for s in page.settlements for x in (raw_of(s.member), s.level, f"{s.debt:.17g}")],
            3,
        )
        recosts = [
            (raw_of(r.member), r.level, f"{r.ratio:.17g}", f"{r.shift:.17g}") for r in page.recosts
        ]
        section([x for r in recosts for x in r], 4)
        if use and ledger is not None:
            section([self.conn.fair_key(self.queue, "use:"), usage.DAY_TTL_S, ledger.epoch], 3)
            section(
                [x for (day, name), n in use.increments.items() for x in (day, raw_of(name), n)], 3
            )
            section([x for (day, name), n in use.maxima.items() for x in (day, raw_of(name), n)], 3)
        return int(
            await self.conn.script(plain_script("history_commit"))(
                keys=[
                    self.hist_key,
                    self.lock_key,
                    self.conn.fair_key(self.queue, "run"),
                    self.conn.fair_key(self.queue, "state"),
                    self.conn.fair_key(self.queue, "flows"),
                    self.conn.fair_key(self.queue, "fweights"),
                    self.conn.key(self.queue, "active"),
                    self.conn.fair_key(self.queue, "seen"),
                    self.conn.key(self.queue, "prioritized"),
                    self.conn.fair_key(self.queue, "rw"),
                ],
                token=self.token,
                ttl=self.lock_ttl_ms,
                cursor=cursor,
                new_cursor=last,
                ord=ord_,
                bucket_prefix=self.conn.fair_key(self.queue, "hist:"),
                bucket_ttl=RETENTION_S + 2 * BUCKET_S,
                keep_tenants=TENANTS_PER_BUCKET,
                idle_ms=attempts.FLOW_STATE_IDLE_S * 1000,
                sections=sections,
            )
        )


def _recorded(
    page: attempts.PageRecord,
    read: int,
    gap: dict[int, int],
    *,
    more: bool,
    errors: Sequence[tuple[str, int]] = (),
) -> RecordedPage:
    """What a recorded page tells the pass (counts for its result and metrics)."""
    return RecordedPage(
        read=read,
        recorded=page.recorded,
        unknown=page.unknown,
        gap_ms=sum(gap.values()),
        more=more,
        served=page.served,
        started_by_level={
            level: page.started_by_level[level]
            for level in LEVEL_NAMES
            if page.started_by_level.get(level)
        },
        waits=tuple(page.waits),
        estimate_errors=tuple(errors),
    )
