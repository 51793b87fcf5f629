"""Plain BullMQ on the wire: a stock Node ``bullmq`` worker runs fairqueue's jobs in the
fair order (tests/node holds the worker and its pinned package)."""

import json

import pytest

from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.rebalance.passes import rebalance_queue
from tests.helpers.jobs import add_foreign
from tests.helpers.node import run_node_worker

pytestmark = pytest.mark.django_db


def test_node_worker_runs_the_fair_order_with_the_pass_running(
    node_worker, fq_prefix, redis_client
):
    for _ in range(8):
        enqueue_jobs("email", [{}] * 4, tenant_id="a", priority_level="critical")
        enqueue_job("email", {}, tenant_id="b", priority_level="low")
        enqueue_jobs("email", [{}] * 2, tenant_id="c", priority_level="normal")
    (legacy,) = add_foreign(fq_prefix, ({"tenantId": "d"}, {}))  # priority 0: adopted
    assert rebalance_queue("email").adopted == 1
    expected = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)
    processed = run_node_worker(node_worker, fq_prefix, len(expected))
    assert processed == expected
    assert len(set(processed)) == 57 and legacy in processed
    levels = [
        # the adopted legacy job has no priorityLevel: priority 0 is normal
        json.loads(redis_client.hget(f"{fq_prefix}:email:{job_id}", "data")).get(
            "priorityLevel", "normal"
        )
        for job_id in processed[:15]
    ]
    # Tags up to 24: critical 3..24, normal 6..24 (and the adopted job at 12), low 12, 24.
    assert (levels.count("critical"), levels.count("normal"), levels.count("low")) == (8, 5, 2)


def test_node_worker_takes_tag_placed_jobs_interleaved_by_weight(node_worker, fq_prefix):
    crit = enqueue_jobs("email", [{} for _ in range(8)], priority_level="critical")
    low = enqueue_jobs("email", [{} for _ in range(2)], priority_level="low")
    c, lo = [job.job_id for job in crit], [job.job_id for job in low]
    assert run_node_worker(node_worker, fq_prefix, 10) == c[:4] + lo[:1] + c[4:] + lo[1:]


def test_node_worker_applies_fairqueue_retention(node_worker, settings, fq_prefix, redis_client):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "KEEP_COMPLETED": {"count": 3, "age": 3600}}
    jobs = enqueue_jobs("email", [{"n": n} for n in range(10)])
    assert len(run_node_worker(node_worker, fq_prefix, 10)) == 10
    kept = redis_client.zrange(f"{fq_prefix}:email:completed", 0, -1)
    assert set(kept) == {job.job_id for job in jobs[-3:]}
