"""Account limits (max_active, rate, max_waiting over all an account's tenants) beside
the tenants' own, with stock Node workers, real Redis; and the release script held to
the pure decision (fairqueue.scheduling.limits.release_room with an AccountRoom)."""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairqueue import enqueue_job, enqueue_jobs, enqueue_on_commit
from fairqueue.broker import get_sync_broker
from fairqueue.enqueue.priority import wire_tenant_plan_lookup
from fairqueue.exceptions import AccountBacklogFullError
from fairqueue.models import Account, OutboxJob, TenantPlan
from fairqueue.scheduling.limits import AccountRoom, TenantLimits, release_room
from fairqueue.scheduling.wire import encoded_limits
from tests.helpers import bullmq_counts as counts
from tests.helpers import release
from tests.helpers.node import NodeWorker, active_ids

pytestmark = [pytest.mark.django_db, pytest.mark.serial]


def _account(**limits):
    account = Account.objects.create(account_id="acct", **limits)
    for tenant in ("t1", "t2", "t3"):
        TenantPlan.objects.create(tenant_id=tenant, plan_tier="pro", account=account)
    TenantPlan.objects.create(tenant_id="free", plan_tier="pro")
    wire_tenant_plan_lookup()
    return account


def _account_job(tenant: str, max_waiting: int, delay_ms: int | None = None):
    """A ``NewJob`` of ``tenant`` in account ``acct`` (``max_waiting``), as the producer
    builds it, for adding through the broker directly (one batch, several calls)."""
    from fairqueue.broker import NewJob
    from fairqueue.scheduling.levels import PriorityLevel

    return NewJob(
        "email",
        {"tenantId": tenant},
        PriorityLevel.NORMAL,
        tenant=tenant,
        limits=encoded_limits(TenantLimits()),
        account="acct",
        account_limits=encoded_limits(TenantLimits(max_waiting=max_waiting)),
        delay_ms=delay_ms,
    )


def _run_releasing(worker, seconds, sample=None):
    """What the loop does every 20 ms, for ``seconds``; ``sample()`` after each step."""
    most = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        release()
        if sample is not None:
            most = max(most, sample())
        time.sleep(0.02)
    return worker.starts(), most


def test_account_max_active__3_tenants_never_run_more_than_2_at_once(node, fq_prefix, redis_client):
    _account(max_active=2)
    ids = [
        job.job_id
        for tenant in ("t1", "t2", "t3")
        for job in enqueue_jobs("email", [{} for _ in range(6)], tenant_id=tenant)
    ]
    free = [job.job_id for job in enqueue_jobs("email", [{} for _ in range(6)], tenant_id="free")]
    assert counts(fq_prefix)["prioritized"] == 2 + 6  # the account's 2, the free tenant's 6
    worker = NodeWorker(node, fq_prefix, concurrency=16, run_ms=4500, job_ms=60)
    starts, most = _run_releasing(
        worker, 4.0, lambda: sum(i in ids for i in active_ids(redis_client, fq_prefix))
    )
    assert most <= 2, most  # 16 slots, 3 tenants without limits of their own
    assert most == 2
    started = [s.job_id for s in starts]
    assert sorted(started) == sorted(ids + free)  # every job, once
    first = [s.tenant for s in starts if s.job_id in ids][:6]
    assert len(set(first)) >= 2, first  # its tenants share its slots, none waits for t1


def test_account_and_tenant_limits__both_hold(node, fq_prefix, redis_client):
    _account(max_active=3)
    TenantPlan.objects.filter(tenant_id="t1").update(max_active=1)
    from fairqueue.enqueue.lookups import forget_all_tenant_plans

    forget_all_tenant_plans()
    t1 = [j.job_id for j in enqueue_jobs("email", [{} for _ in range(6)], tenant_id="t1")]
    t2 = [j.job_id for j in enqueue_jobs("email", [{} for _ in range(6)], tenant_id="t2")]
    worker = NodeWorker(node, fq_prefix, concurrency=16, run_ms=3500, job_ms=80)
    seen = {"t1": 0, "all": 0}

    def sample():
        active = active_ids(redis_client, fq_prefix)
        seen["t1"] = max(seen["t1"], sum(i in t1 for i in active))
        seen["all"] = max(seen["all"], sum(i in t1 + t2 for i in active))
        return 0

    starts, _ = _run_releasing(worker, 3.0, sample)
    assert seen["t1"] == 1  # the tenant's own max_active
    assert 2 <= seen["all"] <= 3  # the account's (a 10 ms sample may miss a moment of 3)
    assert sorted(s.job_id for s in starts) == sorted(t1 + t2)


