"""The broker as callers see it: :class:`Broker` (async), composed of one part per job,
:class:`SyncBroker` (blocking) over it, and the per-process brokers."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, ParamSpec

from fairqueue.broker.adding import AddBatch, AddedJob, Adder, NewJob, run_adds_sync
from fairqueue.broker.clients import SyncClient, client_name, drop_if_stale, sync_client
from fairqueue.broker.common import REDIS_ERRORS, T, broker_error, unavailable
from fairqueue.broker.connection import Connection, loop_thread
from fairqueue.broker.console_reads import ConsoleReads
from fairqueue.broker.dashboard_reads import DashboardReads
from fairqueue.broker.failure_reads import FailureReads
from fairqueue.broker.history_store import HistoryStore
from fairqueue.broker.limit_store import LimitStore
from fairqueue.broker.lock_store import LockStore
from fairqueue.broker.pass_store import PassStore
from fairqueue.broker.results import ResultReads
from fairqueue.broker.status_reads import StatusReads
from fairqueue.broker.usage_store import UsageStore
from fairqueue.broker.workers import WorkerSupport
from fairqueue.conf import get_settings
from fairqueue.exceptions import BrokerUnavailableError
from fairqueue.redis_target import RedisTarget

P = ParamSpec("P")


class Broker:
    """Async access to BullMQ queues under one Redis target and key prefix, one part per
    job: ``adding``, ``passes`` (the rebalance pass), ``lock`` (its leader lock),
    ``dashboard``, ``history``, ``workers``, ``results``, ``limits`` (per-tenant limits),
    ``console`` and ``failures`` (the console's pages), ``status`` (the job-status
    endpoint) and ``usage`` (the usage ledger), all over one ``conn``.

    Args:
        redis, prefix, client_factory: as :class:`Connection`'s.
        fairness_by: what the fair clock counts (``FAIRNESS_BY``: ``"time"``, ``"jobs"``).
        remove_on_complete, remove_on_fail: BullMQ's ``removeOnComplete`` /
            ``removeOnFail`` (``{"count": n, "age": seconds}``) set on every job this
            broker adds; ``None`` leaves BullMQ's default (keep every finished job).
    """

    def __init__(
        self,
        redis: str | RedisTarget,
        prefix: str = "bull",
        *,
        client_factory: Callable[[RedisTarget], Any] | None = None,
        remove_on_complete: dict[str, int] | bool | None = None,
        remove_on_fail: dict[str, int] | bool | None = None,
        fairness_by: str = "time",
    ) -> None:
        self.conn = Connection(redis, prefix, client_factory=client_factory)
        self.adding = Adder(
            self.conn,
            remove_on_complete=remove_on_complete,
            remove_on_fail=remove_on_fail,
            fairness_by=fairness_by,
        )
        self.passes = PassStore(self.conn)
        self.limits = LimitStore(self.conn, fairness_by=fairness_by)
        self.lock = LockStore(self.conn)
        self.dashboard = DashboardReads(self.conn)
        self.history = HistoryStore(self.conn)
        self.workers = WorkerSupport(self.conn)
        self.results = ResultReads(self.conn)
        self.console = ConsoleReads(self.conn)
        self.failures = FailureReads(self.conn)
        self.status = StatusReads(self.conn, fairness_by=fairness_by)
        self.usage = UsageStore(self.conn)

    @property
    def prefix(self) -> str:
        return self.conn.prefix

    @property
    def target(self) -> RedisTarget:
        return self.conn.target

    def fair_key(self, queue: str, suffix: str) -> str:
        """A key fairqueue owns beside the queue's keys."""
        return self.conn.fair_key(queue, suffix)

    async def ping(self) -> bool:
        return await self.conn.ping()

    async def close(self) -> None:
        await self.conn.close()

    def __repr__(self) -> str:
        return f"Broker(prefix={self.prefix!r})"


class SyncBroker:
    """Blocking access to a :class:`Broker` for sync code.

    Enqueues (:meth:`add_jobs`, :meth:`add_job`) go straight from the calling thread over
    that thread's own connection (a single-connection client per thread: no pool
    check-out and no thread hop on the hot path). Any other call runs on one event-loop
    thread per process with one async pool: ``sync.run(sync.broker.lock.lock_holder,
    key)`` is typed like the method it runs. A forked child opens its own connections and
    loop (a socket must never be shared across ``fork()``).
    """

    def __init__(self, broker: Broker, *, timeout_s: float = 30.0) -> None:
        self.broker = broker
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._clients: list[SyncClient] = []
        self._clients_lock = threading.Lock()

    def _client(self) -> SyncClient:
        client, pid = getattr(self._local, "client", (None, None))
        if client is None or pid != os.getpid():
            client = sync_client(self.broker.target, client_name(self.broker.prefix))
            self._local.client = (client, os.getpid())
            with self._clients_lock:
                self._clients.append(client)
        else:
            drop_if_stale(client)
        return client

    def add_jobs(
        self, queue: str, jobs: Sequence[NewJob], *, batch: AddBatch | None = None
    ) -> list[AddedJob]:
        """Add jobs from the calling thread with a blocking client: no event-loop hop on
        the enqueue hot path (sync views enqueue as fast as raw BullMQ can). ``batch``:
        this call is a chunk of a batch added in several (``AddPacker.add_commands``)."""
        commands = self.broker.adding.packer.add_commands(queue, jobs, batch=batch)
        try:
            return run_adds_sync(self._client(), commands)
        except REDIS_ERRORS as exc:
            raise broker_error(exc, self.broker.target) from exc

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

    def run(self, fn: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``await fn(*args, **kwargs)`` on the broker's loop and wait for it."""
        loop = loop_thread.get()
        if _running_loop() is loop:
            raise RuntimeError("SyncBroker.run called from its own event loop")
        future: Future[T] = asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), loop)
        try:
            return future.result(self._timeout_s)
        except TimeoutError as exc:
            future.cancel()
            raise unavailable(
                f"TimeoutError (no answer within {self._timeout_s:g} s)", self.broker.target
            ) from exc


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_brokers: dict[tuple[Any, ...], tuple[Broker, SyncBroker]] = {}
_brokers_lock = threading.Lock()


def _get_pair() -> tuple[Broker, SyncBroker]:
    settings = get_settings()
    keep = (settings.keep_completed, settings.keep_failed)
    key = (os.getpid(), settings.redis_url, settings.prefix, keep, settings.fairness_by)
    with _brokers_lock:
        pair = _brokers.get(key)
        if pair is None:
            broker = Broker(
                settings.redis,
                settings.prefix,
                remove_on_complete=settings.keep_completed.bullmq_option(),
                remove_on_fail=settings.keep_failed.bullmq_option(),
                fairness_by=settings.fairness_by,
            )
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
