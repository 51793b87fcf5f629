"""The rebalance pass (maintenance of the add script's order) against real Redis and
stock BullMQ workers."""

import asyncio
import json
import time

import pytest
from bullmq import Queue
from django.core.management import call_command

from fairqueue.broker import MAX_PRIORITY, TAG_FLOOR, Fence, NewJob, get_sync_broker
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.rebalance.passes import WALK_PAGE_SIZE, rebalance_queue, walk_pages
from fairqueue.scheduling.levels import PriorityLevel
from tests.helpers import drain_with_stock_worker, metric, metric_delta
from tests.helpers.jobs import add_foreign, index_ids
from tests.helpers.keys import REDIS_URL

# Timing-sensitive (live workers, loops): `make test` runs them after the parallel part.
pytestmark = [pytest.mark.django_db, pytest.mark.serial]


def prioritized(redis_client, prefix, queue="email"):
    return redis_client.zrange(f"{prefix}:{queue}:prioritized", 0, -1, withscores=True)


def age(redis_client, prefix, job_ids, ms, queue="email"):
    """Make jobs look ready ``ms`` ago in fairqueue's ready-time index."""
    ready = f"{prefix}:{queue}:fq:ready"
    for second in redis_client.zrange(ready, 0, -1):
        for job_id in job_ids:
            redis_client.lrem(f"{ready}:{second}", 0, job_id)
    old = (int(time.time() * 1000) - ms) // 1000
    redis_client.rpush(f"{ready}:{old}", *job_ids)
    redis_client.zadd(ready, {str(old): old})


def placed_as(redis_client, prefix, job_id, tenant, queue="email"):
    """(level, tenant weight) of a placed job: its level from its score, its flow's
    weight from the clock's flows (the flow must have work)."""
    score = int(redis_client.zscore(f"{prefix}:{queue}:prioritized", job_id))
    level = ("critical", "high", "normal", "low")[score % 4]
    weight = redis_client.hget(f"{prefix}:{queue}:fq:fweights", f"{level}\n{tenant}")
    return level, int(weight)


def test_a_pass_over_a_tagged_queue_writes_nothing(fq_prefix, redis_client):
    for level in ("critical", "low", "normal"):
        enqueue_jobs("email", [{} for _ in range(50)], tenant_id="t", priority_level=level)
    before = prioritized(redis_client, fq_prefix)
    result = rebalance_queue("email")
    assert (result.adopted, result.aged, result.rebased, result.lock_lost) == (0, 0, 0, False)
    assert prioritized(redis_client, fq_prefix) == before


def test_foreign_jobs__wait_list_and_small_priorities_are_adopted_into_the_tag_order(
    fq_prefix, redis_client
):
    plain, urgent, bulk, parked = add_foreign(
        fq_prefix,
        ({"x": 1, "tenantId": "acme"}, {}),
        ({"x": 2}, {"priority": 1}),
        ({}, {"priority": 10}),
        ({"priorityLevel": "high"}, {"priority": MAX_PRIORITY}),  # where promotions wait
    )
    assert redis_client.llen(f"{fq_prefix}:email:wait") == 1
    result = rebalance_queue("email")
    assert result.adopted == 4
    assert redis_client.llen(f"{fq_prefix}:email:wait") == 0
    scores = dict(prioritized(redis_client, fq_prefix))
    for job_id in (plain, urgent, bulk, parked):
        assert TAG_FLOOR <= scores[job_id] // 2**32 < MAX_PRIORITY
    assert placed_as(redis_client, fq_prefix, parked, "default") == ("high", 1)
    assert placed_as(redis_client, fq_prefix, plain, "acme") == ("normal", 1)
    assert placed_as(redis_client, fq_prefix, urgent, "default") == ("critical", 1)
    assert placed_as(redis_client, fq_prefix, bulk, "default") == ("low", 1)
    indexed = [job_id for ids in index_ids(redis_client, fq_prefix).values() for job_id in ids]
    assert sorted(indexed) == sorted([plain, urgent, bulk, parked])
    assert rebalance_queue("email").adopted == 0  # adopted once