def test_account_rate__starts_per_window_over_all_its_tenants(node, fq_prefix):
    _account(rate_max=4, rate_duration_ms=1000)
    ids = {
        job.job_id
        for tenant in ("t1", "t2", "t3")
        for job in enqueue_jobs("email", [{} for _ in range(8)], tenant_id=tenant)
    }
    worker = NodeWorker(node, fq_prefix, concurrency=16, run_ms=4200, job_ms=10)
    starts, _ = _run_releasing(worker, 4.0)
    at = sorted(s.at_ms for s in starts if s.job_id in ids)
    assert len(at) >= 4  # it ran (a loaded machine starts the worker late)
    for i, first in enumerate(at):  # any window of 1 s holds at most 4 starts
        assert sum(1 for t in at[i:] if t < first + 1000) <= 4, at
    assert len({s.tenant for s in starts}) >= 2  # not one tenant's rate


def test_account_max_waiting__single_batch_and_durable_enqueues_refused(fq_prefix):
    _account(max_waiting=5)
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="t1")
    enqueue_job("email", {}, tenant_id="t2")
    enqueue_job("email", {}, tenant_id="t3")  # 5: the account's max_waiting
    before = counts(fq_prefix)
    with pytest.raises(AccountBacklogFullError, match=r"account 'acct' already has 5 jobs"):
        enqueue_job("email", {}, tenant_id="t3")
    with pytest.raises(AccountBacklogFullError) as refused:
        enqueue_jobs("email", [{}, {}], tenant_id="t2")  # refused whole
    assert (refused.value.limit, refused.value.waiting) == (5, 5)
    with pytest.raises(AccountBacklogFullError):
        enqueue_on_commit("email", {}, tenant_id="t1")
    assert OutboxJob.objects.count() == 0  # refused before the outbox row
    assert counts(fq_prefix) == before  # nothing added
    enqueue_jobs("email", [{} for _ in range(8)], tenant_id="free")  # no account: unchanged


def test_account_max_waiting__counts_delayed_enqueues_on_every_path(
    fq_prefix, redis_client, django_capture_on_commit_callbacks
):
    """Delayed jobs count for their account's max_waiting as for their tenant's: single,
    batch (delayed jobs go one a call, the batch checked whole by its first) and durable
    delayed enqueues fill it and are refused past it, and an undelayed enqueue counts the
    delayed ones already added."""

    _account(max_waiting=5)
    base = f"{fq_prefix}:email:fq:lim"
    sync = get_sync_broker()

    def delayed_batch(tenant, count):
        job = _account_job(tenant, 5, delay_ms=60_000)
        return sync.run(sync.broker.adding.add_jobs, "email", [job] * count)

    enqueue_job("email", {}, tenant_id="t1", delay_ms=60_000)
    delayed_batch("t2", 2)
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_on_commit("email", {}, tenant_id="t3", delay_ms=60_000)
    assert redis_client.scard(f"{base}:aheld:acct") == 4  # every delayed one counted
    assert redis_client.hget(f"{base}:acc", "acct") == "\n\n\n5"
    enqueue_job("email", {}, tenant_id="t3")  # 5
    before = counts(fq_prefix)
    with pytest.raises(AccountBacklogFullError) as refused:
        enqueue_job("email", {}, tenant_id="t1", delay_ms=60_000)
    assert (refused.value.limit, refused.value.waiting) == (5, 5)
    with pytest.raises(AccountBacklogFullError):
        delayed_batch("t2", 2)
    with pytest.raises(AccountBacklogFullError):
        enqueue_on_commit("email", {}, tenant_id="t1", delay_ms=60_000)
    with pytest.raises(AccountBacklogFullError):
        enqueue_job("email", {}, tenant_id="t2")  # undelayed: the delayed ones count
    assert counts(fq_prefix) == before
    assert OutboxJob.objects.count() == 0
    for _ in range(8):  # no account: unchanged
        enqueue_job("email", {}, tenant_id="free", delay_ms=60_000)


def test_account_max_waiting__a_delayed_batch_is_refused_whole(fq_prefix, redis_client):
    """A batch of delayed jobs (one call each) past its account's room adds none."""

    _account(max_waiting=5)
    enqueue_jobs("email", [{}] * 3, tenant_id="t1")
    sync = get_sync_broker()
    job = _account_job("t2", 5, delay_ms=60_000)
    with pytest.raises(AccountBacklogFullError):
        sync.run(sync.broker.adding.add_jobs, "email", [job] * 3)
    assert counts(fq_prefix)["delayed"] + counts(fq_prefix)["prioritized"] == 3  # t1's
    assert len(sync.run(sync.broker.adding.add_jobs, "email", [job] * 2)) == 2  # its room


