"""Who may maintain a queue: the leader lock, its TTL, and a rebalancer's id."""

from __future__ import annotations

import os
import socket
import uuid

from fairqueue.broker import get_sync_broker


def rebalancer_id() -> str:
    """Who is rebalancing: host, pid and a random suffix (no secrets)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lock_ttl_ms(interval_ms: int) -> int:
    """Two intervals, so a dead leader is replaced within two intervals; at least one
    second. Every script call of a pass renews it, so a slow pass keeps it."""
    return max(2 * interval_ms, 1_000)


class LeaderLock:
    """Who may maintain a queue: the holder of a Redis lock (a token with a TTL).

    Any number of rebalancers may run, one per host for availability; per queue only the
    holder writes, and every script of its pass checks so inside Redis. If the holder
    dies the lock expires after ``ttl_ms`` (two intervals) and another takes over.
    """

    def __init__(self, queue: str, token: str, ttl_ms: int) -> None:
        self.queue = queue
        self.token = token
        self.ttl_ms = ttl_ms
        self.held = False

    @property
    def key(self) -> str:
        return get_sync_broker().broker.fair_key(self.queue, "leader")

    def acquire(self) -> bool:
        """Take the lock if it is free or renew it if we hold it (one atomic step)."""
        sync = get_sync_broker()
        self.held = sync.run(sync.broker.lock.acquire_lock, self.key, self.token, self.ttl_ms)
        return self.held

    def release(self) -> None:
        if self.held:
            sync = get_sync_broker()
            sync.run(sync.broker.lock.release_lock, self.key, self.token)
            self.held = False
