"""Account quotas: worker seconds per period over all of an account's tenants, the tier's
action on every tenant of the account, audited and counted, lifted at the period's end;
a tenant's own quota and its account's both hold (real Redis and database)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest
from django.urls import reverse

from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.enqueue.priority import wire_tenant_plan_lookup
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.rebalance.usage_step import UsageStep
from fairqueue.usage import account_quotas, holds, quotas
from tests.helpers import metric
from tests.helpers.usage import Gate, gated_worker, until_true, work_jobs

pytestmark = [pytest.mark.serial, pytest.mark.django_db]


@pytest.fixture
def clock():
    yield holds.set_clock
    holds.set_clock(None)


def _settle():
    for _ in range(5):
        if rebalance_queue("email", rebalancer="account-quota-test").recorded == 0:
            break
    return UsageStep().run("email")


def _customers(settings, action):
    """Account 'acct' (tier 'free': no tenant quota, the tier's action) with a quota of
    1 worker second a day, owning 'a1' and 'a2'; 'solo' of no account."""
    from fairqueue import conf
    from fairqueue.models import Account, TenantPlan

    settings.FAIRQUEUE = {
        **settings.FAIRQUEUE,
        "QUOTAS": {"free": {"worker_seconds": None, "action": action}},
    }
    conf.reload_settings()
    acct = Account.objects.create(account_id="acct", plan_tier="free", quota_worker_seconds=1)
    TenantPlan.objects.create(tenant_id="a1", account=acct)
    TenantPlan.objects.create(tenant_id="a2", account=acct)
    TenantPlan.objects.create(tenant_id="solo", plan_tier="pro")
    wire_tenant_plan_lookup()
    return acct


@pytest.mark.parametrize("action", ["hold", "demote"])
def test_account_quota__its_tenants_together_over_it_all_get_the_action_until_the_day_ends(
    fq_prefix, redis_client, settings, clock, action, operator
):
    from fairqueue.models import HoldAudit, TenantHold

    acct = _customers(settings, action)
    assert account_quotas.account_quota_of(acct) == quotas.Quota(1, "day", action)
    rebalance_queue("email", rebalancer="account-quota-test")
    for tenant in ("a1", "a2"):  # 0.75 s each: neither over 1 s, together over it
        enqueue_jobs("email", [{"i": i} for i in range(3)], tenant_id=tenant)
    before = metric("queue_fair_quota_exceeded_total", job_type="email", action=action)
    asyncio.run(work_jobs(fq_prefix, "email", 6, [], job_s=0.25))
    _settle()
    assert account_quotas.account_used_ms("acct", "day") >= 1_500
    hold = TenantHold.objects.get(lifted_at__isnull=True)
    assert (hold.tenant_id, hold.reason, hold.action) == ("\nacct", "quota", action)
    assert metric("queue_fair_quota_exceeded_total", job_type="email", action=action) == before + 1
    audited = HoldAudit.objects.filter(event="exceeded")
    assert sorted(audited.values_list("tenant_id", flat=True)) == ["\nacct", "a1", "a2"]
    assert all("account acct" in a.why and "quota 1 s a day" in a.why for a in audited)
    paused = f"{fq_prefix}:email:fq:lim:paused"
    if action == "hold":
        assert redis_client.hexists(paused, "a1") and redis_client.hexists(paused, "a2")
        assert holds.holds_by_queue()["email"] == {"a1", "a2"}
    else:
        assert not redis_client.hexists(paused, "a1")
        assert quotas.is_demoted("a1") and quotas.is_demoted("a2")
    assert not redis_client.hexists(paused, "solo") and not quotas.is_demoted("solo")
    # the account page's line, and checked again: held once, not twice
    line = account_quotas.account_usage(acct)
    assert line["day_s"] >= 1.5 and line["month_s"] >= line["day_s"]
    assert (line["quota"]["state"], line["quota"]["action"]) == ("over", action)
    html = operator.get(reverse("admin:fairqueue_dashboard_account", args=["acct"])).content
    assert f"over: {action} on its tenants until" in html.decode()
    assert "/admin/fairqueue/tenantusage/?account=acct" in html.decode()
    (row,) = account_quotas.account_quota_status()
    assert (row["account_id"], row["state"], row["action"]) == ("acct", "over", action)
    overview = operator.get(reverse("admin:fairqueue_dashboard_changelist")).content.decode()
    assert 'data-fq-quota-account="acct">account acct</a>' in overview
    assert account_quotas.check_accounts({"a1": "email"}) == 0
    # The next day: the period ended, its tenants are back to normal.
    clock(lambda: dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    assert quotas.expire() == 0  # a tenant's quotas only
    assert account_quotas.expire_accounts() == 1
    assert not TenantHold.objects.filter(lifted_at__isnull=True).exists()
    ended = HoldAudit.objects.filter(event="period_ended").values_list("tenant_id", flat=True)
    assert sorted(ended) == ["\nacct", "a1", "a2"]
    assert not redis_client.hexists(paused, "a1") and not redis_client.hexists(paused, "a2")
    assert not quotas.is_demoted("a1")
    assert account_quotas.account_usage(acct)["quota"]["state"] == "within"


def test_account_quota__a_tenants_own_quota_and_its_accounts_both_hold_it(
    fq_prefix, redis_client, settings, django_capture_on_commit_callbacks
):
    from fairqueue import resume_tenant
    from fairqueue.models import TenantPlan

    acct = _customers(settings, "hold")
    TenantPlan.objects.filter(tenant_id="a1").update(quota_worker_seconds=5)
    own = quotas.quota_of(TenantPlan.objects.get(tenant_id="a1"))
    quotas.exceed("a1", own, 6_000, job_type="email")
    account_quotas.exceed_account(
        acct, account_quotas.account_quota_of(acct), 2_000, job_type="email"
    )
    paused = f"{fq_prefix}:email:fq:lim:paused"
    assert redis_client.hexists(paused, "a1") and redis_client.hexists(paused, "a2")
    resume_tenant("a2", actor="ops")
    assert redis_client.hexists(paused, "a2")  # its account's quota still holds it
    with django_capture_on_commit_callbacks(execute=True):  # a tenant joins it: held too
        TenantPlan.objects.create(tenant_id="a3", account=acct)
    assert redis_client.hexists(paused, "a3")
    assert quotas.lift_quota("a1", actor="ops", source="paid for more")
    assert redis_client.hexists(paused, "a1")  # lifting its own leaves its account's
    assert account_quotas.lift_account_quota("acct", actor="ops", source="raised")
    assert not redis_client.hexists(paused, "a1") and not redis_client.hexists(paused, "a2")
    assert not redis_client.hexists(paused, "a3")
    assert not account_quotas.lift_account_quota("acct")  # none in force now


def test_account_quota__counts_its_tenants_running_attempts_and_acts_while_one_still_runs(
    fq_prefix, redis_client, settings
):
    """A 2 s daily account quota, one worker slot, jobs the test ends: a1's job runs
    0.8 s, then a2's starts (0.8 s ended: watched, not over). The loop's check between
    its steps acts when a2's running time can take the account over, while a2's job
    still runs."""
    from fairqueue.models import Account, TenantHold

    _customers(settings, "hold")
    Account.objects.filter(account_id="acct").update(quota_worker_seconds=2)
    account_quotas.watch.clear()
    rebalance_queue("email", rebalancer="account-quota-test")
    (first,) = enqueue_jobs("email", [{"i": 1}], tenant_id="a1")
    (second,) = enqueue_jobs("email", [{"i": 2}], tenant_id="a2")
    gate = Gate()
    step = UsageStep()

    def held():
        return TenantHold.objects.filter(tenant_id="\nacct", lifted_at__isnull=True).exists()

    with gated_worker(fq_prefix, gate):
        assert until_true(lambda: gate.started == [first.job_id])
        time.sleep(0.8)
        gate.finish(first.job_id)
        assert until_true(lambda: len(gate.started) == 2)
        _settle()
        assert not held() and len(account_quotas.watch) == 1
        for _ in range(200):  # the loop's checks between steps, at their predicted time
            time.sleep(max(0.0, step.quota_due_in_s()))
            step.check_running()
            if held():
                break
        assert held()
        assert gate.started == [first.job_id, second.job_id] and not gate.seen[1:]
        paused = f"{fq_prefix}:email:fq:lim:paused"
        assert redis_client.hexists(paused, "a1") and redis_client.hexists(paused, "a2")
        gate.finish(second.job_id)
