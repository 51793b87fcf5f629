"""Where the suite's Redis is and the key prefixes it writes under: each test under a
prefix of its own, every prefix marked with this run's id so the sweep at the end
(tests/conftest.py) deletes this run's leftovers and never another run's keys."""

from __future__ import annotations

import os
import uuid

import redis

from tests.settings import TEST_REDIS_URL

REDIS_URL = os.environ.get("FAIRQUEUE_REDIS_URL", TEST_REDIS_URL)
#: This run's mark in every key prefix the suite makes (all xdist workers share it).
RUN_ID = (os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex)[:8]
TEST_QUEUES = {"email": "email", "report": "report", "cleanup": "cleanup"}


def run_prefix(kind: str = "fqtest") -> str:
    """A fresh BullMQ key prefix of this run (see :data:`RUN_ID`)."""
    return f"{kind}-{RUN_ID}-{uuid.uuid4().hex[:12]}"


def delete_prefix(prefix: str, url: str = REDIS_URL) -> None:
    """Delete every key under ``prefix`` on the Redis at ``url``."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
    finally:
        client.close()
