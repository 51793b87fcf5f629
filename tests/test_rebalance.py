"""The rebalance pass against real Redis and stock BullMQ workers."""

import asyncio
import json
import multiprocessing
import time

import pytest
from bullmq import Queue
from django.core.management import call_command
from hypothesis import given, settings
from hypothesis import strategies as st

from fairqueue import conf
from fairqueue.broker import MAX_PRIORITY, REBASE_THRESHOLD, WINDOW_BAND_TOP, get_sync_broker
from fairqueue.levels import PriorityLevel
from fairqueue.rebalance import plan_priorities, rebalance_queue
from fairqueue.scheduler import PendingJob, order_pending_jobs
from fairqueue.services import enqueue_job, enqueue_jobs
from tests.conftest import REDIS_URL
from tests.helpers import drain_with_stock_worker, metric, metric_delta

pytestmark = pytest.mark.django_db


def pending_in_redis(redis_client, prefix, queue="email"):
    """Rebuild the waiting set independently of fairqueue's reader."""
    ids = redis_client.lrange(f"{prefix}:{queue}:wait", 0, -1) + redis_client.zrange(
        f"{prefix}:{queue}:prioritized", 0, -1
    )
    jobs = []
    for job_id in ids:
        data = json.loads(redis_client.hget(f"{prefix}:{queue}:{job_id}", "data"))
        timestamp = int(redis_client.hget(f"{prefix}:{queue}:{job_id}", "timestamp"))
        jobs.append(
            PendingJob(
                job_id,
                PriorityLevel(data["priorityLevel"]),
                data["tenantId"] or "default",
                timestamp,
            )
        )
    return jobs


def set_timestamp(redis_client, prefix, job_id, timestamp, queue="email"):
    redis_client.hset(f"{prefix}:{queue}:{job_id}", "timestamp", timestamp)


def mixed_backlog():
    jobs = []
    for tenant, level, count in [
        ("a", "critical", 12),
        ("b", "critical", 3),
        ("a", "low", 6),
        ("c", "normal", 8),
        ("d", "high", 5),
        ("c", "low", 4),
    ]:
        jobs += enqueue_jobs(
            "email", [{"n": i} for i in range(count)], tenant_id=tenant, priority_level=level
        )
    return jobs


# --- plan_priorities (pure) ----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3000), max_size=80), st.integers(100, 5000))
def test_plan_priorities__strictly_increasing_within_bounds(current, upper):
    if len(current) > upper - 1:
        return
    planned = plan_priorities(current, upper=upper)
    assert len(planned) == len(current)
    assert all(0 < p < upper for p in planned)
    assert all(a < b for a, b in zip(planned, planned[1:]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10**5), unique=True, max_size=60))
def test_plan_priorities__an_order_that_already_holds_is_kept(values):
    current = sorted(values)
    assert plan_priorities(current, upper=10**5 + 1) == current


def test_plan_priorities__head_consumed_keeps_the_rest():
    first = plan_priorities([0] * 10, upper=WINDOW_BAND_TOP)
    assert plan_priorities(first[3:], upper=WINDOW_BAND_TOP) == first[3:]


def test_plan_priorities__a_new_job_slots_into_a_gap():
    planned = plan_priorities([32, 64, 0, 96], upper=WINDOW_BAND_TOP)
    assert planned[:2] == [32, 64] and planned[3] == 96 and 64 < planned[2] < 96


def test_plan_priorities__full_band_renumbers_from_the_bottom():
    assert plan_priorities([WINDOW_BAND_TOP - 2, 0], upper=WINDOW_BAND_TOP) == [32, 64]


# --- the pass ------------------------------------------------------------------------------


