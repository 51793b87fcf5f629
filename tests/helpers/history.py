"""A history page committed by hand: the settlements and first measurements the loop's
history step writes (``history_commit.lua``), for the placement tests that hold the
scripts equal to the model."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import redis

from fairqueue.broker.scripts import call_script, plain_script
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.wire import flow_member
from tests.helpers.keys import REDIS_URL


def commit_history_page(
    prefix: str,
    settlements: Sequence[tuple[PriorityLevel, str, float]],
    recosts: Sequence[tuple[PriorityLevel, str, float, float]] = (),
    queue: str = "q",
) -> None:
    """Commit a page that carries only ``settlements`` (flow, turns) and ``recosts``
    (flow, ratio, shift turns: flows measured for the first time) on ``queue``, as the
    loop writes them, holding the leader lock the script checks."""
    script = plain_script("history_commit")
    base = f"{prefix}:{queue}:fq:"
    items = [
        x
        for level, tenant, debt in settlements
        for x in (flow_member(level.value, tenant), level.value, f"{debt:.17g}")
    ]
    replaced = [
        x
        for level, tenant, ratio, shift in recosts
        for x in (flow_member(level.value, tenant), level.value, f"{ratio:.17g}", f"{shift:.17g}")
    ]
    args = script.args(
        token="test-token",
        ttl=10_000,
        cursor="",
        new_cursor="",
        ord=0,
        bucket_prefix=f"{base}hist:",
        bucket_ttl=60,
        keep_tenants=10,
        idle_ms=86_400_000,
        sections=[0, 0, 0, 0, 0, len(settlements), *items, len(recosts), *replaced],
    )
    names = ("hist", "leader", "run", "state", "flows", "fweights")
    keys = [base + name for name in names]
    keys += [f"{prefix}:{queue}:active", f"{base}seen", f"{prefix}:{queue}:prioritized"]
    keys.append(f"{base}rw")

    async def run() -> int:
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        try:
            await client.set(f"{base}leader", "test-token")
            return int(await call_script(client, script.sha, script.source, keys, args))
        finally:
            await client.aclose()

    assert asyncio.run(run()) == 1
