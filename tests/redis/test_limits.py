"""Per-tenant limits with stock BullMQ workers: held jobs, their release, pause, the
backlog cap. Real Redis, the real bullmq package; each test its own prefix."""

from __future__ import annotations

import asyncio
import time

import pytest
from bullmq import Queue

from fairqueue import (
    TenantBacklogFullError,
    enqueue_job,
    enqueue_jobs,
    pause_tenant,
    resume_tenant,
)
from fairqueue.broker import get_sync_broker
from fairqueue.enqueue.priority import wire_tenant_plan_lookup
from fairqueue.exceptions import InvalidTenantError
from fairqueue.models import OutboxJob, PriorityOverrideAudit, TenantPauseAudit, TenantPlan
from tests.helpers import bullmq_counts as counts
from tests.helpers import (
    drain_with_stock_worker,
    metric,
    release,
    run_stock_worker,
    settle_releases,
    stock_worker_until,
    wait_until,
)
from tests.helpers.keys import REDIS_URL

# Timing-sensitive (live workers, loops): `make test` runs them after the parallel part.
pytestmark = [pytest.mark.django_db, pytest.mark.serial]


def test_jobs_beyond_max_active__are_delayed_in_bullmq_counts(limited):
    enqueue_jobs("email", [{"n": i} for i in range(10)], tenant_id="acme")
    enqueue_jobs("email", [{"n": i} for i in range(3)], tenant_id="beta")
    found = counts(limited)
    assert found["prioritized"] == 2 + 3
    assert found["delayed"] == 8
    assert found["wait"] == 0


@pytest.fixture
def loop_running(limited, transactional_db):
    """The loop in a thread. It writes the usage ledger on its own database connection, outside
    a test's rolled-back transaction: hence a transactional test, whose tables are emptied after."""
    import threading

    from fairqueue.rebalance.rebalancer import Rebalancer

    rebalancer = Rebalancer(["email"], interval_ms=1000, install_signal_handlers=False)
    thread = threading.Thread(target=rebalancer.run, daemon=True)
    thread.start()
    # leading (after its random start-up delay and first pass): from now on it releases
    assert wait_until(lambda: all(lock.held for lock in rebalancer.locks.values()), 10)
    yield rebalancer
    rebalancer.request_stop()
    thread.join(10)


def test_stock_worker_8_slots__never_runs_more_than_max_active(limited, loop_running):
    acme = [job.job_id for job in enqueue_jobs("email", [{} for _ in range(30)], tenant_id="acme")]
    beta = [job.job_id for job in enqueue_jobs("email", [{} for _ in range(30)], tenant_id="beta")]
    finished, most = run_stock_worker(limited, 60, sample_ids=acme)
    assert sorted(finished) == sorted(acme + beta)  # all ran, each once
    assert len(set(finished)) == 60
    assert most == 2
    # the other tenant used the slots acme could not: it finished well before acme
    assert max(finished.index(job_id) for job_id in beta) < max(
        finished.index(job_id) for job_id in acme
    )
    found = counts(limited)
    assert found["delayed"] == found["prioritized"] == found["active"] == 0


def test_delayed_jobs__are_held_from_the_start_and_never_exceed_max_active(
    limited, loop_running, redis_client
):
    """A limited tenant's delayed jobs: BullMQ's promotion (a worker's fetch) never makes
    them takeable; once due they join the tenant's held jobs and run within its limit."""
    acme = [
        enqueue_job("email", {"n": n}, tenant_id="acme", delay_ms=200).job_id for n in range(12)
    ]
    beta = enqueue_job("email", {}, tenant_id="beta", delay_ms=200).job_id
    base = f"{limited}:email"
    # held at once: BullMQ shows them delayed, none at its due time, none indexed yet
    assert counts(limited)["delayed"] == 13
    assert redis_client.zcard(f"{base}:fq:lim:later:acme") == 12
    assert redis_client.zscore(f"{base}:delayed", acme[0]) > redis_client.zscore(
        f"{base}:delayed", beta
    )
    finished, most = run_stock_worker(limited, 13, concurrency=8, sample_ids=acme)
    assert sorted(finished) == sorted([*acme, beta])
    assert most == 2
    assert finished.index(beta) < max(finished.index(job_id) for job_id in acme)
    assert redis_client.exists(f"{base}:fq:lim:later:acme") == 0
    assert wait_until(
        lambda: release().held == 0 and not redis_client.scard(f"{base}:fq:lim:tenants"), 5
    )


