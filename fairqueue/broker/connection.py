"""The broker's plumbing: a Redis client per event loop, key names, error mapping, the
blocking :class:`SyncBroker` facade and the per-process brokers."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.asyncio.sentinel as aiosentinel
import redis.cluster
import redis.sentinel
from bullmq import Queue as BullQueue
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from fairqueue.broker.adding import AddedJob, NewJob, _AddPacker, _run_adds_sync
from fairqueue.broker.common import REDIS_ERRORS, T, broker_error, fair_key
from fairqueue.broker.scripts import Script
from fairqueue.broker.sentinel import (
    AsyncFailoverAwareConnection,
    AsyncFailoverAwareSSLConnection,
    FailoverAwareConnection,
    FailoverAwareSSLConnection,
)
from fairqueue.exceptions import BrokerUnavailableError
from fairqueue.redis_target import RedisTarget, parse_redis_target

if TYPE_CHECKING:
    from fairqueue.broker import Broker

logger = logging.getLogger("fairqueue.broker")


class _LoopState:
    """Redis client and BullMQ queues bound to one event loop."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.queues: dict[str, BullQueue] = {}
        self.scripts: dict[str, Any] = {}
        self.closer: asyncio.Task[None] | None = None
        self.closed = False

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            await self.client.aclose()


def client_name(prefix: str) -> str:
    """The name fairqueue's Redis connections carry (``CLIENT LIST`` shows it), so an
    operator sees which connections are fairqueue's and for which prefix."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in prefix)
    return f"fairqueue.{safe}"[:64]


class BrokerCore:
    """Async access to BullMQ queues under one Redis target and key prefix.

    Args:
        redis: where Redis is: a URL (``redis://``, ``redis+sentinel://``,
            ``redis+cluster://``...) or a validated :class:`RedisTarget` (may hold
            credentials: never logged).
        prefix: BullMQ key prefix; ``"bull"`` is BullMQ's default.
        client_factory: builds the ``redis.asyncio`` client (injectable for tests).
    """

    def __init__(
        self,
        redis: str | RedisTarget,
        prefix: str = "bull",
        *,
        client_factory: Callable[[RedisTarget], AsyncClient] | None = None,
        remove_on_complete: dict[str, int] | bool | None = None,
        remove_on_fail: dict[str, int] | bool | None = None,
    ) -> None:
        self.prefix = prefix
        self.target = (
            redis if isinstance(redis, RedisTarget) else parse_redis_target(redis, "redis")
        )
        self._redis_url = self.target.url
        self._client_factory = client_factory or (
            lambda target: async_client(target, client_name(prefix))
        )
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )
        self._packer = _AddPacker(
            prefix, remove_on_complete=remove_on_complete, remove_on_fail=remove_on_fail
        )

    def __repr__(self) -> str:
        return f"Broker(prefix={self.prefix!r})"

    # -- plumbing ---------------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = _LoopState(self._client_factory(self.target))
            self._states[loop] = state
            if loop is not _loop_thread.current():
                # A loop that ends (``asyncio.run``: asgiref's ``async_to_sync`` runs
                # every async view of a WSGI server on a new one) must take its client
                # with it: its shutdown cancels this task, which closes the client.
                state.closer = loop.create_task(self._close_with_loop(loop, state))
        return state

    async def _close_with_loop(self, loop: asyncio.AbstractEventLoop, state: _LoopState) -> None:
        try:
            await loop.create_future()  # never set: runs until the loop cancels it
        finally:
            if self._states.get(loop) is state:
                del self._states[loop]
            await state.aclose()

    def script(self, script: Script) -> Any:
        """``script`` registered with this loop's client (EVALSHA, loaded on NOSCRIPT)."""
        state = self._state()
        registered = state.scripts.get(script.name)
        if registered is None:
            registered = state.client.register_script(script.source)
            state.scripts[script.name] = registered
        return registered

    def client(self) -> AsyncClient:
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
        return fair_key(self.prefix, queue, suffix)

    async def _guard(self, coro: Awaitable[T]) -> T:
        """Every Redis error as a :class:`~fairqueue.exceptions.BrokerError`: "Redis is
        not there" as ``BrokerUnavailableError``, an error reply (``OutOfMemoryError``,
        ``WRONGTYPE``, a script error) as ``BrokerRejectedError``. The one place the
        async broker translates them, so callers never see a raw redis-py error."""
        try:
            return await coro
        except REDIS_ERRORS as exc:
            raise broker_error(exc) from exc

    async def ping(self) -> bool:
        return await self._guard(self.client().ping())

    async def close(self) -> None:
        state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None:
            if state.closer is not None:
                state.closer.cancel()
            await state.aclose()


#: A ``redis.asyncio`` client of any kind the broker makes (all take the same commands;
#: a cluster client routes each one, and each script call, to the slot of its keys).
AsyncClient = aioredis.Redis | aiocluster.RedisCluster
#: A blocking client of any kind (enqueues from sync code).
SyncClient = redis.Redis | redis.cluster.RedisCluster

_TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 2, "socket_timeout": 10}
#: How long async Sentinel clients (workers, the pass, the dashboard) keep retrying a
#: command that failed because the master went away or was left behind (0.1 s doubling
#: to 1 s, ~25 s in all): through a failover, so that a worker's "job done" write reaches
#: the new master instead of failing and leaving the job active, to run again once BullMQ
#: finds it stalled. Each retry follows a connection error or NOREPLICAS, where the
#: script did not run. (Enqueues, on the sync client, fail fast instead: retry them with
#: the same job id, or enqueue durably.)
FAILOVER_RETRIES = 30


