"""Quotas per plan: worker seconds per day or month, demote or hold over it, audited and
counted, back to normal when the period rolls over (a settable clock; docs/usage.md)."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from fairqueue import holds, quotas
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.enqueue.priority import resolve_priority, wire_tenant_plan_lookup
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.rebalance.usage_step import UsageStep
from tests.helpers import metric
from tests.redis.test_usage import _work


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
    asyncio.run(_work(fq_prefix, "email", 6, [], job_s=0.25))
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
