"""The broker's shared plumbing: :class:`Connection` (a Redis client and BullMQ queues per
event loop, key names, error mapping), the per-process event-loop thread that sync code
runs async calls on, and :class:`BrokerPart`, the base of the broker's parts."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, TypeVar

from bullmq import Queue as BullQueue

from fairqueue.broker.clients import AsyncClient, async_client, client_name
from fairqueue.broker.common import REDIS_ERRORS, T, broker_error, fair_key
from fairqueue.broker.scripts import Script, call_script
from fairqueue.redis_target import RedisTarget, parse_redis_target


class _LoopState:
    """Redis client and BullMQ queues bound to one event loop."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.queues: dict[str, BullQueue] = {}
        self.closer: asyncio.Task[None] | None = None
        self.closed = False

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            await self.client.aclose()


class Connection:
    """The plumbing every part of the broker shares: a Redis client and BullMQ queue
    objects per event loop, the key names under one prefix, and error mapping.

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
    ) -> None:
        self.prefix = prefix
        # A URL given here comes from no setting: errors name only where it points.
        self.target = (
            redis
            if isinstance(redis, RedisTarget)
            else replace(parse_redis_target(redis, "redis"), source="")
        )
        self.client_factory = client_factory or (
            lambda target: async_client(target, client_name(prefix))
        )
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"Connection(prefix={self.prefix!r})"

    # -- plumbing ---------------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = _LoopState(self.client_factory(self.target))
            self._states[loop] = state
            if loop is not loop_thread.current():
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

    def script(self, script: Script) -> Callable[..., Awaitable[Any]]:
        """``script`` on this loop's client, its arguments by name: ``await
        conn.script(s)(keys, token=..., ttl=...)`` (:meth:`~fairqueue.broker.scripts
        .Script.args`: a missing or unknown one raises ``TypeError`` at the call;
        :func:`~fairqueue.broker.scripts.call_script`)."""
        client = self.client()

        def call(keys: Sequence[Any] = (), **args: Any) -> Awaitable[Any]:
            return call_script(client, script.sha, script.source, keys, script.args(**args))

        return call

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

    async def guard(self, coro: Awaitable[T]) -> T:
        """Every Redis error as a :class:`~fairqueue.exceptions.BrokerError`: "Redis is
        not there" as ``BrokerUnavailableError``, an error reply (``OutOfMemoryError``,
        ``WRONGTYPE``, a script error) as ``BrokerRejectedError``. The one place the
        async broker translates them, so callers never see a raw redis-py error."""
        try:
            return await coro
        except REDIS_ERRORS as exc:
            raise broker_error(exc, self.target) from exc

    async def ping(self) -> bool:
        return await self.guard(self.client().ping())

    async def close(self) -> None:
        state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None:
            if state.closer is not None:
                state.closer.cancel()
            await state.aclose()


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


loop_thread = _LoopThread()


class BrokerPart:
    """One job of the broker (adding, the pass, the dashboard's reads, ...): a small
    class over the :class:`Connection` that all parts of one broker share."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn


Part = TypeVar("Part", bound=BrokerPart)
P = ParamSpec("P")


def guarded(
    method: Callable[Concatenate[Part, P], Awaitable[T]],
) -> Callable[Concatenate[Part, P], Coroutine[Any, Any, T]]:
    """A part's method with every Redis error it meets a ``BrokerError``
    (:meth:`Connection.guard`)."""

    @functools.wraps(method)
    async def run(self: Part, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.conn.guard(method(self, *args, **kwargs))

    return run