def test_a_foreign_payload_over_the_cap_is_not_decoded(fq_prefix, redis_client, settings):
    big = {"tenantId": "acme", "priorityLevel": "critical", "blob": "x" * 2_000}
    (job_id,) = add_foreign(fq_prefix, (big, {"priority": 10}))
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "MAX_PAYLOAD_BYTES": 1_024}
    from fairqueue import conf

    conf.reload_settings()
    assert rebalance_queue("email").adopted == 1
    assert placed_as(redis_client, fq_prefix, job_id, "default") == ("low", 1)


def test_delayed_job__parked_until_promoted_then_adopted_and_its_wait_starts_when_ready(
    fq_prefix, redis_client
):
    before = int(time.time() * 1000)
    delayed = enqueue_job("email", {}, tenant_id="t", priority_level="high", delay_ms=100)
    opts = json.loads(redis_client.hget(f"{fq_prefix}:email:{delayed.job_id}", "opts"))
    level, weight, tenant = opts["fqMeta"].split("\n", 2)  # its meta, in the job itself
    ready = opts["fqReady"]
    assert (level, weight, tenant) == ("high", "1", "t") and int(ready) >= before + 100
    assert delayed.job_id in index_ids(redis_client, fq_prefix)[int(ready) // 1000]
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="u", priority_level="low")
    time.sleep(0.15)

    # BullMQ promotes due delayed jobs when a worker looks; promote them as it would.
    async def promote():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        await queue.promoteJobs()
        await queue.close()

    asyncio.run(promote())  # into the wait list, or parked at the cap by a worker's promotion
    result = rebalance_queue("email")
    assert (result.adopted, result.aged) == (1, 0)  # not overdue: its delay was not waiting
    score = redis_client.zscore(f"{fq_prefix}:email:prioritized", delayed.job_id)
    assert TAG_FLOOR <= score // 2**32 < MAX_PRIORITY
    assert not redis_client.exists(f"{fq_prefix}:email:fq:jobs")  # nothing kept beside it
    first = drain_with_stock_worker(fq_prefix, "email", 2)
    assert delayed.job_id in [job_id for job_id, _ in first]


def test_overdue_jobs_are_counted_per_level_and_keep_their_flows_turns(fq_prefix, redis_client):
    # docs/design.md, "The wait bound": a low flow whose jobs are all overdue does not
    # take a critical flow's turns; it runs in its own turns, oldest first.
    low = enqueue_jobs("email", [{} for _ in range(20)], tenant_id="l", priority_level="low")
    critical = enqueue_jobs(
        "email", [{} for _ in range(80)], tenant_id="c", priority_level="critical"
    )
    age(redis_client, fq_prefix, [job.job_id for job in low], 400_000)
    before = prioritized(redis_client, fq_prefix)
    with metric_delta("queue_fair_aged_boosts_total", job_type="email") as boosts:
        result = rebalance_queue("email")
    assert (result.overdue, result.overdue_by_level) == (20, {"low": 20})
    assert boosts() == 0
    assert metric("queue_fair_overdue_waiting", job_type="email") == 20
    assert prioritized(redis_client, fq_prefix) == before
    order = [data["priorityLevel"] for _, data in drain_with_stock_worker(fq_prefix, "email", 100)]
    assert order[:5].count("low") == 1 and order.count("low") == 20
    assert len(critical) == 80


@pytest.mark.slow
def test_a_huge_overdue_backlog_is_counted_in_a_bounded_pass(fq_prefix, redis_client):
    jobs = enqueue_jobs("email", [{} for _ in range(6_500)], tenant_id="t", priority_level="low")
    age(redis_client, fq_prefix, [job.job_id for job in jobs], 400_000)
    result = rebalance_queue("email", interval_ms=1_000)  # a budget of pages each way
    pages = walk_pages(1_000)
    assert pages * WALK_PAGE_SIZE < 6_500
    assert result.overdue == 6_500
    # checked; the rest counted unchecked
    assert result.overdue_by_level == {"low": pages * WALK_PAGE_SIZE}
    assert result.script_calls <= 2 * pages + 6