def test_release_order__held_jobs_run_oldest_first_with_fair_tags(limited):
    acme = [job.job_id for job in enqueue_jobs("email", [{} for _ in range(6)], tenant_id="acme")]
    finished, _ = run_stock_worker(limited, 2, concurrency=1)
    assert finished == acme[:2]
    while release().held:
        run_stock_worker(limited, 1, concurrency=1)
    assert release().released == 0


# -- max_waiting: the error, and nothing written -------------------------------------


@pytest.fixture
def capped(fq_prefix, redis_client):
    """'acme' may have 3 jobs waiting; 2 are waiting already."""
    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro", max_waiting=3)
    wire_tenant_plan_lookup()
    enqueue_jobs("email", [{}, {}], tenant_id="acme")
    return fq_prefix


def snapshot(prefix, redis_client):
    """Everything an enqueue could have written: Redis keys and their sizes, the audit
    and outbox tables, the enqueue metrics."""
    keys = {}
    for key in redis_client.scan_iter(match=f"{prefix}:*"):
        kind = redis_client.type(key)
        size = {
            "zset": redis_client.zcard,
            "list": redis_client.llen,
            "hash": redis_client.hlen,
            "set": redis_client.scard,
            "stream": redis_client.xlen,
        }.get(kind, lambda k: redis_client.strlen(k))(key)
        keys[key] = size
    return (
        keys,
        PriorityOverrideAudit.objects.count(),
        OutboxJob.objects.count(),
        metric("queue_jobs_enqueued_total", queue="email", priority="normal"),
        metric("queue_fair_priority_assigned_total", job_type="email", priority_level="normal"),
    )


def assert_refused(info, waiting=2):
    error = info.value
    assert (error.tenant_id, error.queue, error.limit, error.waiting) == (
        "acme",
        "email",
        3,
        waiting,
    )
    assert str(error) == (
        f"tenant 'acme' already has {waiting} jobs waiting in queue 'email': its max_waiting "
        "is 3, so the enqueue was refused and nothing was added"
    )


def test_max_waiting__single_enqueue_refused_and_nothing_written(capped, redis_client):
    enqueue_job("email", {}, tenant_id="acme")  # the third fits
    before = snapshot(capped, redis_client)
    refusals = metric("queue_fair_limited_total", job_type="email", reason="max_waiting")
    with pytest.raises(TenantBacklogFullError) as info:
        enqueue_job("email", {}, tenant_id="acme", priority_override="high", actor="ops")
    assert_refused(info, waiting=3)
    assert snapshot(capped, redis_client) == before  # no job, no audit row, no metric
    after = metric("queue_fair_limited_total", job_type="email", reason="max_waiting")
    assert after == refusals + 1


def test_max_waiting__batch_refused_whole(capped, redis_client):
    before = snapshot(capped, redis_client)
    with pytest.raises(TenantBacklogFullError) as info:
        enqueue_jobs("email", [{}, {}], tenant_id="acme")  # 2 + 2 > 3: none of them
    assert_refused(info)
    assert snapshot(capped, redis_client) == before
    assert len(enqueue_jobs("email", [{}], tenant_id="acme")) == 1  # 2 + 1 fits


@pytest.mark.django_db(transaction=True)
def test_max_waiting__durable_enqueue_refused_before_the_outbox_row(capped, redis_client):
    from django.db import transaction

    from fairqueue import enqueue_on_commit

    before = snapshot(capped, redis_client)
    with pytest.raises(TenantBacklogFullError) as info, transaction.atomic():
        enqueue_on_commit("email", {}, tenant_id="acme")
        enqueue_on_commit("email", {}, tenant_id="acme")  # the outbox row counts too
    assert_refused(info, waiting=3)
    assert snapshot(capped, redis_client) == before