def test_after_a_pass_a_stock_worker_runs_exactly_the_policy_order(fq_prefix, redis_client):
    jobs = mixed_backlog()
    # Make a few jobs overdue so the aged path is exercised too.
    now = int(time.time() * 1000)
    for job in jobs[20:23]:
        set_timestamp(redis_client, fq_prefix, job.job_id, now - 400_000)
    pending = pending_in_redis(redis_client, fq_prefix)
    result = rebalance_queue("email", now_ms=now)
    expected = [
        item.job_id for item in order_pending_jobs(pending, now_ms=now, max_wait_ms=300_000)
    ]
    assert result.examined == len(jobs)
    assert result.aged == 3
    processed = [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", len(jobs))]
    assert processed == expected


def test_second_pass_over_an_unchanged_set_writes_nothing(fq_prefix):
    mixed_backlog()
    assert rebalance_queue("email").written > 0
    again = rebalance_queue("email")
    assert (again.written, again.reordered) == (0, 0)


def test_consuming_the_head_renumbers_nothing(fq_prefix):
    jobs = mixed_backlog()
    rebalance_queue("email")
    drain_with_stock_worker(fq_prefix, "email", 10)
    after = rebalance_queue("email")
    assert after.examined == len(jobs) - 10
    assert after.written == 0


def test_priorities_written_are_never_zero_and_stay_in_the_window_band(fq_prefix, redis_client):
    mixed_backlog()
    rebalance_queue("email")
    for _, score in redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1, withscores=True):
        assert 1 <= score // 2**32 < WINDOW_BAND_TOP


def test_only_one_priority__fifo(fq_prefix):
    jobs = enqueue_jobs("email", [{"i": i} for i in range(20)], tenant_id="t")
    rebalance_queue("email")
    processed = [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 20)]
    assert processed == [job.job_id for job in jobs]


def test_flood__low_level_gets_its_share_from_the_head(fq_prefix):
    crit = enqueue_jobs("email", [{} for _ in range(400)], priority_level="critical")
    low = enqueue_jobs("email", [{} for _ in range(100)], priority_level="low")
    rebalance_queue("email")
    low_ids = {job.job_id for job in low}
    head = [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 50)]
    assert sum(job_id in low_ids for job_id in head) == 10
    assert len(crit) == 400


def test_trickle__old_low_job_is_promoted_over_a_hot_critical_stream(fq_prefix, redis_client):
    low = enqueue_job("email", {}, priority_level="low")
    set_timestamp(redis_client, fq_prefix, low.job_id, int(time.time() * 1000) - 301_000)
    enqueue_jobs("email", [{} for _ in range(30)], priority_level="critical")
    with metric_delta("queue_fair_aged_boosts_total", job_type="email") as boosts:
        result = rebalance_queue("email")
    assert result.aged == 1 and boosts() == 1
    first = drain_with_stock_worker(fq_prefix, "email", 1)
    assert first[0][0] == low.job_id


def test_tenant_flood__sparse_tenants_first(fq_prefix):
    enqueue_jobs("email", [{} for _ in range(50)], tenant_id="flooder")
    sparse = enqueue_job("email", {}, tenant_id="sparse")
    rebalance_queue("email")
    assert drain_with_stock_worker(fq_prefix, "email", 1)[0][0] == sparse.job_id


def _plan_in_fresh_process(prefix, now_ms, conn):
    import django

    django.setup()
    from django.test.utils import override_settings

    from fairqueue import conf as fresh_conf
    from fairqueue.rebalance import rebalance_queue as fresh_rebalance

    with override_settings(
        FAIRQUEUE={"PREFIX": prefix, "QUEUES": {"email": "email"}, "REDIS_URL": REDIS_URL}
    ):
        fresh_conf.reload_settings()
        plan = fresh_rebalance("email", now_ms=now_ms, dry_run=True).plan
    conn.send([(item.job_id, item.new_priority) for item in plan])


def test_restart__a_fresh_process_computes_the_identical_order(fq_prefix):
    mixed_backlog()
    now = int(time.time() * 1000)
    here = [
        (i.job_id, i.new_priority) for i in rebalance_queue("email", now_ms=now, dry_run=True).plan
    ]
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_plan_in_fresh_process, args=(fq_prefix, now, child))
    process.start()
    there = parent.recv()
    process.join(30)
    assert there == here


