"""Enqueueing: the job types, the add packer and its commands, sync and async add."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis
from bullmq import Job as BullJob
from bullmq import Queue as BullQueue
from redis.exceptions import ResponseError

from fairqueue.broker.common import BACK_OF_LINE, fair_key, fair_keys, limits_key
from fairqueue.broker.connection import BrokerPart, Connection
from fairqueue.broker.limit_store import parse_released, release_args, release_keys
from fairqueue.broker.scripts import (
    Script,
    add_delayed_script,
    add_jobs_script,
    call_script,
    call_script_sync,
    plain_script,
)
from fairqueue.exceptions import AccountBacklogFullError, TenantBacklogFullError
from fairqueue.scheduling.hierarchy import ACCOUNT_MARK
from fairqueue.scheduling.levels import DEFAULT_TENANT, PriorityLevel
from fairqueue.scheduling.wire import account_meta

#: Undelayed jobs per add-script call (each call is atomic: all its jobs or none).
ADD_BATCH_SIZE: Final = 250

#: The fqReady slot the packer appends to an undelayed job's packed opts: the key
#: ``fqReady`` and a 9-byte msgpack uint64 (all ones) that the add script overwrites
#: with Redis's clock as bytes (lua/wrap/add_jobs.head.lua's ``fqReadySlot``), so Redis does
#: not unpack and repack every job's opts.
READY_SLOT: Final = b"\xa7fqReady\xcf" + b"\xff" * 8


def with_ready_slot(packed_opts: bytes) -> bytes:
    """``packed_opts`` (a msgpack map without ``fqReady``) with the fqReady slot as its
    last entry; the map header's count goes up by one (fixmap, map16 or map32)."""
    head = packed_opts[0]
    if 0x80 <= head < 0x8F:
        return bytes([head + 1]) + packed_opts[1:] + READY_SLOT
    if head == 0x8F:  # 15 entries: 16 need a map16 header
        return b"\xde\x00\x10" + packed_opts[1:] + READY_SLOT
    if head == 0xDE:
        count = int.from_bytes(packed_opts[1:3], "big") + 1
        return b"\xde" + count.to_bytes(2, "big") + packed_opts[3:] + READY_SLOT
    if head == 0xDF:
        count = int.from_bytes(packed_opts[1:5], "big") + 1
        return b"\xdf" + count.to_bytes(4, "big") + packed_opts[5:] + READY_SLOT
    raise ValueError("packed opts are not a msgpack map")


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to add, in fairqueue's terms: ``tenant`` is its tenant bucket inside its
    level and ``tenant_weight`` that tenant's turns per round (both only place the job;
    the payload carries the tenant id workers see)."""

    name: str
    data: dict[str, Any]
    level: PriorityLevel
    job_id: str | None = None
    delay_ms: int | None = None
    attempts: int | None = None
    #: BullMQ's ``backoff`` option (``{"type": ..., "delay": ms}``), validated upstream.
    backoff: dict[str, Any] | None = None
    tenant: str = DEFAULT_TENANT
    tenant_weight: int = 1
    #: The caller's estimate of the job's worker time (``cost=``, in ms); ``None``: its
    #: flow's measured estimate.
    cost_ms: int | None = None
    #: The tenant's limits as ``release_held.lua`` reads them (``wire.encoded_limits``);
    #: ``None``: no limits, the job goes straight to its fair place.
    limits: str | None = None
    #: ``data`` as BullMQ stores it (``json.dumps`` with BullMQ's separators), when the
    #: caller has made it already (the enqueue API does, to check the payload's size):
    #: packing then skips a second serialisation. ``None``: serialised from ``data``.
    data_json: str | None = None
    #: Its expected start (ms, Redis's clock) when the enqueue asked for an estimate:
    #: kept in its opts (``fqEta``) for the estimate-error metric. ``None``: not asked.
    eta_ms: int | None = None
    #: The tenant's account and the account's weight (docs/design.md, "Accounts");
    #: ``None``: none, the tenant is an account of its own.
    account: str | None = None
    account_weight: int = 1
    #: The account's limits as the scripts read them (``wire.encoded_limits``); ``None``:
    #: none. Its jobs come with ``limits`` then (maybe empty ones), so they are held.
    account_limits: str | None = None


@dataclass(frozen=True, slots=True)
class AddBatch:
    """A chunk of a batch added in several calls: the batch's token (the same for all its
    chunks) and, per tenant, the jobs its later chunks add."""

    token: str
    later: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class AddedJob:
    """An added job. ``priority`` is ``None`` when a job with the given id already
    existed (BullMQ then keeps the existing job and adds nothing)."""

    job_id: str
    priority: int | None
    #: Why the job stayed held after its add (``"max_active"``, ``"rate"``, ``"paused"``);
    #: ``None``: takeable at once (or no limits).
    held: str | None = None


@dataclass(frozen=True, slots=True)
class _AddCommand:
    """One EVALSHA that adds one or more jobs, built without I/O."""

    script: Script
    keys: list[str] | list[bytes]
    #: The script's arguments by name (``args`` puts them in ARGV's order).
    named: dict[str, Any]
    delayed: bool
    queue: str = ""
    #: The release that follows an add that held jobs: its keys and arguments by name
    #: (``None``: no tenant of the command has limits).
    release: tuple[list[str], dict[str, Any]] | None = None
    #: The tenants whose limits the command carries (their max_waiting is checked).
    limits_given: tuple[str, ...] = ()
    #: The jobs it adds.
    size: int = 1

    @property
    def sha(self) -> str:
        return self.script.sha

    @property
    def source(self) -> str:
        return self.script.source

    @property
    def args(self) -> list[Any]:
        return self.script.args(**self.named)


def _given_limits(job: NewJob) -> dict[str, str]:
    """What an add call carries for ``job``: its tenant's limits, and its account's (keyed
    ``ACCOUNT_MARK + account``) when the account has some; nothing without limits."""
    given = {} if job.limits is None else {job.tenant: job.limits}
    if given and job.account is not None and job.account_limits is not None:
        given[ACCOUNT_MARK + job.account] = job.account_limits
    return given


def _added(command: _AddCommand, reply: Any) -> list[AddedJob]:
    if isinstance(reply, Exception):
        raise reply
    if isinstance(reply, list) and reply and reply[0] == "fq:backlog":
        _, tenant, limit, waiting = reply
        tenant = tenant.decode() if isinstance(tenant, bytes) else str(tenant)
        if tenant.startswith(ACCOUNT_MARK):
            raise AccountBacklogFullError(
                account_id=tenant[len(ACCOUNT_MARK) :],
                queue=command.queue,
                limit=int(limit),
                waiting=int(waiting),
            )
        raise TenantBacklogFullError(
            tenant_id=tenant, queue=command.queue, limit=int(limit), waiting=int(waiting)
        )
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


#: A level as the add scripts take it (bytes: sent as they are, not encoded per job).
_LEVEL_ARG: Final = {level: level.value.encode() for level in PriorityLevel}


class AddPacker:
    """Builds add commands (keys and BullMQ's msgpacked arguments) with BullMQ's own code.

    The bullmq ``Queue`` objects kept here only pack arguments; they never connect.
    """

    #: Jobs per EVALSHA (each costs Redis about 50 us, so a call blocks Redis ~15 ms);
    #: larger batches are split (each part is still all-or-nothing with respect to
    #: validation, which happens before anything is sent).
    batch_size: Final = ADD_BATCH_SIZE

    def __init__(
        self,
        prefix: str,
        *,
        remove_on_complete: dict[str, int] | bool | None = None,
        remove_on_fail: dict[str, int] | bool | None = None,
        fairness_by: str = "time",
    ) -> None:
        #: What the fair clock counts (``FAIRNESS_BY``): ``"time"`` or ``"jobs"``.
        self.fairness_by = fairness_by
        self._fairness_arg = fairness_by.encode()
        #: BullMQ's ``removeOnComplete`` / ``removeOnFail`` given to every job (``None``:
        #: BullMQ's default, keep every finished job). Workers apply them when they finish
        #: a job, Node ones too, since they are stored in the job's own options.
        self.retention: dict[str, Any] = {
            name: value
            for name, value in (
                ("removeOnComplete", remove_on_complete),
                ("removeOnFail", remove_on_fail),
            )
            if value is not None
        }
        # The queues only pack: their client is never used, so it never connects (and
        # any kind of deployment, Sentinel or Cluster, packs the same).
        self._unused_client = aioredis.Redis()
        self.prefix = prefix
        self._queues: dict[str, BullQueue] = {}
        self._keys: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()
        self.add_script, self.delayed_script = add_jobs_script(), add_delayed_script()

    def _queue(self, name: str) -> BullQueue:
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                queue = BullQueue(name, {"connection": self._unused_client, "prefix": self.prefix})
                self._queues[name] = queue
            return queue

    def add_commands(
        self, queue: str, jobs: Sequence[NewJob], *, batch: AddBatch | None = None
    ) -> list[_AddCommand]:
        """The add commands of ``jobs``. ``batch``: this call is a chunk of a batch added
        in several calls. A batch that takes more than one command is checked against
        ``max_waiting`` whole by its first command, which reserves room for the rest
        (``tenant_limits.lua``)."""
        commands = self._commands(queue, jobs)
        if batch is not None:
            self._batch_args(commands, jobs, batch.token, batch.later)
        elif len(commands) > 1:
            self._batch_args(commands, jobs, uuid.uuid4().hex, {})
        return commands

    @staticmethod
    def _batch_args(
        commands: list[_AddCommand],
        jobs: Sequence[NewJob],
        token: str,
        later: Mapping[str, int],
    ) -> None:
        """Give each command of a batch of several (with limited tenants) its batch's
        token and, per tenant, the jobs the batch's later commands add."""
        counts: list[dict[str, int]] = []
        index = 0
        for command in commands:
            tally: dict[str, int] = {}
            for job in jobs[index : index + command.size]:
                tally[job.tenant] = tally.get(job.tenant, 0) + 1
                if job.account is not None and job.account_limits is not None:
                    of = ACCOUNT_MARK + job.account
                    tally[of] = tally.get(of, 0) + 1
            counts.append(tally)
            index += command.size
        left = dict(later)
        for command, tally in zip(reversed(commands), reversed(counts), strict=True):
            limited = command.limits_given
            if limited:
                mine = {tenant: left.get(tenant, 0) for tenant in limited}
                batch = json.dumps({"token": token, "left": mine}, separators=(",", ":"))
                command.named["batch"] = batch
            for tenant, count in tally.items():
                left[tenant] = left.get(tenant, 0) + count

    def _commands(self, queue: str, jobs: Sequence[NewJob]) -> list[_AddCommand]:
        bull_queue = self._queue(queue)
        scripts = bull_queue.scripts
        commands: list[_AddCommand] = []
        batch: list[Any] = []
        limits: dict[str, str] = {}
        for job in jobs:
            opts: dict[str, Any] = {"priority": BACK_OF_LINE, **self.retention}
            if job.job_id is not None:
                opts["jobId"] = job.job_id
            if job.delay_ms:
                opts["delay"] = job.delay_ms
            if job.attempts is not None:
                opts["attempts"] = job.attempts
            if job.backoff is not None:
                opts["backoff"] = job.backoff
            if job.eta_ms is not None:
                opts["fqEta"] = job.eta_ms
            if job.account is not None:
                # what its re-runs, and a delayed job once promoted, are placed with
                opts["fqAcct"] = account_meta(job.account, job.account_weight)
            given = job.data_json
            bull_job = BullJob(bull_queue, job.name, job.data if given is None else None, opts)
            packed_args, data, packed_opts = scripts.addJobArgs(bull_job)
            if given is not None:
                data = given
            if not job.delay_ms:
                packed_opts = with_ready_slot(packed_opts)
            if job.delay_ms:
                commands.append(
                    self._delayed_command(queue, scripts, job, packed_args, data, packed_opts)
                )
                continue
            # ADD_JOB_FIELDS, in its order (wire.lua's fqReadJobs)
            batch.append(
                (
                    packed_args,
                    data,
                    packed_opts,
                    _LEVEL_ARG[job.level],
                    job.tenant,
                    job.tenant_weight,
                    b"" if job.cost_ms is None else job.cost_ms,
                    # no account: empty, and its weight too (read as 1), which the client
                    # sends as it is instead of formatting a number
                    b"" if job.account is None else job.account,
                    b"" if job.account is None else job.account_weight,
                )
            )
            if job.limits is not None:  # the common case has none: nothing to carry
                limits.update(_given_limits(job))
            if len(batch) == self.batch_size:
                commands.append(self._batch_command(queue, scripts, batch, limits))
                batch, limits = [], {}
        if batch:
            commands.append(self._batch_command(queue, scripts, batch, limits))
        return commands

    def _delayed_command(
        self, queue: str, scripts: Any, job: NewJob, packed_args: Any, data: Any, opts: Any
    ) -> _AddCommand:
        """A delayed job's add command (``add_delayed``: one job a call)."""
        keys = scripts.getKeys(["marker", "meta", "id", "delayed", "completed", "events"])
        keys += [fair_key(self.prefix, queue, name) for name in ("ready", "jobs")]
        keys += [limits_key(self.prefix, queue), f"{self.prefix}:{queue}:prioritized"]
        keys.append(fair_key(self.prefix, queue, "dly"))
        named = dict(packed_args=packed_args, data=data, opts=opts, level=_LEVEL_ARG[job.level])
        named.update(tenant=job.tenant, weight=job.tenant_weight, delay=job.delay_ms)
        named["limits"] = job.limits or ""
        limited = tuple(_given_limits(job))
        if len(limited) > 1:  # its account's max_waiting counts it too
            named["batch"] = ""
            named["account_limits"] = job.account_limits
        return _AddCommand(
            self.delayed_script, keys, named, delayed=True, queue=queue, limits_given=limited
        )

    def _add_keys(self, queue: str, scripts: Any) -> list[bytes]:
        """The add script's keys for ``queue``, made once (as bytes: the client sends
        them as they are) instead of on every call."""
        keys = self._keys.get(queue)
        if keys is None:
            names = scripts.getKeys(
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
            names += [*fair_keys(self.prefix, queue), limits_key(self.prefix, queue)]
            keys = [key.encode() for key in names]
            self._keys[queue] = keys
        return keys

    def _batch_command(
        self, queue: str, scripts: Any, batch: list[Any], limits: dict[str, str]
    ) -> _AddCommand:
        keys = self._add_keys(queue, scripts)
        named = {
            "fairness": self._fairness_arg,
            # only calls with limited tenants carry them (and pay for them)
            "limits": json.dumps(limits, separators=(",", ":")) if limits else b"",
            "batch": b"",
            "jobs": [value for job_args in batch for value in job_args],
        }
        return _AddCommand(
            self.add_script,
            keys,
            named,
            delayed=False,
            queue=queue,
            limits_given=tuple(limits),
            size=len(batch),
            release=(
                (
                    release_keys(self.prefix, queue),
                    release_args(
                        self.prefix,
                        queue,
                        [t for t in limits if not t.startswith(ACCOUNT_MARK)],  # accounts aside
                        self.fairness_by,
                        "release",
                    ),
                )
                if limits
                else None
            ),
        )


def _with_held(added: list[AddedJob], reply: Any) -> list[AddedJob]:
    """Mark the jobs of an add that its release left held (the call's last ones: a
    tenant's held jobs go oldest first), with the limit that holds them."""
    released = parse_released(reply)
    reason = next((name for name, count in released.by_reason.items() if count), None)
    if reason is None:
        return added
    fresh = [index for index, job in enumerate(added) if job.priority is not None]
    for index in fresh[max(0, len(fresh) - released.held) :]:
        added[index] = AddedJob(added[index].job_id, added[index].priority, held=reason)
    return added


def run_adds_sync(client: Any, commands: list[_AddCommand]) -> list[AddedJob]:
    """Run add commands with a blocking client; the twin of ``Adder._run_adds``."""
    added: list[AddedJob] = []
    for command in commands:
        reply = call_script_sync(client, command.sha, command.source, command.keys, command.args)
        jobs = _added(command, reply)
        if command.release is not None:
            release = plain_script("release_held")
            keys, named = command.release
            argv = release.args(**named)
            jobs = _with_held(
                jobs, call_script_sync(client, release.sha, release.source, keys, argv)
            )
        added.extend(jobs)
    return added


class Adder(BrokerPart):
    """Enqueueing. The packer is shared with :class:`SyncBroker`, whose blocking adds
    send the very commands this class sends from async code."""

    def __init__(
        self,
        conn: Connection,
        *,
        remove_on_complete: dict[str, int] | bool | None = None,
        remove_on_fail: dict[str, int] | bool | None = None,
        fairness_by: str = "time",
    ) -> None:
        super().__init__(conn)
        self.packer = AddPacker(
            conn.prefix,
            remove_on_complete=remove_on_complete,
            remove_on_fail=remove_on_fail,
            fairness_by=fairness_by,
        )

    async def add_jobs(
        self, queue: str, jobs: Sequence[NewJob], *, batch: AddBatch | None = None
    ) -> list[AddedJob]:
        """Add ``jobs`` at their fair places, one EVALSHA per batch of up to 250 jobs
        (each batch atomic; delayed jobs one per EVALSHA).

        Raises:
            BrokerUnavailableError: Redis did not answer; nothing was added.
        """
        commands = self.packer.add_commands(queue, jobs, batch=batch)
        return await self.conn.guard(self._run_adds(commands))

    async def add_job(self, queue: str, job: NewJob) -> AddedJob:
        return (await self.add_jobs(queue, [job]))[0]

    async def _run_adds(self, commands: list[_AddCommand]) -> list[AddedJob]:
        client = self.conn.client()
        added: list[AddedJob] = []
        for command in commands:
            reply = await call_script(
                client, command.sha, command.source, command.keys, command.args
            )
            jobs = _added(command, reply)
            if command.release is not None:
                keys, named = command.release
                script = self.conn.script(plain_script("release_held"))
                jobs = _with_held(jobs, await script(keys=keys, **named))
            added.extend(jobs)
        return added
