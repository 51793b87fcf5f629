"""The rebalance pass's leader lock: take or renew it, release it, see who holds it."""

from __future__ import annotations

from dataclasses import dataclass

from fairqueue.broker.connection import BrokerPart
from fairqueue.broker.scripts import plain_script


@dataclass(frozen=True, slots=True)
class Fence:
    """What fences a pass's writes inside Redis: the queue's leader lock (``lock_key``),
    the token the pass holds it with, and how long each fenced call renews it for. A
    call whose token no longer holds the lock writes nothing (``LockLostError``)."""

    lock_key: str
    token: str
    ttl_ms: int

    def argv(self) -> dict[str, str | int]:
        """A fenced script's lock arguments by name (``lock_fence.lua``'s token, ttl)."""
        return {"token": self.token, "ttl": self.ttl_ms}


class LockStore(BrokerPart):
    """The rebalance pass's leader lock."""

    async def acquire_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        """Take ``key`` if free, or renew it if ``token`` already holds it, in one step."""
        script = self.conn.script(plain_script("lock_acquire"))
        return bool(await self.conn.guard(script(keys=[key], token=token, ttl=ttl_ms)))

    async def release_lock(self, key: str, token: str) -> bool:
        script = self.conn.script(plain_script("lock_release"))
        return bool(await self.conn.guard(script(keys=[key], token=token)))

    async def lock_holder(self, key: str) -> tuple[str | None, int]:
        """The token holding ``key`` and its remaining time in ms."""
        client = self.conn.client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            holder, ttl = await self.conn.guard(pipe.execute())
        return holder, int(ttl)