def test_empty_queue__no_op_and_gauge_zero(fq_prefix):
    result = rebalance_queue("email")
    assert (result.examined, result.written, result.overdue) == (0, 0, 0)
    assert metric("queue_fair_overdue_waiting", job_type="email") == 0


def test_retry_keeps_original_timestamp_and_is_promoted_when_overdue(fq_prefix, redis_client):
    job = enqueue_job("email", {"fail": True}, priority_level="low")
    key = f"{fq_prefix}:email:{job.job_id}"
    original = int(redis_client.hget(key, "timestamp"))
    # Give the job BullMQ retry options (attempts with a long backoff), as a producer would.
    redis_client.hset(
        key, "opts", json.dumps({"attempts": 3, "backoff": {"type": "fixed", "delay": 60_000}})
    )

    async def fail_once_then_retry():
        from bullmq import Worker

        done = asyncio.Event()

        async def process(bull_job, token):
            done.set()
            raise RuntimeError("transient")

        worker = Worker(
            "email", process, {"connection": REDIS_URL, "prefix": fq_prefix, "autorun": False}
        )
        task = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.3)
        await worker.close()
        task.cancel()
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        await queue.promoteJobs()  # the backoff is over: BullMQ puts it back in line
        await queue.close()

    asyncio.run(fail_once_then_retry())
    assert redis_client.hget(key, "atm") == "1"
    assert int(redis_client.hget(key, "timestamp")) == original
    enqueue_jobs("email", [{} for _ in range(10)], priority_level="critical")
    result = rebalance_queue("email", now_ms=original + 300_001)
    assert result.plan[0].job_id == job.job_id and result.plan[0].decision == "aged"
    assert drain_with_stock_worker(fq_prefix, "email", 1)[0][0] == job.job_id


def test_change_priority_failure__job_gone_mid_pass_is_counted(fq_prefix, redis_client):
    jobs = mixed_backlog()
    broker = get_sync_broker()
    real = broker.broker.set_priorities

    async def remove_one_first(queue, changes, **kwargs):
        # A worker finishes a job between the read and the write: a real race, injected.
        await broker.broker.queue(queue).remove(changes[0][0])
        return await real(queue, changes, **kwargs)

    broker.broker.set_priorities = remove_one_first
    try:
        result = rebalance_queue("email")
    finally:
        del broker.broker.set_priorities
    assert result.missing == 1
    assert result.written == result.examined - 1
    processed = drain_with_stock_worker(fq_prefix, "email", len(jobs) - 1)
    assert len(processed) == len(jobs) - 1


def test_foreign_jobs__wait_list_and_plain_priorities_are_adopted(fq_prefix, redis_client):
    async def add_foreign():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        plain = await queue.add("legacy", {"x": 1}, {})
        urgent = await queue.add("legacy", {"x": 2}, {"priority": 1})
        bulk = await queue.add("legacy", {"x": 3}, {"priority": 10})
        await queue.close()
        return plain.id, urgent.id, bulk.id

    plain, urgent, bulk = asyncio.run(add_foreign())
    result = rebalance_queue("email")
    levels = {item.job_id: item.pending.priority_level for item in result.plan}
    assert levels == {plain: "normal", urgent: "critical", bulk: "low"}
    assert redis_client.llen(f"{fq_prefix}:email:wait") == 0
    # A second pass derives the same levels from the producers' requested priorities.
    again = rebalance_queue("email")
    assert again.written == 0
    assert {i.job_id: i.pending.priority_level for i in again.plan} == levels


def test_unparseable_job_is_skipped_and_counted(fq_prefix, redis_client):
    enqueue_jobs("email", [{} for _ in range(3)], priority_level="high")
    bad = enqueue_job("email", {}, priority_level="high")
    redis_client.hset(f"{fq_prefix}:email:{bad.job_id}", "data", "[1, 2]")
    result = rebalance_queue("email")
    assert result.skipped == 1
    assert result.plan[-1].job_id == bad.job_id
    assert len(drain_with_stock_worker(fq_prefix, "email", 4)) == 4


