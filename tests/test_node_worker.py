"""Plain BullMQ on the wire: a stock Node ``bullmq`` worker runs fairqueue's jobs in the
fair order (tests/node holds the worker and its pinned package)."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fairqueue.rebalance import rebalance_queue
from fairqueue.scheduler import order_pending_jobs
from fairqueue.services import enqueue_jobs
from tests.conftest import REDIS_URL
from tests.test_rebalance import pending_in_redis

NODE_DIR = Path(__file__).resolve().parent / "node"
pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def node_worker():
    node = shutil.which("node")
    installed = (NODE_DIR / "node_modules" / "bullmq").is_dir()
    if node is None or not installed:
        if os.environ.get("CI"):
            pytest.fail("node and tests/node/node_modules are required in CI (.ci/run installs)")
        pytest.skip("node or tests/node/node_modules missing (run: cd tests/node && npm ci)")
    return [node, str(NODE_DIR / "worker.mjs")]


def run_node_worker(node_worker, prefix, count):
    done = subprocess.run(
        [*node_worker, REDIS_URL, prefix, "email", str(count)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_node_worker_runs_the_fair_order(node_worker, fq_prefix, redis_client):
    for tenant, level, count in [("a", "critical", 20), ("b", "low", 6), ("c", "normal", 8)]:
        enqueue_jobs(
            "email", [{"n": i} for i in range(count)], tenant_id=tenant, priority_level=level
        )
    now = int(time.time() * 1000)
    expected = [
        item.job_id
        for item in order_pending_jobs(
            pending_in_redis(redis_client, fq_prefix), now_ms=now, max_wait_ms=300_000
        )
    ]
    rebalance_queue("email", now_ms=now)
    assert run_node_worker(node_worker, fq_prefix, len(expected)) == expected


def test_node_worker_takes_tag_placed_jobs_interleaved_by_weight(node_worker, fq_prefix):
    crit = enqueue_jobs("email", [{} for _ in range(8)], priority_level="critical")
    low = enqueue_jobs("email", [{} for _ in range(2)], priority_level="low")
    c, lo = [job.job_id for job in crit], [job.job_id for job in low]
    assert run_node_worker(node_worker, fq_prefix, 10) == c[:4] + lo[:1] + c[4:] + lo[1:]
