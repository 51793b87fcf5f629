"""The rebalance pass's leader lock: take or renew it, release it, see who holds it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import BrokerCore as _Base
else:
    _Base = object


class LockMixin(_Base):
    """:class:`Broker`'s leader lock (mixed in; uses ``BrokerCore``'s plumbing)."""

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
