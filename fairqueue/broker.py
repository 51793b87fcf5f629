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
  virtual finish tag (see :data:`ADD_PRELUDE`), so the backlog behind the window is
  already in approximately fair order and a new critical job does not wait behind a
  whole backlog of low jobs for the next pass to find it.
* Rebalance writes go through BullMQ's own ``changePriority`` script, pipelined, so a
  stock BullMQ worker (Python or Node) pops the jobs in the fair order.

Sync callers (Django views, management commands) use :class:`SyncBroker`, which runs the
async client on one event-loop thread per process with one connection pool, recreated
after ``fork()``. Async callers (async views) await :class:`Broker` directly.
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
from collections.abc import Awaitable, Callable, Iterable, Sequence
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
  if ts and ts < cutoff then out[#out + 1] = ids[i] end
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

    async def _load_scripts(self, scripts: Iterable[Any]) -> None:
        client = self.client()
        for script in scripts:
            script.sha = await client.script_load(script.script)

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
            pipe.lrange(self.key(queue, "wait"), 0, max_window_band - 1)
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
        wait_ids.reverse()  # BullMQ pops the wait list from its right end
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
        self, queue: str, *, cutoff_ms: int, start: int, page_size: int = 10_000
    ) -> list[str]:
        """Ids of jobs in the prioritized set from rank ``start`` on, enqueued before
        ``cutoff_ms``, in pop order. Pages through the set inside Redis."""
        return await self._guard(self._find_overdue(queue, cutoff_ms, start, page_size))

    async def _find_overdue(self, queue, cutoff_ms, start, page_size):
        script = self._state().scripts["overdue"]
        found: list[str] = []
        position = start
        while True:
            scanned, ids = await script(
                keys=[self.key(queue, "prioritized")],
                args=[position, position + page_size - 1, cutoff_ms, self.key(queue, "")],
            )
            found.extend(ids)
            position += page_size
            if scanned < page_size:
                return found

    async def count_wait_list(self, queue: str) -> int:
        return await self._guard(self.client().llen(self.key(queue, "wait")))

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

    async def obliterate(self, queue: str) -> None:
        """Remove a queue and fairqueue's keys beside it (tests and demos)."""
        await self._guard(self.queue(queue).obliterate(force=True))
        keys = [k async for k in self.client().scan_iter(match=self.key(queue, "fq:*"))]
        if keys:
            await self.client().delete(*keys)

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


class SyncBroker:
    """Blocking facade over :class:`Broker` for sync code.

    Calls run on one event-loop thread per process, so the process keeps one connection
    pool however many threads enqueue; a forked child gets its own loop and pool (a
    pool must never be shared across ``fork()``).
    """

    def __init__(self, broker: Broker, *, timeout_s: float = 30.0) -> None:
        self.broker = broker
        self._timeout_s = timeout_s
        self._sync_client: redis.Redis | None = None
        self._sync_lock = threading.Lock()

    def _client(self) -> redis.Redis:
        # redis-py's pool notices a fork and starts afresh in the child.
        with self._sync_lock:
            if self._sync_client is None:
                self._sync_client = redis.Redis.from_url(
                    self.broker._redis_url,
                    decode_responses=True,
                    socket_connect_timeout=2,
                    socket_timeout=10,
                )
            return self._sync_client

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
        with self._sync_lock:
            client, self._sync_client = self._sync_client, None
        if client is not None:
            client.close()
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


def now_ms() -> int:
    return int(time.time() * 1000)