def test_max_waiting__task_enqueue_refused(capped, redis_client):
    from tests.helpers.tasks import record

    record.enqueue("fits", tenant_id="acme")
    before = snapshot(capped, redis_client)
    with pytest.raises(TenantBacklogFullError) as info:
        record.enqueue("over", tenant_id="acme")
    assert_refused(info, waiting=3)
    assert snapshot(capped, redis_client) == before


def test_max_waiting__running_jobs_do_not_count(capped):
    finished, _ = run_stock_worker(capped, 2, concurrency=2)
    assert len(finished) == 2
    assert len(enqueue_jobs("email", [{}, {}, {}], tenant_id="acme")) == 3


# -- pause and resume ----------------------------------------------------------------


def test_pause__no_job_starts_after_it_returns_and_resume_runs_all_in_order(
    limited, loop_running, redis_client
):
    acme = [job.job_id for job in enqueue_jobs("email", [{} for _ in range(6)], tenant_id="acme")]
    assert pause_tenant("acme", actor="ops", source="test") == 2  # the 2 takeable ones
    assert counts(limited)["delayed"] == 6
    beta = [job.job_id for job in enqueue_jobs("email", [{} for _ in range(4)], tenant_id="beta")]
    later = enqueue_jobs("email", [{}], tenant_id="acme")[0].job_id
    finished, _ = run_stock_worker(limited, 4)
    assert sorted(finished) == sorted(beta)  # the others ran; none of acme's
    time.sleep(0.2)  # the loop keeps releasing: still nothing of acme's
    assert counts(limited)["delayed"] == 7 and counts(limited)["prioritized"] == 0
    # the call releases what has room, unless the loop's step got there first
    assert resume_tenant("acme", actor="ops") in (0, 1, 2)
    assert counts(limited)["prioritized"] == 2  # max_active 2, either way
    finished, _ = run_stock_worker(limited, 7, concurrency=1)
    assert finished == [*acme, later]  # all of them, in their order
    audit = list(TenantPauseAudit.objects.order_by("created_at").values_list("action", "actor"))
    assert audit == [("paused", "ops"), ("resumed", "ops")]
    assert TenantPlan.objects.get(tenant_id="acme").paused is False


def test_pause__tenant_without_a_row_or_limits_is_held_too(fq_prefix):
    pause_tenant("zed")
    job = enqueue_job("email", {}, tenant_id="zed")  # no lookup wired: the Redis flag holds it
    assert counts(fq_prefix)["delayed"] == 1
    resume_tenant("zed")
    assert drain_with_stock_worker(fq_prefix, "email", 1)[0][0] == job.job_id


def test_pause__bad_tenant_id_is_refused_by_name():
    with pytest.raises(InvalidTenantError, match="tenant_id"):
        pause_tenant("")


# -- fairqueue_worker releases at once --------------------------------------------------


def test_fairqueue_worker__releases_the_next_held_job_as_one_finishes(limited, registry):
    from fairqueue.worker import handlers
    from fairqueue.worker.runner import Worker as FairWorker

    TenantPlan.objects.filter(tenant_id="acme").update(max_active=1)
    from fairqueue.enqueue.lookups import forget_tenant_plan

    forget_tenant_plan("acme")
    spans: list[tuple[float, float]] = []
    handlers.unregister("email")  # the demo project's; the registry fixture restores it

    @handlers.handler("email")
    def work(payload, context):
        started = time.monotonic()
        time.sleep(0.02)
        spans.append((started, time.monotonic()))

    enqueue_jobs("email", [{} for _ in range(8)], tenant_id="acme")
    FairWorker(["email"], concurrency=4, burst=True, install_signal_handlers=False).run()
    assert len(spans) == 8  # no loop ran: the worker released every one of them
    spans.sort()
    gaps = [later[0] - earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)]
    assert min(gaps) >= 0  # never two at once
    print("fairqueue_worker release gaps ms", [round(g * 1000, 1) for g in gaps])
    # released as the slot frees (the worker's own release: no loop runs), with a margin
    # for a loaded machine (a drain's pace is bench_limits.py's)
    assert max(gaps) < 0.5


