"""What the benchmarks share: where Redis is, and how to leave it as they found it."""

from __future__ import annotations

import os
import socket

import redis

REDIS_URL = os.environ.get("FAIRQUEUE_REDIS_URL", "redis://127.0.0.1:6379/0")


def delete_prefix(prefix: str) -> None:
    """Delete every key under ``prefix:`` (a benchmark's private BullMQ prefix)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=5000))
        for start in range(0, len(keys), 5000):
            client.delete(*keys[start : start + 5000])
    finally:
        client.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it), for a private Redis."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
