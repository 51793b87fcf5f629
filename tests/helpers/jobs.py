"""Jobs put in a known state by hand: added by plain BullMQ (as another producer would),
the ready-time index read back, the loop's history written as the loop writes it."""

from __future__ import annotations

import asyncio
import time

from bullmq import Queue

from tests.helpers.keys import REDIS_URL


def index_ids(redis_client, prefix, queue="email"):
    """Every id in fairqueue's ready-time index, by the second it became ready."""
    ready = f"{prefix}:{queue}:fq:ready"
    return {
        int(second): redis_client.lrange(f"{ready}:{second}", 0, -1)
        for second in redis_client.zrange(ready, 0, -1)
    }


def add_foreign(prefix, *jobs):
    async def add():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": prefix})
        ids = [(await queue.add("legacy", data, opts)).id for data, opts in jobs]
        await queue.close()
        return ids

    return asyncio.run(add())


BUCKET_S = 10


def write_history(
    redis_client,
    prefix: str,
    per_s: dict[tuple[str, str], float],
    bins=None,
    expected_ms: dict[str, int] | None = None,
) -> None:
    """The last three buckets as the loop writes them: each flow started ``per_s`` jobs a
    second (``bins``: level -> {ratio bin: count} of estimates in each whole bucket, and
    ``expected_ms``: level -> the wait each of them expected, ms; without it the scale is
    not recorded). Written early in a bucket, so the test's reads fall in the same one."""
    while not 0.5 <= time.time() % BUCKET_S <= 3.5:
        time.sleep(0.1)
    now = time.time()
    current = int(now // BUCKET_S * BUCKET_S)
    base = f"{prefix}:email:fq:hist"
    redis_client.hset(base, "since", int((now - 60) * 1000))
    for start in (current - 2 * BUCKET_S, current - BUCKET_S, current):
        seconds = BUCKET_S if start < current else max(0.0, now - current)
        levels: dict[str, int] = {}
        for (level, tenant), rate in per_s.items():
            count = round(rate * seconds)
            levels[level] = levels.get(level, 0) + count
            if count:
                redis_client.zadd(f"{base}:t:{start}", {f"{level}\n{tenant}": count})
        for level, count in levels.items():
            redis_client.hset(f"{base}:{start}", f"s:{level}", count)
        if bins and start < current:
            for level, counts in bins.items():
                for index, count in counts.items():
                    redis_client.hset(f"{base}:{start}", f"e:{level}:{index}", count)
                if expected_ms and level in expected_ms:
                    waited = expected_ms[level] * sum(counts.values())
                    redis_client.hset(f"{base}:{start}", f"e:{level}:w", waited)
