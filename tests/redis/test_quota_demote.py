"""A quota's ``demote`` holds on every enqueue path: a demoted tenant's jobs run at low
whatever level the call names (``priority_level=``, ``priority=``, ``@task(priority=)``),
single, batch, durable, async and through the tasks backend; an operator's audited
``priority_override=`` is the one way above it (docs/usage.md#quotas)."""

from __future__ import annotations

import asyncio
import json

import pytest

from fairqueue import conf
from fairqueue.enqueue.api import aenqueue_job, enqueue_job, enqueue_jobs
from fairqueue.enqueue.outbox import relay_outbox
from fairqueue.enqueue.priority import resolve_priority, wire_tenant_plan_lookup
from fairqueue.usage import quotas
from tests.helpers.tasks import record, record_critical

pytestmark = pytest.mark.django_db(transaction=True)


def _level(redis_client, prefix: str, job_id: str) -> str:
    data = json.loads(redis_client.hget(f"{prefix}:email:{job_id}", "data"))
    return str(data["priorityLevel"])


@pytest.fixture
def demoted(fq_prefix, settings):
    """'acme' (enterprise: critical by plan) over its quota with action demote; 'beta'
    (enterprise) under none."""
    from fairqueue.models import TenantPlan

    settings.FAIRQUEUE = {
        **settings.FAIRQUEUE,
        "QUOTAS": {"enterprise": {"worker_seconds": 1, "period": "day", "action": "demote"}},
    }
    conf.reload_settings()
    TenantPlan.objects.create(tenant_id="acme", plan_tier="enterprise")
    TenantPlan.objects.create(tenant_id="beta", plan_tier="enterprise")
    wire_tenant_plan_lookup()
    quotas.exceed("acme", quotas.Quota(1, "day", "demote"), 6_000, job_type="email")
    assert quotas.is_demoted("acme")
    yield fq_prefix
    quotas.forget_demoted()


def test_demote__every_enqueue_path_of_a_demoted_tenant_runs_at_low(demoted, redis_client):
    prefix = demoted
    plain = enqueue_job("email", {}, tenant_id="acme")
    named = enqueue_job("email", {}, tenant_id="acme", priority_level="high")
    numeric = enqueue_job("email", {}, tenant_id="acme", priority=1)
    batch = enqueue_jobs("email", [{}, {}], tenant_id="acme", priority_level="critical")
    batch_numeric = enqueue_jobs("email", [{}], tenant_id="acme", priority=1)
    by_async = asyncio.run(aenqueue_job("email", {}, tenant_id="acme", priority_level="critical"))
    task_plan = record.enqueue("plan", tenant_id="acme")
    task_critical = record_critical.enqueue("explicit", tenant_id="acme")  # priority=75
    jobs = [plain, named, numeric, *batch, *batch_numeric, by_async]
    assert [job.level.value for job in jobs] == ["low"] * len(jobs)
    ids = [job.job_id for job in jobs] + [task_plan.id, task_critical.id]
    assert [_level(redis_client, prefix, job_id) for job_id in ids] == ["low"] * len(ids)
    assert named.rule.value == "quota_demoted"
    # durable: low in the outbox row, and in Redis once relayed
    durable = enqueue_job("email", {}, tenant_id="acme", priority_level="high", durable=True)
    assert durable.level.value == "low"
    relay_outbox()
    assert _level(redis_client, prefix, durable.job_id) == "low"
    # a tenant no quota demotes keeps the level it names
    other = enqueue_job("email", {}, tenant_id="beta", priority_level="high")
    assert _level(redis_client, prefix, other.job_id) == "high"


def test_demote__an_operators_audited_override_is_the_one_way_above_it(demoted, redis_client):
    from fairqueue.models import PriorityOverrideAudit

    job = enqueue_job(
        "email", {}, tenant_id="acme", priority_override="critical", actor="ops", source="t"
    )
    assert job.level.value == "critical"
    assert _level(redis_client, demoted, job.job_id) == "critical"
    assert PriorityOverrideAudit.objects.filter(tenant_id="acme").count() == 1
    # the period ends: the tenant names its levels again
    quotas.lift_quota("acme", actor="ops", source="paid for more")
    quotas.forget_demoted()
    assert resolve_priority(tenant_id="acme", priority_level="high").level.value == "high"