def test_account_max_waiting__a_batch_over_several_calls_is_refused_whole(fq_prefix):
    _account(max_waiting=30)

    enqueue_jobs("email", [{} for _ in range(20)], tenant_id="t1")
    sync = get_sync_broker()
    jobs = [_account_job("t2", 30) for _ in range(12)]
    sync.broker.adding.batch_size = 5  # three calls
    with pytest.raises(AccountBacklogFullError):
        sync.run(sync.broker.adding.add_jobs, "email", jobs)
    assert counts(fq_prefix)["delayed"] + counts(fq_prefix)["prioritized"] == 20


def test_tenants_without_an_account__unchanged(fq_prefix, redis_client):
    _account(max_active=1)
    free = [j.job_id for j in enqueue_jobs("email", [{} for _ in range(4)], tenant_id="free")]
    assert counts(fq_prefix)["prioritized"] == 4  # not held
    assert not redis_client.hexists(f"{fq_prefix}:email:fq:lim", "free")
    assert not redis_client.hexists(f"{fq_prefix}:email:fq:lim:tacct", "free")
    assert all(redis_client.zscore(f"{fq_prefix}:email:prioritized", i) for i in free)


def test_account_save__syncs_its_limits_in_one_write_and_releases_its_tenants(
    fq_prefix, redis_client, django_capture_on_commit_callbacks
):
    account = _account(max_active=1)
    enqueue_jobs("email", [{} for _ in range(4)], tenant_id="t1")
    assert counts(fq_prefix)["prioritized"] == 1
    account.max_active = 3
    with django_capture_on_commit_callbacks(execute=True):
        account.save()
    assert redis_client.hget(f"{fq_prefix}:email:fq:lim:acc", "acct") == "3\n\n\n"
    release()
    assert counts(fq_prefix)["prioritized"] == 3
    account.max_active = None
    with django_capture_on_commit_callbacks(execute=True):
        account.save()
    assert not redis_client.hexists(f"{fq_prefix}:email:fq:lim:acc", "acct")
    release()
    assert counts(fq_prefix)["prioritized"] == 4


optional = st.one_of(st.none(), st.integers(1, 20))
limits_strategy = st.builds(
    lambda active, rate, duration: TenantLimits(
        max_active=active, rate_max=rate, rate_duration_ms=None if rate is None else duration
    ),
    optional,
    optional,
    st.integers(1_000, 60_000),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tenant=limits_strategy,
    account=limits_strategy,
    held=st.integers(0, 12),
    occupied=st.integers(0, 6),
    others=st.integers(0, 8),
    started=st.integers(0, 12),
    ahead=st.integers(0, 3),
)
def test_release_script__account_and_tenant__releases_what_release_room_says(
    fq_prefix, redis_client, tenant, account, held, occupied, others, started, ahead
):
    """A tenant's held jobs, its own released ones still running, and its account's other
    tenants' running jobs and starts in the account's window: the script releases what
    the pure decision says, with the binding limit's reason."""
    client, t = redis_client, uuid.uuid4().hex[:8]
    base = f"{fq_prefix}:email:fq:lim"
    a = f"a{t}"
    now_ms = int(time.time() * 1000)
    for i in range(held):
        job_id = f"{t}-h{i}"
        client.hset(f"{fq_prefix}:email:{job_id}", mapping={"data": "{}", "priority": 2097151})
        client.zadd(f"{fq_prefix}:email:delayed", {job_id: 253402300799000 * 4096})
        client.rpush(f"{base}:held:{t}", job_id)
        client.hset(f"{base}:meta", job_id, "normal\n1\n\n1\n" + a)
    for i in range(occupied):  # its own, running
        job_id = f"{t}-o{i}"
        client.hset(f"{fq_prefix}:email:{job_id}", mapping={"data": "{}"})
        client.sadd(f"{base}:out:{t}", job_id)
        client.sadd(f"{base}:aout:{a}", job_id)
    for i in range(others):  # its account's other tenants', running
        job_id = f"{t}-x{i}"
        client.hset(f"{fq_prefix}:email:{job_id}", mapping={"data": "{}"})
        client.sadd(f"{base}:aout:{a}", job_id)
    for i in range(started):  # the account's releases inside its window
        client.zadd(f"{base}:arate:{a}", {f"{t}-r{i}": now_ms - 100})
    client.sadd(f"{base}:tenants", t)
    client.hset(base, t, encoded_limits(tenant))
    client.hset(f"{base}:tacct", t, a)
    client.hset(f"{base}:acc", a, encoded_limits(account))
    for i in range(ahead):  # its account's tenants waiting for its slots before it
        client.zadd(f"{base}:await:{a}", {f"w{i}-{t}": i})
    released = release("email", [t])
    expected = release_room(
        tenant,
        held=held,
        occupied=occupied,
        started_in_window=0,
        account=AccountRoom(
            account,
            occupied=occupied + others,
            started_in_window=started if account.rate_max is not None else 0,
            waiting_ahead=ahead,
        ),
    )
    assert released.released == expected.count
    assert client.llen(f"{base}:held:{t}") == held - expected.count
    assert client.scard(f"{base}:aout:{a}") == occupied + others + expected.count
    if expected.reason is not None and held - expected.count:
        assert released.by_reason[expected.reason] == held - expected.count


