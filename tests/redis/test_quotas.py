"""Quotas per plan: worker seconds per day or month, demote or hold over it, audited and
counted, back to normal when the period rolls over (a settable clock; docs/usage.md)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time

import pytest

from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.enqueue.priority import resolve_priority, wire_tenant_plan_lookup
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.rebalance.usage_step import UsageStep
from fairqueue.usage import holds, quotas
from tests.helpers import metric
from tests.helpers.usage import Gate, gated_worker, one_slot_worker, until_true, work_jobs

# Timing-sensitive (live workers, loops): `make test` runs them after the parallel part.
pytestmark = pytest.mark.serial


@pytest.fixture
def clock():
    yield holds.set_clock
    holds.set_clock(None)


def _settle():
    for _ in range(5):
        if rebalance_queue("email", rebalancer="quota-test").recorded == 0:
            break
    return UsageStep().run("email")


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["hold", "demote"])
def test_quota__over_it_the_tier_action_applies_audited_and_counted_until_the_day_ends(
    fq_prefix, redis_client, settings, clock, action
):
    from fairqueue import conf
    from fairqueue.models import HoldAudit, TenantHold, TenantPlan

    settings.FAIRQUEUE = {
        **settings.FAIRQUEUE,
        "QUOTAS": {"free": {"worker_seconds": 1, "period": "day", "action": action}},
    }
    conf.reload_settings()
    TenantPlan.objects.create(tenant_id="acme", plan_tier="free")
    TenantPlan.objects.create(tenant_id="beta", plan_tier="pro")
    wire_tenant_plan_lookup()
    rebalance_queue("email", rebalancer="quota-test")
    enqueue_jobs("email", [{"i": i} for i in range(6)], tenant_id="acme")
    before = metric("queue_fair_quota_exceeded_total", job_type="email", action=action)
    asyncio.run(work_jobs(fq_prefix, "email", 6, [], job_s=0.25))
    _settle()
    hold = TenantHold.objects.get(tenant_id="acme", lifted_at__isnull=True)
    assert (hold.reason, hold.action) == ("quota", action)
    assert metric("queue_fair_quota_exceeded_total", job_type="email", action=action) == before + 1
    audit = HoldAudit.objects.get(tenant_id="acme", event="exceeded")
    assert audit.actor == "fairqueue quotas" and "quota 1 s a day" in audit.why
    paused = f"{fq_prefix}:email:fq:lim:paused"
    if action == "hold":
        assert redis_client.hexists(paused, "acme")
    else:
        assert not redis_client.hexists(paused, "acme")
        assert resolve_priority(tenant_id="acme").level.value == "low"
    assert resolve_priority(tenant_id="beta").level.value == "normal"
    assert [row["tenant_id"] for row in quotas.quota_status()] == ["acme"]
    # The next day: the period ended, the tenant is back to normal.
    clock(lambda: dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    assert quotas.expire() == 1
    assert not TenantHold.objects.filter(lifted_at__isnull=True).exists()
    assert HoldAudit.objects.filter(tenant_id="acme", event="period_ended").count() == 1
    assert not redis_client.hexists(paused, "acme")
    assert resolve_priority(tenant_id="acme").level.value == "low"  # free: low by plan
    assert not quotas.is_demoted("acme")


@pytest.mark.django_db
def test_quota__a_held_tenant_stays_held_through_an_operator_resume_until_lifted(
    fq_prefix, redis_client, settings
):
    from fairqueue import conf, resume_tenant
    from fairqueue.models import TenantPlan

    settings.FAIRQUEUE = {
        **settings.FAIRQUEUE,
        "QUOTAS": {"pro": {"worker_seconds": 1, "action": "hold"}},
    }
    conf.reload_settings()
    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro", quota_worker_seconds=5)
    plan = TenantPlan.objects.get(tenant_id="acme")
    assert quotas.quota_of(plan) == quotas.Quota(5, "day", "hold")  # the tenant's value wins
    quotas.exceed("acme", quotas.quota_of(plan), 6_000, job_type="email")
    paused = f"{fq_prefix}:email:fq:lim:paused"
    assert redis_client.hexists(paused, "acme")
    resume_tenant("acme", actor="ops")
    assert redis_client.hexists(paused, "acme")  # the quota still holds it
    assert quotas.lift_quota("acme", actor="ops", source="paid for more")
    assert not redis_client.hexists(paused, "acme")


@contextlib.contextmanager
def _stock_worker(prefix, seen, job_s=0.0):
    """A stock worker (one slot) in a thread of its own, the database left to this one;
    ``seen``: (level, ms run) of each attempt."""

    async def process(job, token):
        started = time.monotonic()
        if job_s:
            await asyncio.sleep(job_s)
        seen.append((job.data.get("priorityLevel"), (time.monotonic() - started) * 1000))

    with one_slot_worker(prefix, process):
        yield


def _one_job_at_a_time(prefix, redis_client, seen, *, most=40):
    """The tenant's 0.2 s jobs sent one at a time, the loop's steps run after each ends,
    until its quota acts."""
    from fairqueue.models import TenantHold

    def ended(job_id):
        key = f"{prefix}:email:{job_id}"
        return redis_client.hexists(key, "finishedOn") or not redis_client.exists(key)

    with _stock_worker(prefix, seen, job_s=0.2):
        for _ in range(most):
            (job,) = enqueue_jobs("email", [{"i": 0}], tenant_id="acme")
            assert until_true(lambda job_id=job.job_id: ended(job_id))
            _settle()
            if TenantHold.objects.filter(tenant_id="acme", lifted_at__isnull=True).exists():
                return


def _drain(prefix, count, seen):
    with _stock_worker(prefix, seen):
        assert until_true(lambda: len(seen) >= count, release=True)


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["hold", "demote"])
def test_quota__a_tenant_gets_its_quota_and_at_most_one_job_more_then_all_of_it_next_day(
    fq_prefix, redis_client, settings, clock, action
):
    """A 3 s daily quota of 0.2 s jobs: the tenant runs no more than 3 s plus one job at
    its own level before the action applies; the next day it is back to normal."""
    from fairqueue import conf
    from fairqueue.models import HoldAudit, TenantHold, TenantPlan, TenantUsage

    settings.FAIRQUEUE = {
        **settings.FAIRQUEUE,
        "QUOTAS": {"pro": {"worker_seconds": 3, "period": "day", "action": action}},
    }
    conf.reload_settings()
    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro")  # normal by plan
    wire_tenant_plan_lookup()
    rebalance_queue("email", rebalancer="quota-test")
    seen: list = []
    _one_job_at_a_time(fq_prefix, redis_client, seen)
    hold = TenantHold.objects.get(tenant_id="acme", lifted_at__isnull=True)
    assert hold.action == action
    ledger_ms = sum(
        TenantUsage.objects.filter(tenant_id="acme").values_list("worker_ms", flat=True)
    )
    assert ledger_ms >= 3_000  # over it by the ledger's count, and not before
    assert {level for level, _ in seen} == {"normal"}
    ran = [ms for _, ms in seen]
    assert sum(ran) <= 3_000 + max(ran), (sum(ran), ran)
    assert sum(ran[:-1]) < 3_000  # the job before the last: not over yet
    # Over it: held, or sent at low.
    jobs = enqueue_jobs("email", [{"i": 1}, {"i": 2}], tenant_id="acme")
    if action == "hold":
        assert redis_client.llen(f"{fq_prefix}:email:fq:lim:held:acme") == 2
    else:
        assert {job.level.value for job in jobs} == {"low"}
        after: list = []
        _drain(fq_prefix, 2, after)
        assert [level for level, _ in after] == ["low", "low"]
    # The next day: back to normal, its held jobs run, nothing over quota.
    clock(lambda: dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    _settle()
    hold.refresh_from_db()
    assert hold.lifted_at is not None
    assert HoldAudit.objects.filter(tenant_id="acme", event="period_ended").count() == 1
    assert not redis_client.hexists(f"{fq_prefix}:email:fq:lim:paused", "acme")
    (job,) = enqueue_jobs("email", [{"i": 3}], tenant_id="acme")
    assert job.level.value == "normal"
    later: list = []
    _drain(fq_prefix, 3 if action == "hold" else 1, later)
    assert later[-1][0] == "normal"
    _settle()
    assert not TenantHold.objects.filter(tenant_id="acme", lifted_at__isnull=True).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["hold", "demote"])
def test_quota__counts_running_attempts_so_it_acts_while_the_crossing_job_still_runs(
    fq_prefix, redis_client, settings, action
):
    """A 2 s daily quota, one worker slot, jobs the test ends. Job 1 runs 0.8 s; job 2
    starts: 0.8 s ended, not over. The loop's check between its steps comes when job 2's
    running time can reach the quota and acts then, while job 2 still runs: no job after
    it runs at the tenant's level, so it gets at most its quota and one job more. (With
    ended time only, nothing acted before job 2 ended, and with a backlog job 3 ran too.)"""
    from fairqueue import conf
    from fairqueue.models import TenantHold, TenantPlan

    settings.FAIRQUEUE = {
        **settings.FAIRQUEUE,
        "QUOTAS": {"pro": {"worker_seconds": 2, "period": "day", "action": action}},
    }
    conf.reload_settings()
    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro")  # normal by plan
    wire_tenant_plan_lookup()
    quotas.watch.clear()
    rebalance_queue("email", rebalancer="quota-test")
    backlog = 4 if action == "hold" else 2
    jobs = enqueue_jobs("email", [{"i": i} for i in range(backlog)], tenant_id="acme")
    gate = Gate()
    step = UsageStep()

    def held():
        return TenantHold.objects.filter(tenant_id="acme", lifted_at__isnull=True).exists()

    with gated_worker(fq_prefix, gate):
        assert until_true(lambda: gate.started == [jobs[0].job_id])
        time.sleep(0.8)
        gate.finish(jobs[0].job_id)
        assert until_true(lambda: len(gate.started) == 2)
        _settle()  # job 1's 0.8 s ended, job 2 just started: watched, not over
        assert not held()
        assert len(quotas.watch) == 1
        for _ in range(200):  # the loop's checks between steps, at their predicted time
            time.sleep(max(0.0, step.quota_due_in_s()))
            step.check_running()
            if held():
                break
        assert held()
        assert gate.started == [jobs[0].job_id, jobs[1].job_id]  # job 2 still runs
        assert not gate.seen[1:]
        if action == "demote":
            (late,) = enqueue_jobs("email", [{"i": 9}], tenant_id="acme")
            assert late.level.value == "low"
        gate.finish(jobs[1].job_id)
        assert until_true(lambda: len(gate.seen) == 2)
        _settle()
        if action == "hold":  # the backlog stays held: nothing more starts
            assert until_true(
                lambda: redis_client.llen(f"{fq_prefix}:email:fq:lim:held:acme") == backlog - 2,
                release=True,
            )
        else:  # the rest runs, at low if sent after the demotion
            assert until_true(lambda: len(gate.started) == 3)
            gate.finish(gate.started[2])
            assert until_true(lambda: len(gate.seen) == 3)
    mine = [ms for level, ms in gate.seen if level == "normal"]
    assert len(mine) == 2
    assert sum(mine) <= 2_000 + max(mine)  # its quota and at most one job more
    assert sum(mine[:-1]) < 2_000  # the job that crossed it was its last at its level