def test_wait_bound_holds_deep_behind_the_window(fq_prefix, settings, redis_client):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "REBALANCE_WINDOW": 10}
    conf.reload_settings()
    jobs = enqueue_jobs("email", [{} for _ in range(300)], priority_level="critical")
    deep = jobs[-1]
    set_timestamp(redis_client, fq_prefix, deep.job_id, int(time.time() * 1000) - 301_000)
    result = rebalance_queue("email")
    assert result.examined == 11
    assert result.overdue == 1
    assert drain_with_stock_worker(fq_prefix, "email", 1)[0][0] == deep.job_id


def test_tag_band_is_rebased_before_it_reaches_bullmqs_cap(fq_prefix, redis_client):
    tags_key = f"{fq_prefix}:email:fq:tags"
    enqueue_job("email", {}, priority_level="low")  # creates the band head at the floor
    redis_client.delete(tags_key)
    # Pretend a long-lived queue has pushed its tags near the cap.
    first = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, 0)[0]
    high = REBASE_THRESHOLD + 4_000
    redis_client.zadd(f"{fq_prefix}:email:prioritized", {first: high * 2**32 + 1})
    redis_client.hset(tags_key, "critical", high)
    later = enqueue_jobs("email", [{} for _ in range(20)], priority_level="critical")
    settings_window = conf.get_settings().rebalance_window
    assert len(later) < settings_window
    # Window takes everything here, so force a band head to remain: add more than a window.
    enqueue_jobs("email", [{} for _ in range(settings_window + 5)], priority_level="normal")
    order_before = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)
    result = rebalance_queue("email")
    assert result.rebased > 0
    order_after = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)
    tail_before = [j for j in order_before if j in set(order_after[settings_window:])]
    assert order_after[settings_window:] == tail_before
    top = (
        max(
            s
            for _, s in redis_client.zrange(
                f"{fq_prefix}:email:prioritized", 0, -1, withscores=True
            )
        )
        // 2**32
    )
    assert top < REBASE_THRESHOLD
    assert int(redis_client.hget(tags_key, "critical")) < REBASE_THRESHOLD
    assert MAX_PRIORITY > top


def test_decision_metrics(fq_prefix):
    enqueue_jobs("email", [{} for _ in range(5)], priority_level="high")
    with metric_delta(
        "queue_fair_decisions_total", job_type="email", decision="weighted_fair"
    ) as fair:
        rebalance_queue("email")
    assert fair() == 5


def test_dry_run_writes_nothing(fq_prefix, redis_client):
    mixed_backlog()
    before = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1, withscores=True)
    result = rebalance_queue("email", dry_run=True)
    assert result.plan and result.written == 0
    assert redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1, withscores=True) == before


# --- the command -------------------------------------------------------------------------


def test_done_when__rebalance_fair_once_puts_all_200_low_jobs_in_the_first_1000(fq_prefix):
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


def test_dry_run_prints_the_order(fq_prefix, capsys):
    enqueue_jobs("email", [{} for _ in range(3)], priority_level="low")
    call_command("rebalance_fair", "--once", "--dry-run", "--queue", "email")
    out = capsys.readouterr().out
    assert "(dry run)" in out and out.count(" low ") == 3


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


def test_mass_overdue__oldest_window_promoted_and_all_counted(fq_prefix, settings, redis_client):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "REBALANCE_WINDOW": 10}
    conf.reload_settings()
    jobs = enqueue_jobs("email", [{} for _ in range(60)], priority_level="low")
    now = int(time.time() * 1000)
    for age, job in enumerate(jobs):  # later jobs are older: the oldest sit deepest
        set_timestamp(redis_client, fq_prefix, job.job_id, now - 400_000 - age)
    result = rebalance_queue("email", now_ms=now)
    assert result.overdue == 60
    assert result.examined == 20  # the window and the 10 oldest behind it
    oldest_first = [job.job_id for job in reversed(jobs)]
    assert [item.job_id for item in result.plan[:10]] == oldest_first[:10]
    assert metric("queue_fair_overdue_waiting", job_type="email") == 60