def test_the_oldest_overdue_job_is_never_stranded_behind_younger_ones(fq_prefix, redis_client):
    # The old pass read the head and scanned from a rank in two round trips; a pop in
    # between left the oldest overdue job behind 99 younger ones. Now nothing moves it:
    # it is at the front of its own line from the moment it was added.
    jobs = enqueue_jobs("email", [{} for _ in range(1_100)], tenant_id="t", priority_level="normal")
    age(redis_client, fq_prefix, [job.job_id for job in jobs], 400_000)
    drain_with_stock_worker(fq_prefix, "email", 1)
    result = rebalance_queue("email")
    assert result.overdue == 1_099
    assert drain_with_stock_worker(fq_prefix, "email", 1)[0][0] == jobs[1].job_id


def test_an_overdue_untagged_job_goes_first_in_its_own_flow_not_ahead_of_another(
    fq_prefix, redis_client
):
    # Tenant "t" is over its share (30 waiting). Its late job takes the place of t's first
    # job in line behind the one about to run (that job takes t's next turn, at the back,
    # charged to t); tenant "u", within its share, keeps its place in the round.
    mine = enqueue_jobs("email", [{} for _ in range(30)], tenant_id="t", priority_level="normal")
    (legacy,) = add_foreign(fq_prefix, ({"tenantId": "t"}, {"priority": 5}))
    redis_client.hset(f"{fq_prefix}:email:{legacy}", "timestamp", int(time.time() * 1000) - 400_000)
    with metric_delta("queue_fair_aged_boosts_total", job_type="email") as boosts:
        result = rebalance_queue("email")
    assert (result.adopted, result.aged, boosts()) == (1, 1, 1)
    (calm,) = enqueue_jobs("email", [{}], tenant_id="u", priority_level="normal")
    order = [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 32)]
    assert [j for j in order if j != calm.job_id][:3] == [mine[0].job_id, legacy, mine[2].job_id]
    assert order[-1] == mine[1].job_id
    assert calm.job_id in order[:3]


def test_index_entries_of_jobs_that_left_are_dropped(fq_prefix, redis_client):
    enqueue_jobs("email", [{} for _ in range(40)], tenant_id="t", priority_level="normal")
    drain_with_stock_worker(fq_prefix, "email", 25)
    result = rebalance_queue("email")
    assert result.cleaned == 25
    assert sum(len(ids) for ids in index_ids(redis_client, fq_prefix).values()) == 15


def test_rebase__a_page_at_a_time_the_order_never_changes(fq_prefix, redis_client):
    broker = get_sync_broker()
    queue_jobs = lambda n, tenant, level: [  # noqa: E731
        NewJob("email", {}, PriorityLevel(level), tenant=tenant) for _ in range(n)
    ]
    broker.add_jobs("email", queue_jobs(30, "a", "low") + queue_jobs(30, "b", "critical"))
    drain_with_stock_worker(fq_prefix, "email", 10)  # the virtual time moves on
    fence = Fence(f"{fq_prefix}:email:fq:leader", "t", 5_000)
    order = [job_id for job_id, _ in prioritized(redis_client, fq_prefix)]
    moved, done = broker.run(
        broker.broker.passes.rebase_page, "email", fence=fence, page_size=7, threshold=1, margin=0
    )
    assert (moved, done) == (7, False)
    # New jobs during a rebase land in shifted terms where they belong.
    added = broker.add_jobs("email", queue_jobs(3, "c", "normal"))
    while not done:
        _, done = broker.run(
            broker.broker.passes.rebase_page,
            "email",
            fence=fence,
            page_size=7,
            threshold=1,
            margin=0,
        )
    after = [job_id for job_id, _ in prioritized(redis_client, fq_prefix)]
    assert [job_id for job_id in after if job_id in order] == order
    assert set(after) == set(order) | {job.job_id for job in added}
    state = redis_client.hgetall(f"{fq_prefix}:email:fq:state")
    assert float(state["base"]) > 0 and "rbDelta" not in state
    # Placement after the rebase continues from where the shifted order stands.
    late = broker.add_jobs("email", queue_jobs(1, "d", "critical"))[0]
    rank = redis_client.zrank(f"{fq_prefix}:email:prioritized", late.job_id)
    assert rank < 5