def test_loop__releases_at_a_release_step_after_a_stock_workers_completion(limited, loop_running):
    TenantPlan.objects.filter(tenant_id="acme").update(max_active=1)
    from fairqueue.enqueue.lookups import forget_tenant_plan

    forget_tenant_plan("acme")
    spans: list[tuple[float, float]] = []

    async def process(job):
        started = time.monotonic()
        await asyncio.sleep(0.02)
        spans.append((started, time.monotonic()))

    enqueue_jobs("email", [{} for _ in range(10)], tenant_id="acme")
    asyncio.run(stock_worker_until(limited, "email", process, 10, 30, concurrency=4))
    spans.sort()
    gaps = [later[0] - earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)]
    print("loop release gaps ms", [round(g * 1000, 1) for g in gaps])
    assert min(gaps) >= 0  # never two at once
    # the median: a release step (every 20 ms), not the next pass (1 s), with a margin for
    # a loaded machine (a drain's pace is bench_limits.py's)
    assert sorted(gaps)[len(gaps) // 2] < 0.5


def test_rate_limit__starts_follow_rate_max_per_duration(limited, loop_running):
    TenantPlan.objects.filter(tenant_id="acme").update(
        max_active=None, rate_max=10, rate_duration_ms=250
    )
    from fairqueue.enqueue.lookups import forget_tenant_plan

    forget_tenant_plan("acme")
    starts: list[float] = []

    enqueue_jobs("email", [{} for _ in range(60)], tenant_id="acme")
    asyncio.run(
        stock_worker_until(
            limited, "email", lambda job: starts.append(time.monotonic()), 60, 30, concurrency=8
        )
    )
    starts.sort()
    # 10 per 250 ms, paced (a burst of 2, then one per 25 ms): 60 jobs in about 1.45 s;
    # never faster than the rate (1.25 s at the very least), and not much slower (a margin
    # for a loaded machine)
    elapsed = starts[-1] - starts[0]
    assert 1.2 <= elapsed <= 3.0, elapsed
    most = max(sum(1 for other in starts if start <= other < start + 0.25) for start in starts)
    # at most rate_max released per window; a start can lag its release, so a window's
    # starts may include the few (a burst, 2 here) released at the end of the one before
    assert most <= 10 + 2, most


# -- visible: the dashboard and the metrics ---------------------------------------------


def test_dashboard__lists_limited_tenants_their_held_jobs_and_why_they_wait(limited, viewer):
    from django.urls import reverse

    acme = [job.job_id for job in enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme")]
    TenantPlan.objects.create(tenant_id="zed", plan_tier="pro")
    pause_tenant("zed")
    enqueue_job("email", {}, tenant_id="zed")
    stats = viewer.get(reverse("admin:fairqueue_dashboard_stats"), {"queue": "email"}).json()
    (queue,) = stats["queues"]
    limits = queue["limits"]
    assert limits["held_total"] == 4
    rows = {row["tenant"]: row for row in limits["tenants"]}
    assert rows["acme"]["held"] == 3 and rows["acme"]["max_active"] == 2
    assert rows["acme"]["why"] == (
        "at its limit of 2 at once (0 running, 2 released and not taken by a worker yet)"
    )
    assert rows["acme"]["held_jobs"] == acme[2:]  # in release order
    assert rows["zed"]["paused"] is True and rows["zed"]["why"] == "paused"
    assert queue["counts"]["delayed"] == 4  # BullMQ's own count: delayed, not lost
    page = viewer.get(reverse("admin:fairqueue_dashboard_changelist")).content.decode()
    assert "Limited tenants" in page and "at its limit of 2 at once" in page


def test_metrics__held_gauge_and_limited_counter_without_tenant_labels(limited):
    from fairqueue.rebalance.passes import rebalance_queue

    held_before = metric("queue_fair_limited_total", job_type="email", reason="max_active")
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme")
    assert metric("queue_fair_limited_total", job_type="email", reason="max_active") == (
        held_before + 3
    )
    rebalance_queue("email")
    assert metric("queue_fair_held_jobs", job_type="email") == 3
    from prometheus_client import REGISTRY, generate_latest

    text = generate_latest(REGISTRY).decode()
    assert "acme" not in text  # no tenant id in any label


def test_held_jobs__bullmq_state_is_delayed_and_stock_node_workers_skip_them(limited):
    """A stock Node worker (any concurrency) never takes a held job: BullMQ promotes only
    delayed jobs whose time has come, and held jobs are due in the year 9999."""
    import shutil

    from tests.helpers.node import NODE_DIR, run_node_worker

    if shutil.which("node") is None or not (NODE_DIR / "node_modules" / "bullmq").is_dir():
        pytest.skip("node or tests/node/node_modules missing (run: cd tests/node && npm ci)")
    acme = [job.job_id for job in enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme")]

    async def states():
        q = Queue("email", {"connection": REDIS_URL, "prefix": limited})
        try:
            return [await q.getJobState(job_id) for job_id in acme]
        finally:
            await q.close()

    assert asyncio.run(states()) == ["prioritized"] * 2 + ["delayed"] * 3
    processed = run_node_worker([shutil.which("node"), str(NODE_DIR / "worker.mjs")], limited, 2)
    assert processed == acme[:2]  # the two takeable ones, then nothing: the rest are held
    assert asyncio.run(states())[2:] == ["delayed"] * 3
    assert release().released == 2  # their slots are free now: the next two go
    assert asyncio.run(states())[2:] == ["prioritized", "prioritized", "delayed"]


def test_admin_actions__pause_and_resume_are_audited_with_the_user(limited, admin_client):
    from django.urls import reverse

    plan = TenantPlan.objects.get(tenant_id="acme")
    url = reverse("admin:fairqueue_tenantplan_changelist")
    response = admin_client.post(url, {"action": "pause", "_selected_action": [plan.pk]})
    assert response.status_code == 302
    assert TenantPlan.objects.get(pk=plan.pk).paused is True
    enqueue_job("email", {}, tenant_id="acme")
    assert counts(limited)["delayed"] == 1
    admin_client.post(url, {"action": "resume", "_selected_action": [plan.pk]})
    assert counts(limited)["delayed"] == 0 and counts(limited)["prioritized"] == 1
    audit = list(
        TenantPauseAudit.objects.order_by("created_at").values_list("action", "actor", "source")
    )
    assert audit == [("paused", "admin", "admin"), ("resumed", "admin", "admin")]


@pytest.mark.django_db(transaction=True)
def test_aenqueue_job__holds_like_enqueue_job(limited):
    from fairqueue import aenqueue_job

    async def main():
        return [await aenqueue_job("email", {}, tenant_id="acme") for _ in range(4)]

    asyncio.run(main())
    found = counts(limited)
    assert (found["prioritized"], found["delayed"]) == (2, 2)


def test_limits_lookup_failure__logs_the_class_only_and_applies_none(fq_prefix, caplog):
    from fairqueue.enqueue import priority

    def broken(tenant_id, plan):
        raise RuntimeError(f"database down for {tenant_id}")

    priority._limits_lookup = broken
    try:
        enqueue_jobs("email", [{}, {}, {}], tenant_id="acme")
    finally:
        priority._limits_lookup = None
    assert counts(fq_prefix)["prioritized"] == 3  # enqueues go on
    messages = [r.getMessage() for r in caplog.records if "limits lookup" in r.getMessage()]
    assert messages == ["tenant limits lookup failed (RuntimeError); none applied"]
    assert "acme" not in caplog.text  # no tenant id in logs


def test_pause__holds_the_tenants_jobs_added_before_it_had_limits(
    limited, loop_running, redis_client
):
    """A tenant without limits has untracked jobs waiting; the pause finds them (a paged
    scan by tenantId, ties of score included) and holds them, in their order, before its
    later ones; nobody else's job moves."""
    from fairqueue.broker import limit_store as broker_limits

    early = [j.job_id for j in enqueue_jobs("email", [{} for _ in range(7)], tenant_id="zed")]
    others = [j.job_id for j in enqueue_jobs("email", [{} for _ in range(5)], tenant_id="zedd")]
    original = broker_limits.SCAN_PAGE
    broker_limits.SCAN_PAGE = 2  # many pages
    try:
        assert pause_tenant("zed") == 7
    finally:
        broker_limits.SCAN_PAGE = original
    later = enqueue_job("email", {}, tenant_id="zed").job_id
    assert set(redis_client.zrange(f"{limited}:email:prioritized", 0, -1)) == set(others)
    assert redis_client.lrange(f"{limited}:email:fq:lim:held:zed", 0, -1) == [*early, later]
    resume_tenant("zed")  # a few at a time while it catches up; the loop releases the rest
    processed = [job_id for job_id, _ in drain_with_stock_worker(limited, "email", 13)]
    zed = [job_id for job_id in processed if job_id in set(early) | {later}]
    assert zed == [*early, later]
    # pausing created no row: the unknown tenant's level is still normal, not free's low
    assert not TenantPlan.objects.filter(tenant_id="zed").exists()


def test_wait_bound__a_held_job_is_not_overdue_while_its_tenant_is_at_its_limit(limited, settings):
    from fairqueue import conf
    from fairqueue.rebalance.passes import rebalance_queue

    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "MAX_WAIT_MS": 1}
    conf.reload_settings()
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme")
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="beta")
    time.sleep(2.1)  # overdue is counted to the second
    result = rebalance_queue("email")
    # the 2 takeable ones of acme and beta's 2 wait against the bound; acme's 3 held do not
    assert result.overdue == 4
    assert result.held == 3


def test_resume__the_backlog_drains_a_few_at_a_time_and_new_jobs_queue_behind_it(fq_prefix):
    from fairqueue.scheduling.limits import CATCHUP_AHEAD

    pause_tenant("zed")
    other = enqueue_job("email", {}, tenant_id="beta").job_id  # another tenant's job waits
    backlog = [j.job_id for j in enqueue_jobs("email", [{} for _ in range(10)], tenant_id="zed")]
    assert resume_tenant("zed") == CATCHUP_AHEAD  # not the whole backlog ahead of others
    newer = enqueue_job("email", {}, tenant_id="zed").job_id  # behind its held jobs
    assert counts(fq_prefix)["delayed"] == 10 - CATCHUP_AHEAD + 1
    (state,) = get_sync_broker().run(get_sync_broker().broker.limits.status, "email").tenants
    assert state.catching_up and state.held == 10 - CATCHUP_AHEAD + 1
    order = []
    while len(order) < 12:
        order += [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 1)]
        release()  # what the loop does every 20 ms
    assert [job_id for job_id in order if job_id != other] == [*backlog, newer]
    assert release().held == 0
    client = get_sync_broker()._client()
    assert not client.exists(f"{fq_prefix}:email:fq:lim:catchup")  # caught up: back to normal