def async_client(target: RedisTarget, name: str | None = None) -> AsyncClient:
    """A ``redis.asyncio`` client for ``target``: one server's pool, the master Sentinel
    names now (re-asked after a failover: the pool reconnects on a connection error or a
    READONLY or NOREPLICAS reply, see ``sentinel.py``), or a cluster client that follows
    MOVED/ASK redirections. BullMQ's Python package takes any of them as its
    ``connection``.

    ``name`` is the connections' ``CLIENT SETNAME`` (see :func:`client_name`). Replies
    are decoded with ``errors="replace"``: the dashboard and the pass read what any
    producer wrote, and bytes that are not UTF-8 must not turn a page into a 500
    (strict on what fairqueue writes, tolerant on what it reads)."""
    named: dict[str, Any] = {"client_name": name, "encoding_errors": "replace"}
    if target.kind == "sentinel":
        sentinel = aiosentinel.Sentinel(
            list(target.nodes),
            sentinel_kwargs={**_TIMEOUTS, "password": target.sentinel_password},
            **_TIMEOUTS,
        )
        return sentinel.master_for(
            target.service,
            decode_responses=True,
            db=target.db,
            username=target.username,
            password=target.password,
            connection_class=(
                AsyncFailoverAwareSSLConnection if target.ssl else AsyncFailoverAwareConnection
            ),
            retry=AsyncRetry(ExponentialBackoff(cap=1.0, base=0.05), FAILOVER_RETRIES),
            health_check_interval=30,
            **named,
        )
    if target.kind == "cluster":
        return aiocluster.RedisCluster(
            startup_nodes=[aiocluster.ClusterNode(host, port) for host, port in target.nodes],
            decode_responses=True,
            username=target.username,
            password=target.password,
            ssl=target.ssl,
            health_check_interval=30,
            **named,
            **_TIMEOUTS,
        )
    return aioredis.from_url(
        target.url,
        decode_responses=True,
        health_check_interval=30,
        # No silent resend (aenqueue_job's adds go through this client; see sync_client).
        # Workers on one server use BullMQ's own clients, and a pass or a page that fails
        # is run again by its loop or its reader.
        retry=AsyncRetry(NoBackoff(), 0),
        **named,
        **_TIMEOUTS,
    )


def sync_client(target: RedisTarget, name: str | None = None) -> SyncClient:
    """A blocking client for ``target`` (see :func:`async_client`). For one server it holds
    a single connection (the enqueue hot path checks nothing out of a pool)."""
    named: dict[str, Any] = {"client_name": name}
    if target.kind == "sentinel":
        sentinel = redis.sentinel.Sentinel(
            list(target.nodes),
            sentinel_kwargs={**_TIMEOUTS, "password": target.sentinel_password},
            **_TIMEOUTS,
        )
        return sentinel.master_for(
            target.service,
            decode_responses=True,
            db=target.db,
            username=target.username,
            password=target.password,
            connection_class=FailoverAwareSSLConnection if target.ssl else FailoverAwareConnection,
            retry=Retry(NoBackoff(), 0),  # no silent resend of an add (see below)
            **named,
        )
    if target.kind == "cluster":
        return redis.cluster.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(host, port) for host, port in target.nodes],
            decode_responses=True,
            username=target.username,
            password=target.password,
            ssl=target.ssl,
            **named,
            **_TIMEOUTS,
        )
    return redis.Redis.from_url(
        target.url,
        decode_responses=True,
        single_connection_client=True,
        **named,
        # No silent resend: an add whose reply was lost may have run, and a resent add
        # of a job without an id would enqueue it twice. The caller gets
        # BrokerUnavailableError and retries under its job id.
        retry=Retry(NoBackoff(), 0),
        **_TIMEOUTS,
    )


class _LoopThread:
    """One event loop running in a daemon thread, per process (recreated after fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid: int | None = None

    def current(self) -> asyncio.AbstractEventLoop | None:
        """This process's broker loop if it has one (no loop is started)."""
        return self._loop if self._pid == os.getpid() else None

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


def _drop_if_stale(client: SyncClient) -> None:
    """Disconnect a kept connection that Redis closed (restart, idle timeout), as
    redis-py's pool does on check-out; the next command then reconnects. Sending on it
    instead would fail after the fact, unsure whether the command ran. (Pooled clients,
    Sentinel's and Cluster's, check their connections themselves.)"""
    connection = getattr(client, "connection", None)
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
            _drop_if_stale(client)
        return client

    def add_jobs(self, queue: str, jobs: Sequence[NewJob]) -> list[AddedJob]:
        """Add jobs from the calling thread with a blocking client: no event-loop hop on
        the enqueue hot path (sync views enqueue as fast as raw BullMQ can)."""
        commands = self.broker._packer.add_commands(queue, jobs)
        try:
            return _run_adds_sync(self._client(), commands)
        except REDIS_ERRORS as exc:
            raise broker_error(exc) from exc

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


_brokers: dict[tuple[Any, ...], tuple[Broker, SyncBroker]] = {}
_brokers_lock = threading.Lock()


def _get_pair() -> tuple[Broker, SyncBroker]:
    from fairqueue.broker import Broker  # assembled from this module's BrokerCore and the mixins
    from fairqueue.conf import get_settings

    settings = get_settings()
    keep = (settings.keep_completed, settings.keep_failed)
    key = (os.getpid(), settings.redis_url, settings.prefix, keep)
    with _brokers_lock:
        pair = _brokers.get(key)
        if pair is None:
            broker = Broker(
                settings.redis,
                settings.prefix,
                remove_on_complete=settings.keep_completed.bullmq_option(),
                remove_on_fail=settings.keep_failed.bullmq_option(),
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
