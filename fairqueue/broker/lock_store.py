"""The rebalance pass's leader lock: take or renew it, release it, see who holds it."""

from __future__ import annotations

from fairqueue.broker.connection import BrokerPart
from fairqueue.broker.scripts import plain_script


class LockStore(BrokerPart):
    """The rebalance pass's leader lock."""

    # -- leader lock ------------------------------------------------------------------

    async def acquire_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        """Take ``key`` if free, or renew it if ``token`` already holds it, in one step."""
        script = self.conn.script(plain_script("lock_acquire"))
        return bool(await self.conn.guard(script(keys=[key], args=[token, ttl_ms])))

    async def release_lock(self, key: str, token: str) -> bool:
        script = self.conn.script(plain_script("lock_release"))
        return bool(await self.conn.guard(script(keys=[key], args=[token])))

    async def lock_holder(self, key: str) -> tuple[str | None, int]:
        """The token holding ``key`` and its remaining time in ms."""
        client = self.conn.client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            holder, ttl = await self.conn.guard(pipe.execute())
        return holder, int(ttl)