def test_max_waiting__a_batch_of_several_chunks_is_refused_whole(capped, redis_client):
    TenantPlan.objects.filter(tenant_id="acme").update(max_waiting=400)
    from fairqueue.enqueue.lookups import forget_tenant_plan

    forget_tenant_plan("acme")
    before = snapshot(capped, redis_client)
    with pytest.raises(TenantBacklogFullError):
        enqueue_jobs("email", [{} for _ in range(399)], tenant_id="acme")  # 2 + 399 > 400
    assert snapshot(capped, redis_client) == before  # not even its first chunk of 250


@pytest.mark.django_db(transaction=True)
def test_admin_edit__raising_max_active_releases_held_jobs_at_once(limited):
    enqueue_jobs("email", [{} for _ in range(6)], tenant_id="acme")
    assert counts(limited)["delayed"] == 4
    plan = TenantPlan.objects.get(tenant_id="acme")
    plan.max_active = 5
    plan.save()  # committed: its limits go to Redis and what has room is released
    found = counts(limited)
    assert (found["prioritized"], found["delayed"]) == (5, 1)


@pytest.mark.django_db(transaction=True)
def test_admin_edit__a_first_limit_holds_the_backlog_added_before_it(fq_prefix, redis_client):
    """A tenant without limits has 8 takeable jobs; an admin gives it max_active 2: its
    backlog is held too (the two with room released at once), nobody else's moves."""
    plan = TenantPlan.objects.create(tenant_id="late", plan_tier="pro")
    wire_tenant_plan_lookup()
    early = [j.job_id for j in enqueue_jobs("email", [{} for _ in range(8)], tenant_id="late")]
    other = [j.job_id for j in enqueue_jobs("email", [{} for _ in range(3)], tenant_id="beta")]
    assert counts(fq_prefix)["prioritized"] == 11
    plan.max_active = 2
    plan.save()  # committed: its limits go to Redis, its backlog is held
    waiting = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)
    assert set(waiting) == {*other, *early[:2]}
    assert redis_client.lrange(f"{fq_prefix}:email:fq:lim:held:late", 0, -1) == early[2:]
    plan.max_active = 3
    plan.save()  # limits changed, not new: nothing scanned again, one more released
    assert redis_client.llen(f"{fq_prefix}:email:fq:lim:held:late") == 5


