"""Faults for usage, quotas and the breaker (docs/usage.md, "Under faults"): a tenant
failing by stalls, a Redis restart with a breaker open, a loop killed between the ledger
write and its flush, re-weighting while enqueues and the loop run, a quota period
rolling over with a job straddling it, and the loop's clock against Redis's. Real Redis,
the real bullmq package, stock Node workers where other workers matter."""

from __future__ import annotations

import datetime as dt
import signal
import threading
import time

import pytest

from fairqueue import conf
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.rebalance.usage_step import UsageStep
from fairqueue.scheduling.attempt_events import Event, Start
from fairqueue.scheduling.usage import day_of, page_usage
from fairqueue.usage import breaker, holds, quotas
from tests.helpers import wait_until
from tests.helpers.node import NodeWorker, active_ids
from tests.helpers.processes import running_loop
from tests.helpers.usage import breaker_hold, poison, run_jobs

BREAKER = {"ENABLED": True, "WINDOW_S": 600, "MIN_JOBS": 3, "FAILURE_RATIO": 0.9}


def _arm(settings, **more):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "BREAKER": dict(BREAKER, COOL_OFF_S=60, **more)}
    conf.reload_settings()
    breaker.windows.clear()


def _counted_failures(redis_client, prefix: str) -> int:
    """The failed attempts the history step has counted in today's ledger rows (stat
    ``f``; docs/usage.md)."""
    day = redis_client.keys(f"{prefix}:email:fq:use:2*")
    rows = redis_client.hgetall(day[0]) if day else {}
    return sum(int(count) for field, count in rows.items() if field.startswith("f:"))


def _settle():
    for _ in range(5):
        if rebalance_queue("email", rebalancer="fault-test").recorded == 0:
            break
    return UsageStep().run("email")


@pytest.fixture
def clean_breaker():
    breaker.windows.clear()
    yield
    holds.set_clock(None)
    breaker.windows.clear()


# -- a tenant failing by stalls ------------------------------------------------------------


@pytest.mark.serial  # a subprocess or a live loop against a deadline
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_fault__a_tenant_whose_jobs_kill_their_worker_opens_the_breaker(
    node,  # noqa: F811
    fq_prefix,
    settings,
    redis_client,
    clean_breaker,
):
    """'poison''s jobs kill their worker (kill -9 while they run): BullMQ's stalled-job
    check puts them back, no attempt ever fails or completes. The ledger counts those
    attempts as lost and the breaker as failures: it opens, and holds the next ones.
    (Counting only failed jobs, it never saw them.)"""
    from fairqueue.models import TenantUsage

    _arm(settings)
    rebalance_queue("email", rebalancer="fault-test")  # the history's cursor starts here
    jobs = enqueue_jobs("email", [{"i": i} for i in range(3)], tenant_id="poison", attempts=5)
    ids = {job.job_id for job in jobs}
    dying = NodeWorker(node, fq_prefix, run_ms=60_000, job_ms=60_000)
    assert wait_until(lambda: ids <= set(active_ids(redis_client, fq_prefix)), 15)
    dying.process.send_signal(signal.SIGKILL)
    dying.process.communicate(timeout=10)
    for job_id in ids:  # their locks would expire in 30 s
        redis_client.delete(f"{fq_prefix}:email:{job_id}:lock")

    def lost() -> int:
        _settle()
        row = TenantUsage.objects.filter(tenant_id="poison").first()
        return 0 if row is None else sum(v[7] for v in row.segments.values() if len(v) > 7)

    assert wait_until(lambda: lost() == 3, 30, 0.3)
    row = TenantUsage.objects.get(tenant_id="poison")
    assert (row.attempts, row.completed, row.failed) == (3, 0, 0)
    hold = breaker_hold()
    assert hold is not None and hold.lifted_at is None
    # its jobs put back are held, not run again
    assert redis_client.hexists(f"{fq_prefix}:email:fq:lim:paused", "poison")
    assert wait_until(lambda: redis_client.llen(f"{fq_prefix}:email:fq:lim:held:poison") == 3, 10)


