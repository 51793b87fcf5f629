"""The rebalance pass's leader lock: take or renew it, release it, see who holds it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairqueue.broker.scripts import plain_script

if TYPE_CHECKING:
    from fairqueue.broker.connection import BrokerCore as _Base
else:
    _Base = object


class LockMixin(_Base):
    """:class:`Broker`'s leader lock (mixed in; uses ``BrokerCore``'s plumbing)."""

    # -- leader lock ------------------------------------------------------------------

    async def acquire_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        """Take ``key`` if free, or renew it if ``token`` already holds it, in one step."""
        script = self.script(plain_script("lock_acquire"))
        return bool(await self._guard(script(keys=[key], args=[token, ttl_ms])))

    async def release_lock(self, key: str, token: str) -> bool:
        script = self.script(plain_script("lock_release"))
        return bool(await self._guard(script(keys=[key], args=[token])))

    async def lock_holder(self, key: str) -> tuple[str | None, int]:
        """The token holding ``key`` and its remaining time in ms."""
        client = self.client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            holder, ttl = await self._guard(pipe.execute())
        return holder, int(ttl)
