"""Connections to the master Sentinel names, that also leave a demoted master behind.

redis-py's Sentinel connections re-ask Sentinel for the master when the server they
talk to answers READONLY (it became a replica). Between a failover's promotion of a
replica and Sentinel reconfiguring the old master (up to ~10 s on a graceful SENTINEL
FAILOVER), the old master still thinks it is master and accepts writes, which the
failover then discards: jobs lost. A master run with ``min-replicas-to-write 1`` refuses
writes once its replica left it (``NOREPLICAS``; a script is refused before it writes
anything). These connections treat that answer like READONLY: drop the connection and
raise ``ConnectionError``, so the next attempt asks Sentinel again and finds the new
master, and fairqueue reports ``BrokerUnavailableError`` (retry with the same job id)
instead of a job silently written where it will be lost.

They also ask Sentinel again whenever they reconnect: redis-py 8 reconnects a dropped
Sentinel connection to the address it last had (``send_packed_command`` goes straight to
``connect_check_health``, past the Sentinel lookup in ``connect``), so after a failover
every retry would reach the old master again.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.connection import SSLConnection as AsyncSSLConnection
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection
from redis.connection import SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.sentinel import SentinelManagedConnection

_NOREPLICAS = "NOREPLICAS"


def _left_behind(connection: Any, exc: ResponseError) -> bool:
    return connection.connection_pool.is_master and str(exc).startswith(_NOREPLICAS)


class FailoverAwareConnection(SentinelManagedConnection):
    """A blocking Sentinel-managed connection that leaves a master without replicas."""

    def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        if not self._sock:
            self.connect()  # the Sentinel lookup, then the master it names
        super().send_packed_command(*args, **kwargs)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if _left_behind(self, exc):
                self.disconnect()
                raise RedisConnectionError("the master lost its replicas (NOREPLICAS)") from exc
            raise


class FailoverAwareSSLConnection(FailoverAwareConnection, SSLConnection):
    pass


class AsyncFailoverAwareConnection(AsyncSentinelConnection):
    """An asyncio Sentinel-managed connection that leaves a master without replicas."""

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        if not self.is_connected:
            await self.connect()  # the Sentinel lookup, then the master it names
        await super().send_packed_command(*args, **kwargs)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if _left_behind(self, exc):
                await self.disconnect()
                raise RedisConnectionError("the master lost its replicas (NOREPLICAS)") from exc
            raise


class AsyncFailoverAwareSSLConnection(AsyncFailoverAwareConnection, AsyncSSLConnection):
    pass