# -- a Redis restart with breakers open ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_fault__redis_restarted_empty_with_a_breaker_open_still_holds_until_closed(
    tmp_path, settings, clean_breaker
):
    """A breaker is open on 'poison' when Redis (no persistence) is killed -9 and starts
    empty: the rebuild from the database (the loop's, at its next pass) pauses 'poison'
    again, so its new jobs are held; a probe after the cool-off and a close by hand
    still work."""
    import redis

    from fairqueue.broker import close_brokers
    from fairqueue.tenants import rebuild_tenant_limits
    from tests.helpers import PrivateRedis

    server = PrivateRedis(tmp_path, aof=False).start()
    prefix = "fqtest-breaker-restart"
    settings.FAIRQUEUE = {
        "PREFIX": prefix,
        "QUEUES": {"email": "email"},
        "REDIS_URL": server.url,
        "BREAKER": dict(BREAKER, COOL_OFF_S=60),
    }
    conf.reload_settings()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        breaker.open_breaker("poison", "email", 0, 10, config=conf.get_settings().breaker)
        assert client.hget(f"{prefix}:email:fq:lim:paused", "poison") == "1"
        server.restart()  # empty
        close_brokers()
        assert rebuild_tenant_limits(force=False)  # what the loop's pass does
        assert client.hget(f"{prefix}:email:fq:lim:paused", "poison") == "1"
        new = enqueue_jobs("email", [{}, {}], tenant_id="poison")
        assert client.lrange(f"{prefix}:email:fq:lim:held:poison", 0, -1) == [
            job.job_id for job in new
        ]
        # the cool-off ends: one job released as the probe, the other still held
        holds.set_clock(lambda: dt.datetime.now(dt.UTC) + dt.timedelta(seconds=61))
        breaker.after_write("email", breaker.Written())
        assert breaker_hold().state == "probe"
        assert client.llen(f"{prefix}:email:fq:lim:held:poison") == 1
        assert breaker.close_breaker("poison", actor="ops") == 1
        assert client.llen(f"{prefix}:email:fq:lim:held:poison") == 0
    finally:
        client.close()
        close_brokers()
        server.stop()
        conf.reload_settings()


# -- a loop killed between the ledger write and its flush ------------------------------------


@pytest.mark.django_db
def test_fault__a_loop_killed_after_the_database_write_before_the_flush_counts_nothing_twice(
    fq_prefix, settings, redis_client, monkeypatch, clean_breaker
):
    """The loop dies after the ledger's rows reached the database and before Redis's
    dirty set was flushed (a crash in mark_written). The next loop (its breaker windows
    empty: a new process) writes the same rows again: the database counts each attempt
    once, and the breaker counts them once too (the second write changes nothing), so
    no failure is counted twice; what the dead loop's window held is forgotten with it
    (it fills again within one window)."""
    from fairqueue.broker.usage_store import UsageStore
    from fairqueue.models import TenantUsage
    from fairqueue.usage.ledger import write_usage

    _arm(settings, MIN_JOBS=6)
    rebalance_queue("email", rebalancer="fault-test")
    enqueue_jobs("email", [{"i": i} for i in range(4)], tenant_id="poison")
    run_jobs(fq_prefix, 4, poison)
    # until the passes have heard every failure (BullMQ writes the last one after the
    # processor returned): its tenant's ledger row is then dirty
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rebalance_queue("email", rebalancer="fault-test")
        if _counted_failures(redis_client, fq_prefix) >= 4:
            break
        time.sleep(0.05)

    async def killed(self, queue, rows):
        raise RuntimeError("killed")  # the process dies here: the database has the rows

    assert redis_client.zcard(f"{fq_prefix}:email:fq:use:dirty") == 1
    monkeypatch.setattr(UsageStore, "mark_written", killed)
    with pytest.raises(RuntimeError, match="killed"):
        write_usage("email")  # the loop's write, cut before its flush
    monkeypatch.undo()
    assert TenantUsage.objects.get(tenant_id="poison").failed == 4
    assert redis_client.zcard(f"{fq_prefix}:email:fq:use:dirty") == 1  # still dirty
    breaker.windows.clear()  # a new loop process
    written = _settle()
    assert written.rows == 1 and [c.failed for c in written.changes] == [0]
    assert TenantUsage.objects.get(tenant_id="poison").failed == 4  # once
    assert redis_client.zcard(f"{fq_prefix}:email:fq:use:dirty") == 0
    # two more failures: 2 in the new window, not 4 + 2 (nothing counted twice)
    enqueue_jobs("email", [{"i": i} for i in range(2)], tenant_id="poison")
    run_jobs(fq_prefix, 2, poison)
    _settle()
    assert TenantUsage.objects.get(tenant_id="poison").failed == 6
    assert breaker_hold() is None  # 2 failures in the window: under MIN_JOBS=6


