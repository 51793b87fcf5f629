"""Estimates see accounts: ``job_status``'s read gives a waiting job's account (its
flow's) and a held job's (its held meta's) with the account's weight, which its
entitlement now (``level_share``) is computed in; a tenant of no account has none
(real Redis and database)."""

from __future__ import annotations

import pytest

from fairqueue.broker import get_sync_broker
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.enqueue.priority import wire_tenant_plan_lookup
from fairqueue.enqueue.status import job_status
from fairqueue.models import Account, TenantPlan
from fairqueue.tenants import pause_tenant
from tests.helpers.jobs import write_history

pytestmark = pytest.mark.django_db


def _raw(job_id: str):
    sync = get_sync_broker()
    return sync.run(sync.broker.status.job_status, "email", job_id)


def test_job_status__reads_a_waiting_and_a_held_jobs_account(fq_prefix, redis_client):
    acct = Account.objects.create(account_id="acct", weight=3, plan_tier="pro")
    for tenant in ("a1", "a2"):
        TenantPlan.objects.create(tenant_id=tenant, account=acct)
    TenantPlan.objects.create(tenant_id="solo", plan_tier="pro")
    wire_tenant_plan_lookup()
    pause_tenant("a2", actor="test")
    jobs = {
        t: enqueue_jobs("email", [{} for _ in range(4)], tenant_id=t) for t in ("a1", "a2", "solo")
    }
    waiting, held, alone = (_raw(jobs[t][-1].job_id) for t in ("a1", "a2", "solo"))
    assert (waiting.state, waiting.account) == ("waiting", ("acct", 3.0))
    assert (held.state, held.account) == ("held", ("acct", 3.0))
    assert (alone.state, alone.account) == ("waiting", None)
    # with a rate measured, each has an entitlement now, between 0 and 1 of its level
    level = jobs["a1"][0].level
    write_history(redis_client, fq_prefix, {(level, t): 1.0 for t in ("a1", "solo")})
    for tenant in ("a1", "a2", "solo"):
        share = job_status("email", jobs[tenant][-1].job_id).estimate.level_share
        assert share is not None and 0 < share <= 1, tenant
