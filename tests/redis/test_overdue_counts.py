"""One overdue count: the pass's gauge, the dashboard and a count made straight from
BullMQ's sets agree, with held, delayed, retried and paused jobs present. Held and
delayed time is not waiting, and each waiting job has one entry in the ready-time index.
Real Redis, the real bullmq package, a stock bullmq worker; each test its own prefix."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis as redis_lib

from fairqueue import conf, enqueue_job, enqueue_jobs, pause_tenant, resume_tenant
from fairqueue.dashboard.stats import queue_stats
from fairqueue.enqueue.priority import wire_tenant_plan_lookup
from fairqueue.models import TenantPlan
from fairqueue.rebalance.passes import rebalance_queue
from tests.helpers import metric
from tests.helpers.jobs import index_ids
from tests.helpers.usage import take_jobs_failing_first

pytestmark = pytest.mark.django_db

BOUND_MS = 1_500


def overdue_from_bullmq(client: redis_lib.Redis, prefix: str, queue: str = "email") -> int:
    """Waiting jobs (BullMQ's wait list and prioritized set) ready longer than the bound
    ago, a job's ready time being its first release if its tenant's limit held it, else
    the first ready time in its opts, else its timestamp plus its delay."""
    (now_s, now_us) = client.time()
    cutoff = now_s * 1000 + now_us // 1000 - BOUND_MS
    ids = client.lrange(f"{prefix}:{queue}:wait", 0, -1)
    ids += client.zrange(f"{prefix}:{queue}:prioritized", 0, -1)
    overdue = 0
    for job_id in ids:
        timestamp, opts, released = client.hmget(
            f"{prefix}:{queue}:{job_id}", "timestamp", "opts", "fqRel"
        )
        parsed = json.loads(opts or "{}")
        ready = released or parsed.get("fqReady") or int(timestamp) + parsed.get("delay", 0)
        overdue += int(ready) < cutoff
    return overdue


def test_gauge_dashboard_and_bullmq_agree_with_held_delayed_retried_and_paused_jobs(
    fq_prefix, redis_client, settings
):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "MAX_WAIT_MS": BOUND_MS}
    conf.reload_settings()
    TenantPlan.objects.create(tenant_id="acme-counts", plan_tier="pro", max_active=1)
    wire_tenant_plan_lookup()

    # A job that fails once: BullMQ re-adds it; it keeps its first ready time.
    retried = enqueue_job("email", {}, tenant_id="flaky", attempts=2).job_id
    assert asyncio.run(take_jobs_failing_first(fq_prefix, 1, fail={retried})) == [retried]
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="busy")
    enqueue_jobs("email", [{} for _ in range(4)], tenant_id="acme-counts")  # 1 takeable, 3 held
    paused = [j.job_id for j in enqueue_jobs("email", [{}, {}], tenant_id="zed-counts")]
    assert pause_tenant("zed-counts") == 2
    for _ in range(2):
        enqueue_job("email", {}, tenant_id="later", delay_ms=60_000)
    time.sleep(3.6)  # past the bound, by whole seconds (the pass counts to the second)
    resume_tenant("zed-counts")  # released now: its paused time was not waiting

    result = rebalance_queue("email")
    stats = queue_stats("email")
    direct = overdue_from_bullmq(redis_client, fq_prefix)
    # flaky's retry, busy's 3 and acme's takeable one; not acme's held 3, not zed's 2,
    # not the delayed 2
    assert direct == 5
    assert result.overdue == direct
    assert metric("queue_fair_overdue_waiting", job_type="email") == direct
    by_level = {
        level: metric("queue_fair_level_overdue_waiting", queue="email", priority_level=level)
        for level in ("critical", "high", "normal", "low")
    }
    assert by_level == {"critical": 0, "high": 0, "normal": direct, "low": 0}
    assert stats["overdue_total"] == direct
    assert stats["levels"]["normal"]["overdue"] == direct
    assert all(stats["levels"][level]["overdue"] == 0 for level in ("critical", "high", "low"))
    rows = {row["job_id"]: row for row in stats["order"]["jobs"]}
    assert rows[retried]["overdue"] and not any(rows[job_id]["overdue"] for job_id in paused)

    indexed = [job_id for ids in index_ids(redis_client, fq_prefix).values() for job_id in ids]
    waiting = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)
    assert len(indexed) == len(set(indexed))  # one entry per job
    assert set(waiting) <= set(indexed)