def test_takeable_cap__a_big_backlog_of_a_limited_tenant_waits_held(fq_prefix):
    """A max_waiting-only tenant's jobs pass through the held state; at most TAKEABLE_CAP
    of them are takeable at once, so the sets each release step checks stay small."""
    from fairqueue.scheduling.limits import TAKEABLE_CAP

    TenantPlan.objects.create(tenant_id="big", plan_tier="pro", max_waiting=10_000)
    wire_tenant_plan_lookup()
    enqueue_jobs("email", [{} for _ in range(TAKEABLE_CAP + 50)], tenant_id="big")
    settle_releases()  # (the add's own release call stops at its time budget)
    found = counts(fq_prefix)
    assert (found["prioritized"], found["delayed"]) == (TAKEABLE_CAP, 50)
    finished, _ = run_stock_worker(fq_prefix, 60)
    assert settle_releases() == 50  # room again: the rest go
    assert counts(fq_prefix)["delayed"] == 0


def test_release__places_by_the_brokers_fairness_mode(fq_prefix, redis_client, settings):
    """With FAIRNESS_BY="jobs" a resumed tenant's released jobs are a turn apart, as the
    add script places them, whatever the flow's measured cost (which only "time" counts)."""
    from fairqueue import conf

    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "FAIRNESS_BY": "jobs"}
    conf.reload_settings()
    for queue, tenant in (("email", "acme"), ("report", "ctrl")):
        # A flow measured at 16 times the queue's typical run time.
        redis_client.hset(
            f"{fq_prefix}:{queue}:fq:state", mapping={"typ": 10, f"c:normal\n{tenant}": 160}
        )
    pause_tenant("acme")
    held = [enqueue_job("email", {"n": n}, tenant_id="acme").job_id for n in range(3)]
    added = [enqueue_job("report", {"n": n}, tenant_id="ctrl").job_id for n in range(3)]
    assert resume_tenant("acme") == 3

    def gaps(queue, ids):
        scores = [redis_client.zscore(f"{fq_prefix}:{queue}:prioritized", i) for i in ids]
        return [b - a for a, b in zip(scores, scores[1:], strict=False)]

    assert gaps("email", held) == gaps("report", added)


def test_rebuild_failures__logged_when_they_start_and_end_not_at_every_pass(
    fq_prefix, monkeypatch, caplog
):
    import logging

    from fairqueue import tenants

    def broken(*args, **kwargs):
        raise RuntimeError("database down")

    working = tenants.database_limits
    monkeypatch.setattr(tenants, "_REBUILD_FAILING", set())  # other tests' failures
    monkeypatch.setattr(tenants, "database_limits", broken)
    caplog.set_level(logging.WARNING, logger="fairqueue.tenants")
    assert [tenants.keep_tenant_limits("email", force=True) for _ in range(3)] == [False] * 3
    assert [r.getMessage() for r in caplog.records] == [
        "tenant limits not rebuilt (RuntimeError); trying again at every pass"
    ]
    monkeypatch.setattr(tenants, "database_limits", working)
    assert tenants.keep_tenant_limits("email", force=True) is True
    assert caplog.records[-1].getMessage() == "tenant limits rebuilt again after failing"