# -- re-weighting while enqueues and the loop run --------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_fault__reweighting_while_enqueues_and_the_loop_run_loses_and_doubles_no_job(
    fq_prefix, redis_client
):
    """A tenant's weight saved five times while another thread enqueues 1,200 jobs of it
    and of another tenant, with the loop running: every job is waiting exactly once,
    and the flow's weight is the last one saved."""
    from fairqueue.enqueue.priority import wire_tenant_plan_lookup
    from fairqueue.models import TenantPlan

    plan = TenantPlan.objects.create(tenant_id="acme", plan_tier="pro", weight=1)
    TenantPlan.objects.create(tenant_id="beta", plan_tier="pro")
    wire_tenant_plan_lookup()
    enqueued: list[str] = []
    errors: list[BaseException] = []

    def produce():
        from django.db import connections

        try:
            for _ in range(30):
                for tenant in ("acme", "beta"):
                    jobs = enqueue_jobs("email", [{} for _ in range(20)], tenant_id=tenant)
                    enqueued.extend(job.job_id for job in jobs)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    with running_loop():
        producer = threading.Thread(target=produce)
        producer.start()
        for weight in (5, 2, 9, 3, 7):
            plan.weight = weight
            plan.save(update_fields=["weight", "updated_at"])
            time.sleep(0.05)
        producer.join(60)
        time.sleep(0.5)  # the loop's next steps
    assert not errors, errors
    assert len(enqueued) == 1_200
    waiting = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)
    assert len(waiting) == len(set(waiting)) == 1_200
    assert set(waiting) == set(enqueued)
    assert redis_client.hget(f"{fq_prefix}:email:fq:fweights", "normal\nacme") == "7"


# -- a quota period rolling over with a job straddling it ------------------------------------


def test_fault__an_attempt_straddling_midnight_counts_its_time_on_the_day_it_ended():
    """Worker time counts on the UTC day its attempt ended (Redis's clock): an attempt
    started at 23:59:59.400 and ended at 00:00:00.600 adds its start to the old day and
    its 1.2 s to the new one, once."""
    midnight = int(dt.datetime(2026, 3, 2, tzinfo=dt.UTC).timestamp() * 1000)
    start = Start(level="normal", tenant="acme", ready_ms=midnight - 600, first_attempt=True)
    events = [Event("start", "1", midnight - 600), Event("end", "1", midnight + 600, ok=True)]
    use = page_usage(events, {"1": start}, {}, lambda job_id: "email")
    old, new = day_of(midnight - 1), day_of(midnight)
    row = "acme\nemail"
    assert use.increments == {
        (old, f"a:{row}"): 1,
        (old, f"w:{row}"): 0,
        (new, f"c:{row}"): 1,
        (new, f"t:{row}"): 1_200,
    }


