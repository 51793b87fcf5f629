"""What the console tests share: the console's URL names and the functions that put a queue
in a known state (jobs aged, jobs failed by a stock BullMQ worker, a mix of levels and
tenants, a tenant of each kind the attention list names)."""

from __future__ import annotations

import asyncio
import json

from fairqueue.dashboard import stats as dashboard
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.models import TenantPlan
from fairqueue.tenants import pause_tenant
from tests.helpers import close_worker, wait_until
from tests.helpers.keys import REDIS_URL

#: The console's URL names.
DASHBOARD = "admin:fairqueue_dashboard_changelist"
QUEUE = "admin:fairqueue_dashboard_queue"
JOB = "admin:fairqueue_dashboard_job"
TENANT = "admin:fairqueue_dashboard_tenant"


def age_jobs(redis_client, prefix, queue, job_ids, by_ms):
    """Make jobs look enqueued and ready ``by_ms`` earlier (BullMQ's own timestamp and
    the first ready time fairqueue keeps in the job's opts)."""
    for job_id in job_ids:
        key = f"{prefix}:{queue}:{job_id}"
        redis_client.hset(key, "timestamp", int(redis_client.hget(key, "timestamp")) - by_ms)
        opts = json.loads(redis_client.hget(key, "opts"))
        if "fqReady" in opts:
            opts["fqReady"] -= by_ms
            redis_client.hset(key, "opts", json.dumps(opts))


def seed_mixed(n_per_level: int = 3) -> list:
    """Jobs of every level from a few tenants, enqueued in an interleaved order."""
    jobs = []
    for i in range(n_per_level):
        for level, tenant in (
            ("low", "t-a"),
            ("critical", "t-b"),
            ("normal", "t-c"),
            ("high", "t-a"),
        ):
            jobs.append(enqueue_job("email", {"i": i}, tenant_id=f"{tenant}", priority_level=level))
    return jobs


def fail_jobs(prefix: str, queue: str, count: int) -> None:
    """A stock BullMQ worker whose every job raises, until ``count`` have failed."""
    from bullmq import Worker

    async def run() -> None:
        seen: list[str] = []
        done = asyncio.Event()

        async def process(job, token):
            seen.append(job.id)
            if len(seen) >= count:
                done.set()
            raise ValueError("export broke: password=hunter2 at redis://user:pw@db.example")

        worker = Worker(queue, process, {"connection": REDIS_URL, "prefix": prefix})
        try:
            await asyncio.wait_for(done.wait(), 30)
        finally:
            await close_worker(worker)

    asyncio.run(run())


#: How many jobs :func:`seed_culprits`' flooding tenant has past the bound.
FLOOD = 8


def seed_culprits(prefix: str, redis_client) -> dict[str, list[str]]:
    """A failing tenant (6 jobs, each failed once for good), a flooding one (8 jobs past
    the bound), a limited one (acme: 2 at once, 5 jobs), a paused one, a quiet one and
    a delayed job; returns job ids by tenant."""
    doomed = enqueue_jobs("email", [{} for _ in range(6)], tenant_id="doomed", attempts=1)
    fail_jobs(prefix, "email", 6)
    assert wait_until(lambda: redis_client.zcard(f"{prefix}:email:failed") == 6, 10)
    flood = enqueue_jobs("email", [{} for _ in range(FLOOD)], tenant_id="flood")
    age_jobs(redis_client, prefix, "email", [j.job_id for j in flood], by_ms=600_000)
    acme = enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme")
    TenantPlan.objects.create(tenant_id="sleepy", plan_tier="pro")
    sleepy = enqueue_jobs("email", [{} for _ in range(2)], tenant_id="sleepy")
    pause_tenant("sleepy", actor="test", source="test")
    quiet = enqueue_jobs("email", [{}], tenant_id="quiet", priority_level="low")
    later = enqueue_job("email", {}, tenant_id="quiet", delay_ms=60_000)
    dashboard.clear_backlog_cache()
    return {
        "doomed": [j.job_id for j in doomed],
        "flood": [j.job_id for j in flood],
        "acme": [j.job_id for j in acme],
        "sleepy": [j.job_id for j in sleepy],
        "quiet": [j.job_id for j in quiet],
        "later": [later.job_id],
    }