@settings(max_examples=300, deadline=None)
@given(
    tenant=limits_strategy,
    account=limits_strategy,
    held=st.integers(0, 300),
    occupied=st.integers(0, 30),
    account_occupied=st.integers(0, 60),
    started=st.integers(0, 30),
    takeable=st.integers(0, 250),
)
def test_release_room__with_an_account_both_limits_hold(
    tenant, account, held, occupied, account_occupied, started, takeable
):
    """The account's room never lets more go than the tenant's alone, never past the
    account's max_active or rate, and is all the tenant's when the account has room."""
    alone = release_room(tenant, held=held, occupied=occupied, started_in_window=0)
    room = AccountRoom(
        account, occupied=account_occupied, started_in_window=started, takeable=takeable
    )
    both = release_room(tenant, held=held, occupied=occupied, started_in_window=0, account=room)
    assert 0 <= both.count <= alone.count
    if account.max_active is not None:
        assert both.count == 0 or account_occupied + both.count <= account.max_active
    if account.rate_max is not None:
        assert both.count == 0 or started + both.count <= account.rate_max
    assert both.count == 0 or takeable + both.count <= 200  # TAKEABLE_CAP over the account
    unlimited = AccountRoom(TenantLimits())
    assert (
        release_room(tenant, held=held, occupied=occupied, started_in_window=0, account=unlimited)
        == alone
    )
    if both.count < alone.count:
        assert both.reason in ("max_active", "rate", None)


def test_account_limits__come_back_at_the_pass_after_redis_lost_its_keys(fq_prefix, redis_client):
    """Redis loses fairqueue's keys (a restart without persistence, an operator's flush):
    the loop's next pass brings the account's limits back from the database with the
    tenants' own, before any of its tenants enqueues again. Jobs a plain BullMQ producer
    adds for its tenants are then held by the account's max_active (2 of 6 released)."""
    import asyncio

    from bullmq import Queue

    from fairqueue.rebalance.passes import rebalance_queue
    from fairqueue.tenants import rebuild_tenant_limits
    from tests.helpers.keys import REDIS_URL, delete_prefix

    _account(max_active=2)
    base = f"{fq_prefix}:email:fq:lim"
    assert rebuild_tenant_limits(["email"])
    delete_prefix(fq_prefix)  # Redis forgot: no limits, no jobs
    assert rebuild_tenant_limits(force=False)  # what the loop's pass does
    assert redis_client.hget(f"{base}:acc", "acct") == "2\n\n\n"
    assert redis_client.hgetall(f"{base}:tacct") == {"t1": "acct", "t2": "acct", "t3": "acct"}
    assert redis_client.hget(base, "t1") == "\n\n\n"  # held like its adds make it
    assert not redis_client.hexists(base, "free")
    assert not rebuild_tenant_limits(force=False)  # the copy is there: no work

    async def add() -> None:
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        try:
            for tenant in ("t1", "t2", "t3", "t1", "t2", "t3"):
                await queue.add("plain", {"tenantId": tenant, "priorityLevel": "normal"}, {})
        finally:
            await queue.close()

    asyncio.run(add())
    assert rebalance_queue("email").adopted == 0  # adopted into its tenants' held jobs
    release()
    assert counts(fq_prefix)["prioritized"] + counts(fq_prefix)["wait"] == 2
    assert redis_client.scard(f"{base}:aheld:acct") == 4