def test_lock__a_lone_rebalancer_keeps_its_lock_through_a_pass_longer_than_its_ttl(
    fq_prefix, redis_client
):
    broker = get_sync_broker()
    lock_key = f"{fq_prefix}:email:fq:leader"
    assert broker.run(broker.broker.lock.acquire_lock, lock_key, "me", 1_000)
    for _ in range(3):  # 1.5 s of script calls, each renewing the 1 s lock
        time.sleep(0.5)
        broker.run(
            broker.broker.passes.walk_index_page,
            "email",
            fence=Fence(lock_key, "me", 1_000),
            max_wait_ms=None,
        )
    assert redis_client.get(lock_key) == "me"
    assert broker.run(broker.broker.lock.acquire_lock, lock_key, "me", 1_000)


def test_lock__a_pass_that_lost_its_lock_writes_nothing(fq_prefix, redis_client):
    add_foreign(fq_prefix, ({}, {}))
    redis_client.set(f"{fq_prefix}:email:fq:leader", "someone-else", px=10_000)
    result = rebalance_queue("email", rebalancer="me")
    assert result.lock_lost and result.adopted == 0
    assert redis_client.llen(f"{fq_prefix}:email:wait") == 1
    assert redis_client.get(f"{fq_prefix}:email:fq:leader") == "someone-else"


def test_a_one_off_pass_takes_the_free_lock_and_releases_it(fq_prefix, redis_client):
    add_foreign(fq_prefix, ({}, {}))
    assert rebalance_queue("email").adopted == 1
    assert redis_client.get(f"{fq_prefix}:email:fq:leader") is None


def test_empty_queue__no_op_and_gauge_zero(fq_prefix):
    result = rebalance_queue("email")
    assert (result.adopted, result.overdue, result.lock_lost) == (0, 0, False)
    assert metric("queue_fair_overdue_waiting", job_type="email") == 0


def test_adoption_metrics(fq_prefix):
    add_foreign(fq_prefix, ({}, {}), ({}, {"priority": 3}))
    with metric_delta(
        "queue_fair_decisions_total", job_type="email", decision="weighted_fair"
    ) as fair:
        rebalance_queue("email")
    assert fair() == 2


def test_dry_run_writes_nothing(fq_prefix, redis_client):
    add_foreign(fq_prefix, ({}, {}), ({}, {"priority": 3}))
    state = f"{fq_prefix}:email:fq:state"
    redis_client.hset(state, mapping={"vt": 36, "base": 0})  # a clock an empty band would reset
    before = prioritized(redis_client, fq_prefix)
    result = rebalance_queue("email", dry_run=True)
    assert result.adopted == 2 and result.dry_run
    assert prioritized(redis_client, fq_prefix) == before
    assert redis_client.hgetall(state) == {"vt": "36", "base": "0"}
    assert redis_client.llen(f"{fq_prefix}:email:wait") == 1


# --- the command -------------------------------------------------------------------------


def test_done_when__all_200_low_jobs_in_the_first_1000_with_the_loop_on(fq_prefix):
    enqueue_jobs("email", [{} for _ in range(8000)], priority_level="critical")
    enqueue_jobs("email", [{} for _ in range(200)], priority_level="low")
    call_command("rebalance_fair", "--once", "--queue", "email")
    head = drain_with_stock_worker(fq_prefix, "email", 1000, timeout_s=60)
    assert sum(data["priorityLevel"] == "low" for _, data in head) == 200


def test_plain_bullmq_priorities_run_low_jobs_last(fq_prefix):
    async def add():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        await queue.addBulk(
            [{"name": "c", "data": {"l": "c"}, "opts": {"priority": 1}} for _ in range(300)]
        )
        await queue.addBulk(
            [{"name": "l", "data": {"l": "l"}, "opts": {"priority": 10}} for _ in range(20)]
        )
        await queue.close()

    asyncio.run(add())
    order = drain_with_stock_worker(fq_prefix, "email", 320)
    assert [data["l"] for _, data in order[-20:]] == ["l"] * 20
    assert "l" not in [data["l"] for _, data in order[:300]]


