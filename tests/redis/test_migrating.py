"""docs/migrating.md, both ways, on a real Redis with stock BullMQ: jobs a plain producer
left waiting are adopted into the fair order, and after a roll-back every job still runs
and deleting the documented key pattern leaves BullMQ's queue working."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from bullmq import Queue

from fairqueue.broker import TAG_FLOOR
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.rebalance.passes import rebalance_queue
from tests.helpers import drain_with_stock_worker
from tests.helpers.keys import REDIS_URL

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"


def add_plain(prefix: str, *jobs: tuple[dict, dict]) -> list[str]:
    """Jobs as a plain BullMQ producer adds them (``Queue.add``)."""

    async def add() -> list[str]:
        queue = Queue("email", {"connection": REDIS_URL, "prefix": prefix})
        try:
            return [(await queue.add("plain", data, opts)).id for data, opts in jobs]
        finally:
            await queue.close()

    return asyncio.run(add())


def test_adding_fairqueue__jobs_already_waiting_are_adopted_and_all_run_once(
    fq_prefix, redis_client
):
    waiting = add_plain(
        fq_prefix,
        ({"n": 1}, {}),  # priority 0: BullMQ's wait list
        ({"n": 2}, {}),
        ({"n": 3, "tenantId": "acme"}, {"priority": 5}),  # a small priority
    )
    fair = enqueue_jobs("email", [{"n": 4}, {"n": 5}], tenant_id="acme")
    assert rebalance_queue("email").adopted == 3
    # Nothing is left ahead of the fair order: no wait list, no small priority.
    assert redis_client.llen(f"{fq_prefix}:email:wait") == 0
    scores = [
        s for _, s in redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1, withscores=True)
    ]
    assert len(scores) == 5 and min(scores) >= TAG_FLOOR * 2**32
    ran = [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 5)]
    assert sorted(ran) == sorted(waiting + [job.job_id for job in fair])


def test_rolling_back__every_job_runs_and_the_documented_keys_go(fq_prefix, redis_client):
    placed = [enqueue_job("email", {"n": i}, tenant_id="acme").job_id for i in range(3)]
    placed.append(enqueue_job("email", {"n": 3}, internal=True).job_id)
    fair_order = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)
    assert sorted(fair_order) == sorted(placed)
    # Producers moved back to Queue.add; the loop is stopped.
    new = add_plain(fq_prefix, ({"n": 4}, {}), ({"n": 5}, {"priority": 3}))
    ran = [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 6)]
    # New plain jobs first (priority 0, then the small priority), then fairqueue's, in
    # the fair order the add script gave them: each exactly once.
    assert ran == new + fair_order

    (command,) = re.findall(r"^\s*redis-cli --scan --pattern '(\S+)'", GUIDE.read_text(), re.M)
    assert command == "bull:email:fq:*"
    pattern = command.replace("bull:", f"{fq_prefix}:", 1)
    assert list(redis_client.scan_iter(match=pattern))  # fairqueue's state is there
    for key in list(redis_client.scan_iter(match=pattern)):
        redis_client.unlink(key)
    leftover = {k for k in redis_client.scan_iter(match=f"{fq_prefix}:*")}
    assert not [k for k in leftover if ":fq:" in k]
    assert f"{fq_prefix}:email:id" in leftover  # BullMQ's own keys are untouched
    # The queue goes on as a plain BullMQ queue.
    (later,) = add_plain(fq_prefix, ({"n": 6}, {}))
    assert [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 1)] == [later]
