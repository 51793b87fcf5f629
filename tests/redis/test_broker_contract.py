"""The BullMQ internals fairqueue relies on (pinned bullmq>=3.4.4,<3.5).

If an upgrade of bullmq changes any of these, these tests fail before users notice.
"""

import asyncio
import time
from importlib.metadata import version

import pytest
from bullmq import Queue

from fairqueue.broker import (
    BACK_OF_LINE,
    MAX_PRIORITY,
    TAG_FLOOR,
    Broker,
    NewJob,
    SyncBroker,
)
from fairqueue.exceptions import BrokerUnavailableError
from fairqueue.scheduling.levels import PriorityLevel
from tests.helpers import drain_with_stock_worker
from tests.helpers.keys import REDIS_URL


def run(coro):
    return asyncio.run(coro)


def test_pinned_bullmq_version():
    major, minor, *_ = (int(part) for part in version("bullmq").split(".")[:2])
    assert (major, minor) == (3, 4)


def test_key_names_and_priority_score_format(fq_prefix, redis_client):
    async def main():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        job = await queue.add("x", {}, {"priority": 7})
        await queue.close()
        return job.id

    job_id = run(main())
    score = redis_client.zscore(f"{fq_prefix}:email:prioritized", job_id)
    counter = int(redis_client.get(f"{fq_prefix}:email:pc"))
    assert score == 7 * 2**32 + counter
    assert redis_client.hget(f"{fq_prefix}:email:{job_id}", "priority") == "7"
    assert redis_client.hget(f"{fq_prefix}:email:{job_id}", "timestamp").isdigit()


def test_the_add_scripts_one_zadd_of_the_prioritized_set_is_edited_to_the_fair_score(
    fq_prefix, redis_client
):
    """fairqueue's add gives its score to BullMQ's own ZADD (scripts.ADD_SCORE_EDIT): the
    line is in addPrioritizedJob once, and a fair job lands at the fair score with BullMQ's
    priority counter still counted."""
    from bullmq.redis_connection import loadScript

    from fairqueue.broker import add_jobs_script
    from fairqueue.broker.scripts import ADD_SCORE_EDIT

    old, new = ADD_SCORE_EDIT
    assert loadScript("addPrioritizedJob-9.lua").count(old) == 1
    assert add_jobs_script().source.count(new) == 1 and old not in add_jobs_script().source

    broker = SyncBroker(Broker(REDIS_URL, fq_prefix))
    job_id = broker.add_job("email", NewJob("x", {}, PriorityLevel.LOW, tenant="t")).job_id
    broker.close()
    score = redis_client.zscore(f"{fq_prefix}:email:prioritized", job_id)
    assert TAG_FLOOR * 2**32 <= score < MAX_PRIORITY * 2**32 and score % 4 == 3  # low's rank
    assert redis_client.get(f"{fq_prefix}:email:pc") == "1"
    assert redis_client.hget(f"{fq_prefix}:email:{job_id}", "priority") == str(MAX_PRIORITY)


def test_wait_list_pops_before_prioritized_and_from_its_right_end(fq_prefix):
    async def main():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        prio = await queue.add("p", {}, {"priority": 1})
        plain1 = await queue.add("w", {}, {})
        plain2 = await queue.add("w", {}, {})
        await queue.close()
        return prio.id, plain1.id, plain2.id

    prio, plain1, plain2 = run(main())
    order = [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 3)]
    assert order == [plain1, plain2, prio]


def test_priority_cap_and_bands():
    assert MAX_PRIORITY == 2**21 - 1
    assert BACK_OF_LINE == MAX_PRIORITY
    assert 10 < TAG_FLOOR < MAX_PRIORITY // 2


def test_a_workers_promotion_of_a_delayed_job_parks_it_at_its_stored_priority(fq_prefix):
    # fairqueue adds delayed jobs at BACK_OF_LINE and relies on BullMQ's promotion (in a
    # worker's moveToActive) re-adding them at the priority stored in the job hash.
    broker = SyncBroker(Broker(REDIS_URL, fq_prefix))
    delayed = broker.add_job("email", NewJob("x", {}, PriorityLevel.CRITICAL, delay_ms=30))
    time.sleep(0.1)
    tagged = broker.add_job("email", NewJob("x", {}, PriorityLevel.LOW))
    order = [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 2)]
    assert order == [tagged.job_id, delayed.job_id]
    broker.close()


