"""The one module that talks to BullMQ and Redis.

Everything else in fairqueue speaks its own types (``NewJob``, ``WaitingJob``, ...);
BullMQ's camelCase API, its key names and its priority score format stay in here.

How fairqueue uses BullMQ's priority (pinned: ``bullmq>=3.4.4,<3.5``, checked by
``tests/test_broker_contract.py``):

* BullMQ pops its ``wait`` list (priority 0) before anything in the ``prioritized``
  sorted set, whose score is ``priority * 2**32 + counter``; priorities run 1..2**21-1.
* fairqueue splits that range in two bands. The **window band** ``1 .. WINDOW_BAND_TOP-1``
  holds the jobs a rebalance pass has put in exact fair order. The **tag band**
  ``WINDOW_BAND_TOP .. MAX_PRIORITY`` holds newly enqueued jobs at their enqueue-time
  virtual finish tag (see :data:`ADD_SCRIPT_HEAD`), so the backlog behind the window is
  already in approximately fair order and a new critical job does not wait behind a
  whole backlog of low jobs for the next pass to find it.
* Jobs are added by BullMQ's own ``addPrioritizedJob`` script and rebalance writes go
  through BullMQ's own ``changePriority`` script (each wrapped to run a batch per
  EVALSHA), so a stock BullMQ worker (Python or Node) pops the jobs in the fair order.

Sync callers (Django views, management commands) use :class:`SyncBroker`: enqueues go
straight from the calling thread through one blocking connection pool per process (the
hot path pays no thread hop); everything else runs on one event-loop thread per process
with one async pool. Both are recreated after ``fork()``. Async callers (async views)
await :class:`Broker` directly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import redis
import redis.asyncio as aioredis
from bullmq import Job as BullJob
from bullmq import Queue as BullQueue
from bullmq import Worker as BullWorker
from bullmq.redis_connection import loadScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .exceptions import BrokerUnavailableError
from .levels import PAYLOAD_LEVEL_KEY, PAYLOAD_TENANT_KEY, PriorityLevel

logger = logging.getLogger("fairqueue.broker")

T = TypeVar("T")

#: BullMQ's largest priority (2**21 - 1).
MAX_PRIORITY: Final = 2_097_151
#: First priority of the tag band; the window band lies below it.
WINDOW_BAND_TOP: Final = 1 << 19
#: Where a job goes when it cannot be placed by tag (delayed jobs, place failures):
#: behind everything, FIFO among equals. The next pass (or the wait bound) places it.
BACK_OF_LINE: Final = MAX_PRIORITY
#: Enqueue-time tag step per level: 48 / weight, so 4:3:2:1 service in the tag band.
#: Priorities are ``tag + offset``; tags stay multiples of 4 so levels never collide
#: and equal tags go to the higher weight first (SPEC decision 7's tie rule).
TAG_STEP: Final = {
    PriorityLevel.CRITICAL: 12,
    PriorityLevel.HIGH: 16,
    PriorityLevel.NORMAL: 24,
    PriorityLevel.LOW: 48,
}
TAG_OFFSET: Final = {
    PriorityLevel.CRITICAL: 0,
    PriorityLevel.HIGH: 1,
    PriorityLevel.NORMAL: 2,
    PriorityLevel.LOW: 3,
}
#: When the tag band's head passes this, the next pass shifts the band back down.
REBASE_THRESHOLD: Final = WINDOW_BAND_TOP + (1 << 20)

_SCORE_BASE: Final = 1 << 32
_JOB_FIELDS: Final = ("name", "data", "timestamp", "priority", "atm", "opts")

#: fairqueue's add script wraps BullMQ's own addPrioritizedJob script (see
#: :func:`add_script_source`) and runs it once per job of a batch, in one EVALSHA.
#: Before each run it sets the job's ``priority`` option to the job's level's next
#: virtual finish tag, ``max(level's last tag, virtual time) + step``, the virtual time
#: being the start tag of the tag band's head job (WFQ's "tag of the job in service").
#: A level that was idle restarts there (no credit for idleness); an empty tag band
#: resets the per-level tags, so they do not creep towards BullMQ's cap. A job id that
#: already exists is left to BullMQ (it keeps the existing job) and uses no tag.
#:
#: KEYS[1..9] are addPrioritizedJob's, KEYS[10] is fairqueue's per-level tag hash.
#: ARGV[1] is the number of jobs n; then, per job, BullMQ's four arguments (packed
#: args, JSON data, packed opts, timestamp) and the level name. Returns, per job, the
#: job id and the priority given (0: the id existed and nothing was added).
ADD_SCRIPT_HEAD: Final = """
local fqCall = redis.call
local fqStep = {critical = %(critical)d, high = %(high)d, normal = %(normal)d, low = %(low)d}
local fqOffset = {critical = 0, high = 1, normal = 2, low = 3}
local fqStepByOffset = {[0] = %(critical)d, [1] = %(high)d, [2] = %(normal)d, [3] = %(low)d}
local fqFloor = %(floor)d
local fqBack = %(back)d
local function fqTag(level)
  local head = fqCall('ZRANGEBYSCORE', KEYS[4], fqFloor * 4294967296,
    fqBack * 4294967296 - 1, 'WITHSCORES', 'LIMIT', 0, 1)
  local base = fqFloor
  if #head > 0 then
    local headPrio = math.floor(tonumber(head[2]) / 4294967296)
    local offset = headPrio %% 4
    base = headPrio - offset - fqStepByOffset[offset]
    if base < fqFloor then base = fqFloor end
  else
    fqCall('DEL', KEYS[10])
  end
  base = base - base %% 4
  local last = tonumber(fqCall('HGET', KEYS[10], level) or '0')
  if last < base then last = base end
  local tag = last + fqStep[level]
  local priority = tag + fqOffset[level]
  if priority >= fqBack then return fqBack end
  fqCall('HSET', KEYS[10], level, tag)
  return priority