def test_dry_run_prints_what_a_pass_would_do(fq_prefix, capsys):
    add_foreign(fq_prefix, ({}, {}))
    call_command("rebalance_fair", "--once", "--dry-run", "--queue", "email")
    out = capsys.readouterr().out
    assert "(dry run)" in out and "adopted=1" in out
    assert out.count("email:") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval-ms", "0"], "--interval-ms"),
        (["--queue", "sms"], "'sms' is not allowed"),
        (["--metrics-port", "70000"], "--metrics-port"),
    ],
)
def test_bad_arguments_name_the_argument(fq_prefix, args, message):
    from django.core.management import CommandError

    with pytest.raises((CommandError, SystemExit)) as info:
        call_command("rebalance_fair", "--once", *args)
    if isinstance(info.value, CommandError):
        assert message in str(info.value)


@pytest.mark.parametrize("page_size", [1, 3, 7, 1_000])
def test_the_walk_drops_exactly_the_ids_that_left_whatever_its_pages(
    fq_prefix, redis_client, page_size
):
    """A second's list walked in pages of any size: the ids of jobs that left go (a
    second with none left is deleted whole), waiting and delayed ones stay, in order."""
    ready = f"{fq_prefix}:email:fq:ready"
    prioritized = f"{fq_prefix}:email:prioritized"
    delayed = f"{fq_prefix}:email:delayed"
    mixed = ["w1", "g1", "g2", "d1", "w2", "g3"]  # w: waiting, d: delayed, g: gone
    redis_client.zadd(prioritized, {"w1": TAG_FLOOR * 2**32, "w2": TAG_FLOOR * 2**32 + 4})
    redis_client.zadd(delayed, {"d1": 1})
    redis_client.rpush(f"{ready}:100", *mixed)
    redis_client.rpush(f"{ready}:101", "g4", "g5", "g6", "g7")  # all gone
    redis_client.rpush(f"{ready}:102", "", "g8", "w3")  # blanked earlier, then one gone
    redis_client.zadd(prioritized, {"w3": TAG_FLOOR * 2**32 + 8})
    redis_client.zadd(ready, {"100": 100, "101": 101, "102": 102})
    redis_client.set(f"{fq_prefix}:email:fq:leader", "t")
    sync = get_sync_broker()
    cursor, removed = None, 0
    for _ in range(100):
        walk = sync.run(
            sync.broker.passes.walk_index_page,
            "email",
            fence=Fence(f"{fq_prefix}:email:fq:leader", "t", 60_000),
            max_wait_ms=None,
            page_size=page_size,
            cursor=cursor,
        )
        removed += walk.removed
        cursor = walk.cursor
        if cursor is None:
            break
    assert removed == 8
    assert redis_client.lrange(f"{ready}:100", 0, -1) == ["w1", "d1", "w2"]
    assert not redis_client.exists(f"{ready}:101")
    assert redis_client.lrange(f"{ready}:102", 0, -1) == ["w3"]
    assert redis_client.zrange(ready, 0, -1) == ["100", "102"]


def test_a_flows_line_is_trimmed_of_jobs_that_left_and_expires(fq_prefix, redis_client):
    from fairqueue.broker.scripts import LINE_TRIM_EVERY

    line = f"{fq_prefix}:email:fq:flows:normal\nt"
    enqueue_jobs("email", [{} for _ in range(200)], tenant_id="t", priority_level="normal")
    assert redis_client.llen(line) == 199  # the first, about to run, is not in line
    drain_with_stock_worker(fq_prefix, "email", 150)
    for _ in range(70):
        enqueue_job("email", {}, tenant_id="t", priority_level="normal")
    waiting = redis_client.zcard(f"{fq_prefix}:email:prioritized")
    assert waiting == 120
    assert redis_client.llen(line) <= waiting + LINE_TRIM_EVERY
    assert redis_client.lindex(line, -1) in redis_client.zrange(
        f"{fq_prefix}:email:prioritized", -1, -1
    )
    assert 0 < redis_client.pttl(line) <= 3_600_000