def test_tag_placement_survives_a_script_cache_flush(fq_prefix, redis_client):
    broker = SyncBroker(Broker(REDIS_URL, fq_prefix))
    broker.add_job("email", NewJob("x", {}, PriorityLevel.LOW))
    redis_client.script_flush()
    added = broker.add_job("email", NewJob("x", {}, PriorityLevel.LOW))
    assert TAG_FLOOR <= added.priority < BACK_OF_LINE
    assert redis_client.zcard(f"{fq_prefix}:email:prioritized") == 2
    broker.close()


def test_unreachable_redis_raises_broker_unavailable():
    broker = SyncBroker(Broker("redis://127.0.0.1:1/0", "nowhere"))
    with pytest.raises(BrokerUnavailableError):
        broker.add_job("email", NewJob("x", {}, PriorityLevel.LOW))


def test_held_jobs__bullmq_promotes_delayed_jobs_only_when_due():
    """Tenant limits hold jobs in BullMQ's delayed set at HELD_UNTIL_MS (docs/limits.md).
    Every script of the installed bullmq that moves delayed jobs to wait takes only those
    whose score (timestamp * 0x1000) is due now; so a held job is never promoted by a
    stock worker before the year 9999. (Node's bullmq runs the same Lua.)"""
    import re
    from pathlib import Path

    import bullmq

    from fairqueue.broker.common import HELD_UNTIL_MS

    commands = Path(bullmq.__file__).parent / "commands"
    promoting = []
    for script in commands.glob("*.lua"):
        text = script.read_text()
        for match in re.finditer(r'rcall\("ZRANGEBYSCORE", delayedKey, ([^\n]*)\)', text):
            promoting.append((script.name, match.group(1)))
    assert promoting, "no script of bullmq promotes delayed jobs any more: recheck the held state"
    for name, args in promoting:
        assert args.startswith("0, (timestamp + 1) * 0x1000 - 1"), (name, args)
    assert HELD_UNTIL_MS == 253_402_300_799_000  # 9999-12-31T23:59:59Z


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"to": "a@example.com", "n": 3, "ratio": 0.1, "ok": True, "none": None},
        {"name": "Zoë ✓ 日本", "nested": {"list": [1, [2, {"deep": "x"}]], "empty": {}}},
        {"big": 2**60, "neg": -1.5e-300, "text": 'quote " and \\ backslash'},
    ],
)
def test_the_data_json_the_api_stores_is_bullmqs_own_serialisation(payload):
    """The enqueue API serialises a job's data once (to check its size) and gives that text
    to the add (``NewJob.data_json``) instead of letting BullMQ serialise it again: it must
    be, byte for byte, what BullMQ's ``addJobArgs`` makes of the same data."""
    from bullmq.job import Job as BullJob

    from fairqueue.enqueue.options import merged_payload as _merged_payload
    from fairqueue.enqueue.priority import resolve_priority

    resolved = resolve_priority(tenant_id="t-1", priority_level="high")
    data, data_json = _merged_payload(payload, resolved)
    queue = Queue("email", {"prefix": "contract"})
    _args, bullmq_json, _opts = queue.scripts.addJobArgs(BullJob(queue, "email", data, {}))
    assert data_json == bullmq_json


#: ``bullmq.Worker.processJob`` as of 3.4.4: fairqueue's ChainingWorker runs its copy
#: with the completion asking for the next job (fairqueue/broker/chaining.py). A bullmq
#: that changes it must be read again, and the copy brought in line, before this moves.
PROCESS_JOB_SHA256 = "1eb52a13d9cc583e"


def test_the_worker_s_process_job_is_the_one_chaining_worker_copies():
    import hashlib
    import inspect

    from bullmq import Worker

    source = inspect.getsource(Worker.processJob)
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == PROCESS_JOB_SHA256


def test_move_to_completed_can_fetch_the_next_job():
    """The backend call ChainingWorker makes, and the shape it reads back."""
    import inspect

    from bullmq.backend import Backend

    method = Backend.moveToCompleted
    assert "fetch_next" in inspect.signature(method).parameters
    assert '{"result": next_job_data_or_None' in (method.__doc__ or "")