end
local function fqBullmqAdd()
"""
ADD_SCRIPT_TAIL: Final = """
end
local fqJobs = {}
for i = 1, tonumber(ARGV[1]) do
  local b = 2 + (i - 1) * 5
  fqJobs[i] = {ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]}
end
local fqReplies = {}
for i, job in ipairs(fqJobs) do
  local args = cmsgpack.unpack(job[1])
  local priority = 0
  if args[2] == '' or fqCall('EXISTS', args[1] .. args[2]) == 0 then
    priority = fqTag(job[5])
    local opts = cmsgpack.unpack(job[3])
    opts['priority'] = priority
    job[3] = cmsgpack.pack(opts)
  end
  ARGV[1], ARGV[2], ARGV[3], ARGV[4] = job[1], job[2], job[3], job[4]
  fqReplies[#fqReplies + 1] = fqBullmqAdd()
  fqReplies[#fqReplies + 1] = priority
end
return fqReplies
"""


def add_script_source() -> str:
    """fairqueue's add script: BullMQ's own addPrioritizedJob, wrapped.

    BullMQ's script is read from the installed bullmq package, so the job hash, the
    prioritized set entry and the events are exactly what BullMQ writes; only the
    ``priority`` option it is given is fairqueue's.
    """
    head = ADD_SCRIPT_HEAD % {
        **{level.value: step for level, step in TAG_STEP.items()},
        "floor": WINDOW_BAND_TOP,
        "back": BACK_OF_LINE,
    }
    return head + loadScript("addPrioritizedJob-9.lua") + ADD_SCRIPT_TAIL


#: Page through the prioritized set returning jobs whose BullMQ ``timestamp`` is older
#: than the cutoff. Runs inside Redis so a 100,000-job backlog is scanned in a few
#: round trips instead of 100,000.
OVERDUE_SCRIPT: Final = """
local ids = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2])
local cutoff = tonumber(ARGV[3])
local out = {}
for i = 1, #ids do
  local ts = tonumber(redis.call('HGET', ARGV[4] .. ids[i], 'timestamp') or 'nil')
  if ts and ts < cutoff then
    out[#out + 1] = ids[i]
    out[#out + 1] = ts
  end
end
return {#ids, out}
"""

#: Read what the rebalance pass needs of each job, parsing the payload inside Redis so
#: payloads never cross the wire on the hot path. Per job id (ARGV[2..]) it returns
#: id, name, timestamp, priority, attempts made, a data flag (1: JSON object, 0: not),
#: the tenant (a string, or '' with flag 0 for missing/null, 2 for not a string), the
#: level ('' when missing) and, for jobs without a level, the priority their producer
#: asked for (-1 when unknown). Gone jobs are left out.
META_SCRIPT: Final = """
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local f = redis.call('HMGET', ARGV[1] .. id, 'name', 'data', 'timestamp', 'priority', 'atm',
    'opts')
  if f[1] or f[2] or f[3] then
    local ok, data = pcall(cjson.decode, f[2] or 'null')
    -- cjson turns arrays into tables too; a non-empty array has an element at 1
    local isObject = ok and type(data) == 'table' and data[1] == nil
    local tenant, tenantFlag, level, requested = '', 0, '', -1
    if isObject then
      local t = data['tenantId']
      if type(t) == 'string' then tenant, tenantFlag = t, 1
      elseif t ~= nil and t ~= cjson.null then tenantFlag = 2 end
      local l = data['priorityLevel']
      if type(l) == 'string' then level = l
      elseif l ~= nil and l ~= cjson.null then level = '?' end
      if level == '' then
        local okOpts, opts = pcall(cjson.decode, f[6] or 'null')
        if okOpts and type(opts) == 'table' and type(opts['priority']) == 'number' then
          requested = opts['priority']
        end
      end
    end
    out[#out + 1] = id
    out[#out + 1] = f[1] or ''
    out[#out + 1] = f[3] or ''
    out[#out + 1] = f[4] or '0'
    out[#out + 1] = f[5] or '0'
    out[#out + 1] = isObject and 1 or 0
    out[#out + 1] = tenant
    out[#out + 1] = tenantFlag
    out[#out + 1] = level
    out[#out + 1] = requested
  end
end
return out
"""
_META_WIDTH: Final = 10

#: BullMQ's own changePriority script, run once per (job id, priority) pair of a batch
#: in one EVALSHA (see :func:`change_script_source`). ARGV[1] is the job key prefix,
#: then pairs; returns BullMQ's code per job (0 ok, -1 missing).
CHANGE_SCRIPT_HEAD: Final = """
local fqPairs = {}
for i = 2, #ARGV, 2 do fqPairs[#fqPairs + 1] = {ARGV[i], ARGV[i + 1]} end
local fqPrefix = ARGV[1]
local function fqBullmqChange()
"""
CHANGE_SCRIPT_TAIL: Final = """
end
local fqCodes = {}
for i, pair in ipairs(fqPairs) do
  ARGV[1], ARGV[2], ARGV[3], ARGV[4] = pair[2], fqPrefix, pair[1], '0'
  fqCodes[i] = fqBullmqChange()
end
return fqCodes
"""


def change_script_source() -> str:
    """BullMQ's changePriority, looped over a batch (job hashes and sets as BullMQ
    writes them; one round trip for the batch)."""
    return CHANGE_SCRIPT_HEAD + loadScript("changePriority-7.lua") + CHANGE_SCRIPT_TAIL


#: Shift every tag-band job (and the per-level tags) down by ARGV[2], so tags never
#: reach BullMQ's cap on a queue that is never empty. Relative order is unchanged.
REBASE_SCRIPT: Final = """
local floor = tonumber(ARGV[1])
local shift = tonumber(ARGV[2])
local entries = redis.call('ZRANGEBYSCORE', KEYS[1], floor * 4294967296,
  tonumber(ARGV[3]) * 4294967296, 'WITHSCORES')
for i = 1, #entries, 2 do
  local id = entries[i]
  local score = tonumber(entries[i + 1])
  local prio = math.floor(score / 4294967296)
  local newPrio = prio - shift
  redis.call('ZADD', KEYS[1], score - shift * 4294967296, id)
  redis.call('HSET', ARGV[4] .. id, 'priority', newPrio)
end
local tags = redis.call('HGETALL', KEYS[2])
for i = 1, #tags, 2 do
  local v = tonumber(tags[i + 1]) - shift
  if v < floor then v = floor end
  redis.call('HSET', KEYS[2], tags[i], v)
end
return #entries / 2
"""

#: Release a lock only if we still hold it.
RELEASE_LOCK_SCRIPT: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
#: Renew a lock only if we still hold it.
RENEW_LOCK_SCRIPT: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to add, in fairqueue's terms."""

    name: str
    data: dict[str, Any]
    level: PriorityLevel
    job_id: str | None = None
    delay_ms: int | None = None
    attempts: int | None = None


@dataclass(frozen=True, slots=True)
class AddedJob:
    """An added job. ``priority`` is ``None`` when a job with the given id already
    existed (BullMQ then keeps the existing job and adds nothing)."""

    job_id: str
    priority: int | None


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


def _unavailable(exc: BaseException) -> BrokerUnavailableError:
    return BrokerUnavailableError(f"Redis is unavailable ({type(exc).__name__})")


def parse_job_data(raw: str | None) -> dict[str, Any] | None:
    """Decode a job's ``data`` field; ``None`` when it is not a JSON object."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _int_or(value: Any, default: int | None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True, slots=True)
class _AddCommand:
    """One EVALSHA that adds one or more jobs, built without I/O."""

    sha: str
    source: str
    keys: list[str]
    args: list[Any]
    delayed: bool


def _added(command: _AddCommand, reply: Any) -> list[AddedJob]:
    if isinstance(reply, Exception):
        raise reply
    pairs = (
        [(reply, BACK_OF_LINE)]
        if command.delayed
        else list(zip(reply[::2], reply[1::2], strict=True))
    )
    added = []
    for job_id, priority in pairs:
        if isinstance(job_id, int) and job_id < 0:
            raise ResponseError(f"BullMQ refused the job (code {job_id})")
        added.append(AddedJob(job_id=str(job_id), priority=int(priority) or None))
    return added


class _AddPacker:
    """Builds add commands (keys and BullMQ's msgpacked arguments) with BullMQ's own code.

    The bullmq ``Queue`` objects kept here only pack arguments; they never connect.
    """

    #: Jobs per EVALSHA; larger batches are split (each part is still all-or-nothing
    #: with respect to validation, which happens before anything is sent).
    batch_size: Final = 1_000

    def __init__(self, redis_url: str, prefix: str) -> None:
        self._redis_url = redis_url
        self.prefix = prefix
        self._queues: dict[str, BullQueue] = {}
        self._lock = threading.Lock()
        self.add_source = add_script_source()
        self.add_sha = hashlib.sha1(self.add_source.encode()).hexdigest()  # noqa: S324
        self.delayed_source = loadScript("addDelayedJob-6.lua")
        self.delayed_sha = hashlib.sha1(self.delayed_source.encode()).hexdigest()  # noqa: S324

    def _queue(self, name: str) -> BullQueue:
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                queue = BullQueue(name, {"connection": self._redis_url, "prefix": self.prefix})
                self._queues[name] = queue
            return queue

    def add_commands(self, queue: str, jobs: Sequence[NewJob]) -> list[_AddCommand]:
        bull_queue = self._queue(queue)
        scripts = bull_queue.scripts
        commands: list[_AddCommand] = []
        batch: list[Any] = []
        for job in jobs:
            opts: dict[str, Any] = {"priority": BACK_OF_LINE}
            if job.job_id is not None:
                opts["jobId"] = job.job_id
            if job.delay_ms:
                opts["delay"] = job.delay_ms
            if job.attempts is not None:
                opts["attempts"] = job.attempts
            bull_job = BullJob(bull_queue, job.name, job.data, opts)
            args = scripts.addJobArgs(bull_job)
            args.append(bull_job.timestamp)
            if job.delay_ms:
                keys = scripts.getKeys(["marker", "meta", "id", "delayed", "completed", "events"])
                commands.append(
                    _AddCommand(self.delayed_sha, self.delayed_source, keys, args, delayed=True)
                )
                continue
            batch.append((*args, job.level.value))
            if len(batch) == self.batch_size:
                commands.append(self._batch_command(queue, scripts, batch))
                batch = []
        if batch:
            commands.append(self._batch_command(queue, scripts, batch))
        return commands

    def _batch_command(self, queue: str, scripts: Any, batch: list[Any]) -> _AddCommand:
        keys = scripts.getKeys(
            [
                "marker",
                "meta",
                "id",
                "prioritized",
                "delayed",
                "completed",
                "active",
                "events",
                "pc",
            ]
        )
        keys.append(f"{self.prefix}:{queue}:fq:tags")
        args: list[Any] = [len(batch)]
        for job_args in batch:
            args.extend(job_args)
        return _AddCommand(self.add_sha, self.add_source, keys, args, delayed=False)


def _run_adds_sync(client: Any, commands: list[_AddCommand]) -> list[AddedJob]:
    """Run add commands with a blocking client; the twin of ``Broker._run_adds``."""
    added: list[AddedJob] = []
    for command in commands:
        try:
            reply = client.evalsha(command.sha, len(command.keys), *command.keys, *command.args)
        except NoScriptError:
            # Redis lost its script cache (restart, SCRIPT FLUSH): nothing ran.
            client.script_load(command.source)
            reply = client.evalsha(command.sha, len(command.keys), *command.keys, *command.args)
        added.extend(_added(command, reply))
    return added


class _LoopState:
    """Redis client and BullMQ queues bound to one event loop."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.queues: dict[str, BullQueue] = {}
        self.scripts: dict[str, Any] = {}


class Broker:
    """Async access to BullMQ queues under one Redis URL and key prefix.

    Args:
        redis_url: where Redis is (may hold credentials: never logged).
        prefix: BullMQ key prefix; ``"bull"`` is BullMQ's default.
        client_factory: builds the ``redis.asyncio`` client (injectable for tests).
    """

    def __init__(
        self,
        redis_url: str,
        prefix: str = "bull",
        *,
        client_factory: Callable[[str], aioredis.Redis] | None = None,
    ) -> None:
        self.prefix = prefix
        self._redis_url = redis_url
        self._client_factory = client_factory or _default_client
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )
        self._packer = _AddPacker(redis_url, prefix)

    def __repr__(self) -> str:
        return f"Broker(prefix={self.prefix!r})"

    # -- plumbing ---------------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = _LoopState(self._client_factory(self._redis_url))
            for name, source in (
                ("overdue", OVERDUE_SCRIPT),
                ("rebase", REBASE_SCRIPT),
                ("meta", META_SCRIPT),
                ("change", change_script_source()),
                ("release", RELEASE_LOCK_SCRIPT),
                ("renew", RENEW_LOCK_SCRIPT),
            ):
                state.scripts[name] = state.client.register_script(source)
            self._states[loop] = state
        return state

    def client(self) -> aioredis.Redis:
        return self._state().client

    def queue(self, name: str) -> BullQueue:
        state = self._state()
        queue = state.queues.get(name)
        if queue is None:
            queue = BullQueue(name, {"connection": state.client, "prefix": self.prefix})
            state.queues[name] = queue
        return queue

    def key(self, queue: str, suffix: str) -> str:
        """A BullMQ key of ``queue`` (``prefix:queue:suffix``)."""
        return f"{self.prefix}:{queue}:{suffix}"

    def fair_key(self, queue: str, suffix: str) -> str:
        """A key fairqueue owns beside the queue's keys."""
        return f"{self.prefix}:{queue}:fq:{suffix}"

    async def _guard(self, coro: Awaitable[T]) -> T:
        """Turn "Redis is not there" into BrokerUnavailableError; let other errors be."""
        try:
            return await coro
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise _unavailable(exc) from exc

    async def ping(self) -> bool:
        return await self._guard(self.client().ping())

    async def close(self) -> None:
        state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state.client.aclose()

    # -- enqueue ----------------------------------------------------------------------

    async def add_jobs(self, queue: str, jobs: Sequence[NewJob]) -> list[AddedJob]:
        """Add ``jobs`` at their fair tags in one round trip (one MULTI/EXEC for a batch).

        Raises:
            BrokerUnavailableError: Redis did not answer; nothing was added.
        """
        commands = self._packer.add_commands(queue, jobs)
        return await self._guard(self._run_adds(commands))

    async def add_job(self, queue: str, job: NewJob) -> AddedJob:
        return (await self.add_jobs(queue, [job]))[0]

    async def _run_adds(self, commands: list[_AddCommand]) -> list[AddedJob]:
        client = self.client()
        added: list[AddedJob] = []
        for command in commands:
            try:
                reply = await client.evalsha(
                    command.sha, len(command.keys), *command.keys, *command.args
                )
            except NoScriptError:
                # Redis lost its script cache (restart, SCRIPT FLUSH): nothing ran.
                await client.script_load(command.source)
                reply = await client.evalsha(
                    command.sha, len(command.keys), *command.keys, *command.args
                )
            added.extend(_added(command, reply))
        return added

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

    # -- leader lock ------------------------------------------------------------------

    async def acquire_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        """Take ``key`` if free, or renew it if ``token`` already holds it."""
        return await self._guard(self._acquire_lock(key, token, ttl_ms))

    async def _acquire_lock(self, key, token, ttl_ms):
        client = self.client()
        if await client.set(key, token, nx=True, px=ttl_ms):
            return True
        return bool(await self._state().scripts["renew"](keys=[key], args=[token, ttl_ms]))

    async def release_lock(self, key: str, token: str) -> bool:
        return bool(await self._guard(self._state().scripts["release"](keys=[key], args=[token])))

    async def lock_holder(self, key: str) -> tuple[str | None, int]:
        """The token holding ``key`` and its remaining time in ms."""
        client = self.client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            holder, ttl = await self._guard(pipe.execute())
        return holder, int(ttl)

    async def write_status(self, queue: str, name: str, record: dict[str, Any]) -> None:
        """Store a small JSON status record beside the queue (e.g. the last pass)."""
        await self._guard(self.client().set(self.fair_key(queue, name), json.dumps(record)))

    async def read_status(self, queue: str, name: str) -> dict[str, Any] | None:
        raw = await self._guard(self.client().get(self.fair_key(queue, name)))
        return parse_job_data(raw)

    # -- worker support (fairqueue.worker) --------------------------------------------
    # The only place a BullMQ Worker is built, so BullMQ's Job object stays in here.

    def make_worker(
        self,
        queue: str,
        processor: Callable[[ActiveJob], Awaitable[None]],
        *,
        concurrency: int,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> BullWorker:
        """A stock BullMQ worker for ``queue`` under this broker's Redis URL and prefix.

        It is not started: the caller awaits ``worker.run()`` and later
        ``worker.close()``, which stops taking jobs and waits for the active ones. It
        opens its own connections (BullMQ's worker blocks on one of them).

        Args:
            queue: the BullMQ queue name.
            processor: called with each job; an exception it raises fails the job, so
                BullMQ's attempts and backoff apply. Its return value is not stored.
            concurrency: how many jobs this worker runs at once.
            on_error: called with errors BullMQ's loop meets outside a processor
                (e.g. a lost connection), which BullMQ would otherwise drop.
        """

        async def process(job: BullJob, token: str) -> None:
            await processor(
                ActiveJob(
                    job_id=str(job.id),
                    name=job.name or "",
                    data=job.data,
                    attempts_made=_int_or(job.attemptsMade, 0) or 0,
                )
            )

        worker = BullWorker(
            queue,
            process,
            {
                "connection": self._redis_url,
                "prefix": self.prefix,
                "concurrency": concurrency,
                "autorun": False,
            },
        )
        if on_error is not None:
            worker.on("error", lambda error, *_: on_error(error))
        return worker

    async def count_unfinished(self, queue: str) -> int:
        """Jobs of ``queue`` a worker still has to finish: waiting (in the wait list or
        the prioritized set), delayed (including retries serving their backoff) or
        active.

        Read in one MULTI, so a job moving between those states (a retry going from
        active back to prioritized) is counted exactly once and an idle check cannot
        see a queue empty while it is not.
        """
        async with self.client().pipeline(transaction=True) as pipe:
            pipe.llen(self.key(queue, "wait"))
            pipe.zcard(self.key(queue, "prioritized"))
            pipe.zcard(self.key(queue, "delayed"))
            pipe.llen(self.key(queue, "active"))
            counts = await self._guard(pipe.execute())
        return sum(int(count) for count in counts)

    # -- dashboard support (fairqueue.dashboard) --------------------------------------
    # Read-only helpers for the admin dashboard. Each costs O(page) per call except
    # scan_backlog, which the dashboard runs synchronously only for small backlogs.

    #: The jobs at pop positions ARGV[1]..ARGV[2] (0-based, inclusive), read atomically:
    #: the wait list first (BullMQ pops it from its right end), then the prioritized set.
    #: Returns the wait list's length and flat (id, score) pairs, score "0" for wait jobs.
    DASHBOARD_PAGE_SCRIPT: Final = """
local waitLen = redis.call('LLEN', KEYS[1])
local first, last = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
if first < waitLen then
  local stop = math.min(last, waitLen - 1)
  local ids = redis.call('LRANGE', KEYS[1], waitLen - 1 - stop, waitLen - 1 - first)
  for i = #ids, 1, -1 do
    out[#out + 1] = ids[i]
    out[#out + 1] = '0'
  end
end
if last >= waitLen then
  local entries = redis.call('ZRANGE', KEYS[2], math.max(first - waitLen, 0), last - waitLen,
    'WITHSCORES')
  for i = 1, #entries do out[#out + 1] = entries[i] end
end
return {waitLen, out}
"""

    #: One page of a backlog scan, over the wait list (ARGV[1] = 'list', cursor = index)
    #: or the prioritized set (ARGV[1] = 'zset', cursor = exclusive score bound, so jobs
    #: popped meanwhile do not shift the pages). Classifies each job as
    #: ``rebalance.pending_from_job`` does (data's tenantId/priorityLevel, else the
    #: requested or stored priority through normalize_priority; '?' when unreadable) and
    #: returns {count, next cursor, [level, waiting, overdue, oldest ts]...,
    #: [level, tenant, waiting]..., [id, ts, level, tenant] of each overdue job}.
    DASHBOARD_SCAN_SCRIPT: Final = """
local mode, cursor, count = ARGV[1], ARGV[2], tonumber(ARGV[3])
local cutoff, prefix = tonumber(ARGV[4]), ARGV[5]
local ids, nextCursor = {}, cursor
if mode == 'list' then
  local first = tonumber(cursor)
  ids = redis.call('LRANGE', KEYS[1], first, first + count - 1)
  nextCursor = tostring(first + #ids)
else
  local entries = redis.call('ZRANGEBYSCORE', KEYS[1], cursor, '+inf', 'WITHSCORES',
    'LIMIT', 0, count)
  for i = 1, #entries, 2 do ids[#ids + 1] = entries[i] end
  if #entries > 0 then nextCursor = '(' .. entries[#entries] end
end
local names = {critical = true, high = true, normal = true, low = true}
local function normalize(p)
  if p < 0 then return nil end
  if p == 0 then return 'normal' end
  if p == 1 then return 'critical' end
  if p <= 3 then return 'high' end
  if p <= 5 then return 'normal' end
  return 'low'
end
local stats, tenants, late = {}, {}, {}
for _, id in ipairs(ids) do
  local row = redis.call('HMGET', prefix .. id, 'data', 'timestamp', 'priority', 'opts')
  local ts = tonumber(row[2])
  local level, tenant = nil, nil
  if ts and row[1] and string.find(row[1], '^%s*{') then
    local ok, data = pcall(cjson.decode, row[1])
    if ok and type(data) == 'table' then
      local t = data['tenantId']
      if t == nil or t == cjson.null then tenant = 'default'
      elseif type(t) == 'string' and t ~= '' then tenant = t end
      local l = data['priorityLevel']
      if l ~= nil and l ~= cjson.null then
        if type(l) == 'string' and names[l] then level = l end
      else
        local p = nil
        if row[4] then
          local okOpts, opts = pcall(cjson.decode, row[4])
          if okOpts and type(opts) == 'table' and type(opts['priority']) == 'number'
            and opts['priority'] == math.floor(opts['priority']) then
            p = opts['priority']
          end
        end
        if p == nil then
          if mode == 'list' then p = 0 else p = tonumber(row[3]) or 0 end
        end
        level = normalize(p)
      end
    end
  end
  if tenant == nil then level = nil end
  local key = level or '?'
  local s = stats[key]
  if s == nil then
    s = {0, 0, -1}
    stats[key] = s
  end
  s[1] = s[1] + 1
  if ts then
    if ts < cutoff then s[2] = s[2] + 1 end
    if s[3] < 0 or ts < s[3] then s[3] = ts end
  end
  if level then
    local byTenant = tenants[level]
    if byTenant == nil then
      byTenant = {}
      tenants[level] = byTenant
    end
    byTenant[tenant] = (byTenant[tenant] or 0) + 1
    if ts < cutoff then
      late[#late + 1] = id
      late[#late + 1] = ts
      late[#late + 1] = level
      late[#late + 1] = tenant
    end
  end
end
local flatStats, flatTenants = {}, {}
for key, s in pairs(stats) do
  flatStats[#flatStats + 1] = key
  flatStats[#flatStats + 1] = s[1]
  flatStats[#flatStats + 1] = s[2]
  flatStats[#flatStats + 1] = s[3]
end
for level, byTenant in pairs(tenants) do
  for tenant, n in pairs(byTenant) do
    flatTenants[#flatTenants + 1] = level
    flatTenants[#flatTenants + 1] = tenant
    flatTenants[#flatTenants + 1] = n
  end
end
return {#ids, nextCursor, flatStats, flatTenants, late}
"""

    def _dashboard_script(self, name: str, source: str) -> Any:
        state = self._state()
        key = f"dashboard:{name}"
        script = state.scripts.get(key)
        if script is None:
            script = state.client.register_script(source)
            state.scripts[key] = script
        return script

    async def _dashboard_guard(self, coro: Awaitable[T]) -> T:
        """Like :meth:`_guard`, but an error answer from Redis (e.g. a script error under
        memory pressure) is also BrokerUnavailableError: a dashboard shows it, never
        raises it as a 500."""
        try:
            return await self._guard(coro)
        except redis.RedisError as exc:
            raise _unavailable(exc) from exc

    async def read_page(self, queue: str, *, start: int, count: int) -> list[WaitingJob]:
        """The waiting jobs at pop positions ``start .. start+count-1`` (0-based), in the
        order a BullMQ worker takes them: the wait list, then the prioritized set.

        Costs O(count) whatever the backlog, so the dashboard can page deep into it.
        """
        return await self._dashboard_guard(self._read_page(queue, start, count))

    async def _read_page(self, queue: str, start: int, count: int) -> list[WaitingJob]:
        if count <= 0:
            return []
        script = self._dashboard_script("page", self.DASHBOARD_PAGE_SCRIPT)
        _, flat = await script(
            keys=[self.key(queue, "wait"), self.key(queue, "prioritized")],
            args=[start, start + count - 1],
        )
        entries = [
            (str(job_id), int(float(score)) // _SCORE_BASE, score == "0")
            for job_id, score in zip(flat[::2], flat[1::2], strict=True)
        ]
        return await self._read_jobs(queue, entries)

    async def scan_backlog(
        self, queue: str, *, cutoff_ms: int, page_size: int = 5_000, max_jobs: int = 2_000_000
    ) -> BacklogScan:
        """Per-level waiting and overdue counts, oldest enqueue time and per-tenant counts
        over the whole waiting backlog, plus every overdue job.

        Runs inside Redis in pages of ``page_size`` jobs (each page blocks Redis for a few
        ms), so it costs O(backlog): about 6 ms per 1,000 jobs. Jobs moving while it runs
        may be missed or counted twice; the result is a snapshot, not a transaction.
        """
        return await self._dashboard_guard(
            self._scan_backlog(queue, cutoff_ms, page_size, max_jobs)
        )

    async def _scan_backlog(
        self, queue: str, cutoff_ms: int, page_size: int, max_jobs: int
    ) -> BacklogScan:
        started = time.perf_counter()
        script = self._dashboard_script("scan", self.DASHBOARD_SCAN_SCRIPT)
        result = BacklogScan(cutoff_ms=cutoff_ms)
        prefix = self.key(queue, "")
        for mode, key, cursor in (
            ("list", self.key(queue, "wait"), "0"),
            ("zset", self.key(queue, "prioritized"), "-inf"),
        ):
            while result.scanned < max_jobs:
                count, cursor, stats, tenants, late = await script(
                    keys=[key], args=[mode, cursor, page_size, cutoff_ms, prefix]
                )
                result.add_page(int(count), stats, tenants, late)
                if int(count) < page_size:
                    break
        result.duration_ms = (time.perf_counter() - started) * 1000
        return result

    async def still_prioritized(self, queue: str, job_ids: Sequence[str]) -> list[bool]:
        """Which of ``job_ids`` are still in the prioritized set (one round trip): a
        scan's results go stale as workers take jobs."""
        if not job_ids:
            return []
        return await self._dashboard_guard(self._still_prioritized(queue, job_ids))

    async def _still_prioritized(self, queue: str, job_ids: Sequence[str]) -> list[bool]:
        async with self.client().pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.zscore(self.key(queue, "prioritized"), job_id)
            scores = await pipe.execute()
        return [score is not None for score in scores]

    async def read_job_detail(self, queue: str, job_id: str) -> JobDetail | None:
        """One job's stored fields and its BullMQ state; ``None`` if there is no such job
        (or the id names one of the queue's own keys rather than a job)."""
        return await self._dashboard_guard(self._read_job_detail(queue, job_id))

    async def _read_job_detail(self, queue: str, job_id: str) -> JobDetail | None:
        async with self.client().pipeline(transaction=False) as pipe:
            pipe.hmget(self.key(queue, job_id), *_JOB_FIELDS, "processedOn", "finishedOn")
            pipe.zscore(self.key(queue, "prioritized"), job_id)
            pipe.lpos(self.key(queue, "wait"), job_id)
            pipe.lpos(self.key(queue, "active"), job_id)
            pipe.zscore(self.key(queue, "delayed"), job_id)
            pipe.zscore(self.key(queue, "completed"), job_id)
            pipe.zscore(self.key(queue, "failed"), job_id)
            replies = await pipe.execute(raise_on_error=False)
        row = replies[0]
        if isinstance(row, Exception) or all(value is None for value in row[:3]):
            return None  # no job, or a key of another type (WRONGTYPE)
        name, data, timestamp, priority, attempts_made, opts, processed, finished = row
        state = "unknown"
        for label, found in zip(
            ("prioritized", "waiting", "active", "delayed", "completed", "failed"),
            replies[1:],
            strict=True,
        ):
            if found is not None and not isinstance(found, Exception):
                state = label
                break
        parsed_opts = parse_job_data(opts) or {}
        requested = parsed_opts.get("priority")
        max_attempts = parsed_opts.get("attempts")
        return JobDetail(
            job=WaitingJob(
                job_id=job_id,
                name=name or "",
                data=parse_job_data(data),
                timestamp_ms=_int_or(timestamp, None),
                priority=_int_or(priority, 0) or 0,
                attempts_made=_int_or(attempts_made, 0) or 0,
                in_wait_list=state == "waiting",
                requested_priority=requested if type(requested) is int else None,
            ),
            state=state,
            max_attempts=max_attempts if type(max_attempts) is int else None,
            processed_on_ms=_int_or(processed, None),
            finished_on_ms=_int_or(finished, None),
        )

    # -- demo support (fairqueue.demo) ------------------------------------------------
    # The demo's load generator and fairness summary count finished jobs by level and
    # tenant; a long demo trims them so Redis does not fill up with completed jobs.

    async def finished_since(
        self, queue: str, *, since_ms: int, limit: int = 10_000
    ) -> list[FinishedJob]:
        """Completed jobs of ``queue`` that finished at or after ``since_ms``, oldest first
        (at most ``limit``), with the times BullMQ stored for them.

        BullMQ keeps completed jobs in a sorted set scored by ``finishedOn``, so this costs
        O(log n + found) however long the history is.
        """
        return await self._guard(self._finished_since(queue, since_ms, limit))

    async def _finished_since(self, queue: str, since_ms: int, limit: int) -> list[FinishedJob]:
        client = self.client()
        ids = await client.zrangebyscore(
            self.key(queue, "completed"), since_ms, "+inf", start=0, num=limit
        )
        if not ids:
            return []
        async with client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(self.key(queue, job_id), *_FINISHED_FIELDS)
            rows = await pipe.execute()
        return [
            FinishedJob(
                job_id=str(job_id),
                data=parse_job_data(data),
                timestamp_ms=_int_or(timestamp, None),
                processed_on_ms=_int_or(processed, None),
                finished_on_ms=_int_or(finished, None),
            )
            for job_id, (data, timestamp, processed, finished) in zip(ids, rows, strict=True)
            if finished is not None  # trimmed between the two reads
        ]

    async def trim_finished(self, queue: str, *, grace_ms: int, limit: int = 10_000) -> int:
        """Delete up to ``limit`` completed jobs that finished more than ``grace_ms`` ago,
        with BullMQ's own ``clean``; returns how many were deleted."""
        return len(await self._guard(self.queue(queue).clean(grace_ms, limit, "completed")))


@dataclass(frozen=True, slots=True)
class ActiveJob:
    """A job a worker took, in fairqueue's terms (see :meth:`Broker.make_worker`).

    ``data`` is the job's payload as enqueued (normally a dict, but other producers may
    enqueue any JSON value); ``attempts_made`` counts the attempts that already failed.
    """

    job_id: str
    name: str
    data: Any
    attempts_made: int


def _default_client(redis_url: str) -> aioredis.Redis:
    return aioredis.from_url(
        redis_url,
        decode_responses=True,
        socket_connect_timeout=2,
        socket_timeout=10,
        health_check_interval=30,
    )


class _LoopThread:
    """One event loop running in a daemon thread, per process (recreated after fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid: int | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="fairqueue-broker", daemon=True
                ).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop


_loop_thread = _LoopThread()


def _drop_if_stale(client: redis.Redis) -> None:
    """Disconnect a kept connection that Redis closed (restart, idle timeout), as
    redis-py's pool does on check-out; the next command then reconnects. Sending on it
    instead would fail after the fact, unsure whether the command ran."""
    connection = client.connection
    if connection is None:
        return
    try:
        if connection.can_read(timeout=0):  # a healthy idle connection has nothing to read
            connection.disconnect()
    except (RedisConnectionError, OSError):
        connection.disconnect()


class SyncBroker:
    """Blocking facade over :class:`Broker` for sync code.

    Enqueues go straight from the calling thread over that thread's own connection (a
    single-connection client per thread: no pool check-out on the hot path). Everything
    else runs on one event-loop thread per process with one async pool. A forked child
    opens its own connections and loop (a socket must never be shared across
    ``fork()``).
    """

    def __init__(self, broker: Broker, *, timeout_s: float = 30.0) -> None:
        self.broker = broker
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._clients: list[redis.Redis] = []
        self._clients_lock = threading.Lock()

    def _client(self) -> redis.Redis:
        client, pid = getattr(self._local, "client", (None, None))
        if client is None or pid != os.getpid():
            client = redis.Redis.from_url(
                self.broker._redis_url,
                decode_responses=True,
                socket_connect_timeout=2,
                socket_timeout=10,
                single_connection_client=True,
            )
            self._local.client = (client, os.getpid())
            with self._clients_lock:
                self._clients.append(client)
        else:
            _drop_if_stale(client)
        return client

    def add_jobs(self, queue: str, jobs: Sequence[NewJob]) -> list[AddedJob]:
        """Add jobs from the calling thread with a blocking client: no event-loop hop on
        the enqueue hot path (sync views enqueue as fast as raw BullMQ can)."""
        commands = self.broker._packer.add_commands(queue, jobs)
        try:
            return _run_adds_sync(self._client(), commands)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise _unavailable(exc) from exc

    def add_job(self, queue: str, job: NewJob) -> AddedJob:
        return self.add_jobs(queue, [job])[0]

    def close(self) -> None:
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        self._local = threading.local()
        self.run(self.broker.close)

    def __repr__(self) -> str:
        return f"SyncBroker({self.broker!r})"

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``await fn(*args, **kwargs)`` on the broker's loop and wait for it."""
        loop = _loop_thread.get()
        if _running_loop() is loop:
            raise RuntimeError("SyncBroker.run called from its own event loop")
        future: Future[T] = asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), loop)
        try:
            return future.result(self._timeout_s)
        except TimeoutError as exc:
            future.cancel()
            raise BrokerUnavailableError("Redis did not answer in time (TimeoutError)") from exc

    def __getattr__(self, name: str) -> Callable[..., Any]:
        attr = getattr(self.broker, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(attr, *args, **kwargs)

        return call


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_brokers: dict[tuple[int, str, str], tuple[Broker, SyncBroker]] = {}
_brokers_lock = threading.Lock()


def _get_pair() -> tuple[Broker, SyncBroker]:
    from .conf import get_settings

    settings = get_settings()
    key = (os.getpid(), settings.redis_url, settings.prefix)
    with _brokers_lock:
        pair = _brokers.get(key)
        if pair is None:
            broker = Broker(settings.redis_url, settings.prefix)
            pair = (broker, SyncBroker(broker))
            _brokers[key] = pair
        return pair


def close_brokers() -> None:
    """Close this process's broker connections (tests, and processes about to exit)."""
    with _brokers_lock:
        pairs = list(_brokers.values())
        _brokers.clear()
    for _, sync_broker in pairs:
        try:
            sync_broker.close()
        except BrokerUnavailableError:
            pass


def get_broker() -> Broker:
    """The process's async broker for the configured Redis URL and prefix."""
    return _get_pair()[0]


def get_sync_broker() -> SyncBroker:
    """The process's blocking broker for the configured Redis URL and prefix."""
    return _get_pair()[1]


@dataclass(frozen=True, slots=True)
class LevelScan:
    """One level's share of a backlog scan. ``oldest_ms`` is ``None`` for no jobs."""

    waiting: int = 0
    overdue: int = 0
    oldest_ms: int | None = None


@dataclass(slots=True)
class BacklogScan:
    """What :meth:`Broker.scan_backlog` found. Levels are level names, plus ``"?"`` for
    jobs whose fairqueue metadata cannot be read (the pass skips those)."""

    cutoff_ms: int
    scanned: int = 0
    levels: dict[str, LevelScan] = field(default_factory=dict)
    #: level -> tenant -> waiting jobs.
    tenants: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Overdue jobs with readable metadata: (job id, enqueued at ms, level, tenant).
    overdue: list[tuple[str, int, str, str]] = field(default_factory=list)
    duration_ms: float = 0.0

    def add_page(self, count: int, stats: list[Any], tenants: list[Any], late: list[Any]) -> None:
        self.scanned += count
        for level, waiting, overdue, oldest in zip(
            stats[::4], stats[1::4], stats[2::4], stats[3::4], strict=True
        ):
            seen = self.levels.get(level, LevelScan())
            oldest_ms = int(oldest) if int(oldest) >= 0 else None
            if seen.oldest_ms is not None and (oldest_ms is None or seen.oldest_ms < oldest_ms):
                oldest_ms = seen.oldest_ms
            self.levels[level] = LevelScan(
                waiting=seen.waiting + int(waiting),
                overdue=seen.overdue + int(overdue),
                oldest_ms=oldest_ms,
            )
        for level, tenant, waiting in zip(tenants[::3], tenants[1::3], tenants[2::3], strict=True):
            by_tenant = self.tenants.setdefault(level, {})
            by_tenant[tenant] = by_tenant.get(tenant, 0) + int(waiting)
        for job_id, timestamp, level, tenant in zip(
            late[::4], late[1::4], late[2::4], late[3::4], strict=True
        ):
            self.overdue.append((str(job_id), int(timestamp), level, tenant))


@dataclass(frozen=True, slots=True)
class JobDetail:
    """A job as the dashboard's detail page shows it. ``state`` is BullMQ's:
    waiting, prioritized, active, delayed, completed, failed or unknown."""

    job: WaitingJob
    state: str
    max_attempts: int | None
    processed_on_ms: int | None
    finished_on_ms: int | None


# -- demo support types -------------------------------------------------------------------

_FINISHED_FIELDS: Final = ("data", "timestamp", "processedOn", "finishedOn")


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A completed job as :meth:`Broker.finished_since` reads it (times in ms since the
    epoch; ``None`` where BullMQ stored nothing)."""

    job_id: str
    data: dict[str, Any] | None
    timestamp_ms: int | None
    processed_on_ms: int | None
    finished_on_ms: int | None

    @property
    def wait_ms(self) -> int | None:
        """How long the job waited before a worker took it."""
        if self.timestamp_ms is None or self.processed_on_ms is None:
            return None
        return max(0, self.processed_on_ms - self.timestamp_ms)