@pytest.mark.django_db
def test_fault__a_quota_period_rolls_over_while_a_job_straddles_it(
    fq_prefix, settings, clean_breaker
):
    """'acme' is over its daily quota (hold) on day D; at midnight the hold ends
    (expire) and its jobs run again; a job straddling midnight has its whole time on
    D+1, which counts toward D+1's quota only: a 1 s quota is crossed again by it."""
    from fairqueue.models import HoldAudit, TenantHold, TenantPlan, TenantUsage

    settings.FAIRQUEUE = {
        **settings.FAIRQUEUE,
        "QUOTAS": {"free": {"worker_seconds": 1, "period": "day", "action": "hold"}},
    }
    conf.reload_settings()
    TenantPlan.objects.create(tenant_id="acme", plan_tier="free")
    day = dt.date(2026, 3, 1)
    before = dt.datetime(2026, 3, 1, 23, 59, 59, tzinfo=dt.UTC)
    holds.set_clock(lambda: before)
    TenantUsage.objects.create(
        tenant_id="acme", job_type="email", day=day, worker_ms=1_500, segments={}
    )
    quotas.exceed("acme", quotas.quota_of(TenantPlan.objects.get()), 1_500, job_type="email")
    assert redis_client_paused(fq_prefix, "acme")
    holds.set_clock(lambda: before + dt.timedelta(seconds=2))  # 00:00:01 on D+1
    assert quotas.expire() == 1
    assert not redis_client_paused(fq_prefix, "acme")
    assert quotas.used_ms("acme", "day") == 0  # D's time stays on D
    # the straddling attempt's 1.2 s lands on D+1 (the ledger's rule, above)
    TenantUsage.objects.create(
        tenant_id="acme", job_type="email", day=day + dt.timedelta(days=1), worker_ms=1_200,
        segments={},
    )  # fmt: skip
    assert quotas.used_ms("acme", "day") == 1_200
    quotas._check_changed({"acme": "email"})
    hold = TenantHold.objects.get(tenant_id="acme", lifted_at__isnull=True)
    assert hold.until == dt.datetime(2026, 3, 3, tzinfo=dt.UTC)
    assert HoldAudit.objects.filter(tenant_id="acme", event="exceeded").count() == 2


def redis_client_paused(prefix: str, tenant: str) -> bool:
    import redis

    from tests.helpers.keys import REDIS_URL

    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        return client.hget(f"{prefix}:email:fq:lim:paused", tenant) == "1"
    finally:
        client.close()


# -- the loop's clock against Redis's --------------------------------------------------------


@pytest.mark.django_db
def test_fault__the_loops_clock_hours_off_redis_still_opens_probes_and_closes(
    fq_prefix, settings, redis_client, clean_breaker
):
    """The loop's clock 3 hours ahead of Redis's: the breaker's window and cool-off are
    both on the loop's clock (the ledger's days and the attempts' times on Redis's), so
    a failing tenant still opens it, its probe comes after the cool-off by the loop's
    clock, and the probe's success closes it."""
    ahead = dt.timedelta(hours=3)
    holds.set_clock(lambda: dt.datetime.now(dt.UTC) + ahead)
    _arm(settings)
    rebalance_queue("email", rebalancer="fault-test")
    enqueue_jobs("email", [{"i": i} for i in range(4)], tenant_id="poison")
    run_jobs(fq_prefix, 4, poison)
    _settle()
    hold = breaker_hold()
    assert hold is not None and hold.state == "open"
    assert hold.until - hold.created_at == dt.timedelta(seconds=60)
    enqueue_jobs("email", [{"i": 9}], tenant_id="poison")
    holds.set_clock(lambda: dt.datetime.now(dt.UTC) + ahead + dt.timedelta(seconds=61))
    _settle()
    assert breaker_hold().state == "probe"
    run_jobs(fq_prefix, 1)  # the probe completes
    _settle()
    assert breaker_hold().lifted_at is not None
