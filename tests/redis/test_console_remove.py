"""The console's "remove its waiting jobs" under a busy stock Node worker: every job is
checked and removed in one script step, so a job the worker took after the ids were
listed is never deleted (its record and result stay), and the count said is exactly the
jobs removed unrun."""

from __future__ import annotations

import re

import pytest
from django.contrib.messages import get_messages

from fairqueue.broker import get_sync_broker
from fairqueue.broker.console_reads import ConsoleReads
from fairqueue.dashboard.tenant_routes import tenant_url
from fairqueue.enqueue.api import enqueue_jobs
from tests.helpers import wait_until
from tests.helpers.node import NodeWorker

pytestmark = pytest.mark.django_db


def test_tenant_remove__under_a_busy_worker_deletes_no_job_that_ran_and_counts_exactly(
    node,  # noqa: F811
    fq_prefix,
    operator,
    redis_client,
):
    jobs = enqueue_jobs("email", [{"i": i} for i in range(1_500)], tenant_id="acme")
    ids = {job.job_id for job in jobs}
    completed_key = f"{fq_prefix}:email:completed"
    worker = NodeWorker(node, fq_prefix, concurrency=8, run_ms=6_000, job_ms=15)
    assert wait_until(lambda: redis_client.zcard(completed_key) >= 50, 20)
    response = operator.post(tenant_url("acme", "remove"))
    said = [str(m) for m in get_messages(response.wsgi_request)]
    ran = {start.job_id for start in worker.starts()}
    completed = set(redis_client.zrange(completed_key, 0, -1))
    assert ran == completed  # every job that ran completed, and kept its record
    assert all(redis_client.exists(f"{fq_prefix}:email:{job_id}") for job_id in ran)
    gone = {job_id for job_id in ids if not redis_client.exists(f"{fq_prefix}:email:{job_id}")}
    assert not gone & ran
    assert len(gone) + len(ran) == 1_500  # nothing left waiting, nothing lost
    found = re.search(r"Removed (\d+) waiting or held job\(s\) of acme", said[0])
    assert found and int(found.group(1)) == len(gone), said
    assert len(gone) > 0


def test_remove_waiting__leaves_started_and_ended_jobs_and_reports_them(fq_prefix, redis_client):
    """The script alone: of five listed jobs, one completed, one running (locked) and one
    gone are left as they are; the two still waiting (one held) are removed."""
    from fairqueue import pause_tenant
    from tests.helpers import run_stock_worker

    jobs = enqueue_jobs("email", [{"i": i} for i in range(2)], tenant_id="acme")
    run_stock_worker(fq_prefix, 2, concurrency=1, job_s=0.0)
    done, running = (job.job_id for job in jobs)
    redis_client.set(f"{fq_prefix}:email:{running}:lock", "token")  # as if a worker held it
    redis_client.zrem(f"{fq_prefix}:email:completed", running)
    waiting = enqueue_jobs("email", [{}], tenant_id="acme")[0].job_id
    pause_tenant("acme")
    held = enqueue_jobs("email", [{}], tenant_id="acme")[0].job_id
    assert redis_client.lrange(f"{fq_prefix}:email:fq:lim:held:acme", 0, -1) == [waiting, held]
    sync = get_sync_broker()
    reads = ConsoleReads(sync.broker.conn)
    result = sync.run(
        reads.remove_waiting, "email", "acme", [done, running, "no-such-job", waiting, held]
    )
    assert (result.removed, result.started, result.gone, result.kept) == (2, 2, 1, 0)
    assert redis_client.exists(f"{fq_prefix}:email:{done}")
    assert redis_client.zscore(f"{fq_prefix}:email:completed", done) is not None
    assert redis_client.exists(f"{fq_prefix}:email:{running}")
    assert not redis_client.exists(f"{fq_prefix}:email:{waiting}")
    assert not redis_client.exists(f"{fq_prefix}:email:{held}")
    assert redis_client.llen(f"{fq_prefix}:email:fq:lim:held:acme") == 0
    assert redis_client.zcard(f"{fq_prefix}:email:delayed") == 0
    events = redis_client.xrange(f"{fq_prefix}:email:events")
    removed = [e[1]["jobId"] for e in events if e[1].get("event") == "removed"]
    assert removed == [waiting, held]
