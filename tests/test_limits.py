"""Per-tenant limits with stock BullMQ workers: held jobs, their release, pause, the
backlog cap. Real Redis, the real bullmq package; each test its own prefix."""

from __future__ import annotations

import asyncio

import pytest
from bullmq import Queue, Worker

from fairqueue import enqueue_jobs
from fairqueue.broker import get_sync_broker
from fairqueue.enqueue.priority import wire_tenant_plan_lookup
from fairqueue.models import TenantPlan
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.django_db


def release(queue: str = "email", tenants=None):
    sync = get_sync_broker()
    return sync.run(sync.broker.limits.release, queue, tenants)


def counts(prefix: str, queue: str = "email") -> dict[str, int]:
    async def read():
        q = Queue(queue, {"connection": REDIS_URL, "prefix": prefix})
        try:
            return await q.getJobCounts("wait", "prioritized", "delayed", "active", "completed")
        finally:
            await q.close()

    return asyncio.run(read())


@pytest.fixture
def limited(fq_prefix):
    """Tenant 'acme' limited to 2 running jobs, 'beta' without limits, DB lookups wired."""
    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro", max_active=2)
    TenantPlan.objects.create(tenant_id="beta", plan_tier="pro")
    wire_tenant_plan_lookup()
    return fq_prefix


def test_jobs_beyond_max_active__are_delayed_in_bullmq_counts(limited):
    enqueue_jobs("email", [{"n": i} for i in range(10)], tenant_id="acme")
    enqueue_jobs("email", [{"n": i} for i in range(3)], tenant_id="beta")
    found = counts(limited)
    assert found["prioritized"] == 2 + 3
    assert found["delayed"] == 8
    assert found["wait"] == 0


def run_stock_worker(prefix, expect, *, concurrency=8, job_s=0.03, sample_ids=(), timeout_s=30):
    """A stock ``bullmq.Worker`` runs until ``expect`` jobs finished; meanwhile BullMQ's
    active list is sampled every 10 ms. Returns (finished ids in order, the most of
    ``sample_ids`` ever active at once)."""
    finished: list[str] = []
    sample_ids = set(sample_ids)

    async def main():
        import redis.asyncio as aioredis

        done = asyncio.Event()

        async def process(job, token):
            await asyncio.sleep(job_s)
            finished.append(job.id)
            if len(finished) >= expect:
                done.set()

        worker = Worker(
            "email",
            process,
            {"connection": REDIS_URL, "prefix": prefix, "concurrency": concurrency},
        )
        client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
        most = 0

        async def sample():
            nonlocal most
            while not done.is_set():
                active = await client.lrange(f"{prefix}:email:active", 0, -1)
                most = max(most, sum(1 for job_id in active if job_id in sample_ids))
                await asyncio.sleep(0.01)

        sampler = asyncio.ensure_future(sample())
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        finally:
            done.set()
            await sampler
            await worker.close()
            await client.aclose()
        return most

    most = asyncio.run(main())
    return finished, most


@pytest.fixture
def loop_running(limited):
    import threading

    from fairqueue.rebalance.loop import Rebalancer

    rebalancer = Rebalancer(["email"], interval_ms=1000, install_signal_handlers=False)
    thread = threading.Thread(target=rebalancer.run, daemon=True)
    thread.start()
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


def test_release_order__held_jobs_run_oldest_first_with_fair_tags(limited):
    acme = [job.job_id for job in enqueue_jobs("email", [{} for _ in range(6)], tenant_id="acme")]
    finished, _ = run_stock_worker(limited, 2, concurrency=1)
    assert finished == acme[:2]
    while release().held:
        run_stock_worker(limited, 1, concurrency=1)
    assert release().released == 0
