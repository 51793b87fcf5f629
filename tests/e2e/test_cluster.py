"""fairqueue on a Redis Cluster: a private 3-master cluster (started by the session
fixture, on free loopback ports, in a directory under /tmp, stopped afterwards) runs
enqueue, the pass and its leader lock, the dashboard, fairqueue's worker, a stock Python
BullMQ worker and a stock Node BullMQ worker on ioredis's Cluster client.

Queues are named with their hash tag (``{email}``), so every key of a queue, BullMQ's
and fairqueue's, lives on one slot and each script touches one slot."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading

import pytest
import redis
from bullmq import Queue
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

import fairqueue
from fairqueue import conf
from fairqueue.broker import Broker, NewJob, SyncBroker, get_sync_broker
from fairqueue.dashboard.stats import queue_stats
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.exceptions import BrokerUnavailableError
from fairqueue.rebalance.leadership import LeaderLock
from fairqueue.rebalance.passes import rebalance_as_leader, rebalance_queue
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.worker import handlers
from fairqueue.worker.runner import Worker as FairWorker
from tests.helpers import stock_worker_until
from tests.helpers.node import NODE_DIR
from tests.helpers.servers import CLUSTER_PREFIX, CLUSTER_QUEUES, LocalCluster, free_ports

pytestmark = pytest.mark.django_db
PREFIX = CLUSTER_PREFIX
QUEUES = CLUSTER_QUEUES


@pytest.fixture
def cluster_client(redis_cluster):
    host, port = redis_cluster.nodes[0].split(":")
    client = RedisCluster(host=host, port=int(port), decode_responses=True)
    yield client
    client.close()


def keys_by_node(cluster: LocalCluster) -> dict[int, list[str]]:
    found = {}
    for port in cluster.ports:
        client = redis.Redis(port=port, decode_responses=True)
        try:
            found[port] = list(client.scan_iter(match=f"{PREFIX}:*", count=1000))
        finally:
            client.close()
    return found


def fill_email():
    """Three tenants at three levels: the fair order interleaves them."""
    for _ in range(6):
        enqueue_jobs("email", [{}] * 4, tenant_id="a", priority_level="critical")
        enqueue_job("email", {}, tenant_id="b", priority_level="low")
        enqueue_jobs("email", [{}] * 2, tenant_id="c", priority_level="normal")


def level_of(cluster_client, job_id):
    data = json.loads(cluster_client.hget(f"{PREFIX}:{{email}}:{job_id}", "data"))
    return data["priorityLevel"]


# -- settings -----------------------------------------------------------------------------


def test_check__cluster_queue_without_hash_tag_is_an_error_naming_the_queue():
    with override_settings(
        FAIRQUEUE={"REDIS": {"cluster": ["127.0.0.1:7001"]}, "QUEUES": {"email": "email"}}
    ):
        errors = [e for e in run_checks() if e.id == "fairqueue.E016"]
        with pytest.raises(ImproperlyConfigured, match=r"queue name 'email'.*'\{email\}'"):
            conf.load_settings()
    assert len(errors) == 1 and "Redis Cluster" in errors[0].msg


def test_check__a_hash_tag_in_the_prefix_warns_every_queue_shares_one_slot():
    with override_settings(
        FAIRQUEUE={
            "REDIS": "redis+cluster://127.0.0.1:7001",
            "PREFIX": "{bull}",
            "QUEUES": {"email": "email", "report": "report"},
        }
    ):
        warnings = [w for w in run_checks() if w.id == "fairqueue.W011"]
        assert conf.load_settings().redis.kind == "cluster"  # correct, only not spread
    assert len(warnings) == 1 and "one slot" in warnings[0].msg


def test_check__two_queues_on_one_slot_warn():
    # "{a}x" and "{a}y" share the tag "a"
    with override_settings(
        FAIRQUEUE={
            "REDIS": {"cluster": ["127.0.0.1:7001"]},
            "QUEUES": {"email": "{a}x", "report": "{a}y", "cleanup": "{cleanup}"},
        }
    ):
        warnings = [w for w in run_checks() if w.id == "fairqueue.W011"]
    assert len(warnings) == 1 and "'{a}x', '{a}y'" in warnings[0].msg


def test_check__the_test_queues_spread_over_three_slots_without_warnings(on_cluster):
    assert not [m for m in run_checks() if m.id.startswith("fairqueue.")]
    slots = {key_slot(tag.strip("{}").encode()) for tag in QUEUES.values()}
    assert len(slots) == 3


# -- keys and slots -----------------------------------------------------------------------


def test_enqueue__every_key_of_a_queue_on_one_node_and_queues_on_different_masters(
    on_cluster, cluster_client
):
    fill_email()
    enqueue_jobs("report", [{"n": 1}] * 3, tenant_id="a")
    enqueue_job("cleanup", {}, tenant_id="a", delay_ms=60_000)  # a delayed job's meta
    rebalance_queue("email")  # the pass record and the lock
    nodes_of = {queue: set() for queue in QUEUES.values()}
    slots_of = {queue: set() for queue in QUEUES.values()}
    for port, keys in keys_by_node(on_cluster).items():
        for key in keys:
            queue = "{" + key.split("{", 1)[1].split("}", 1)[0] + "}"
            nodes_of[queue].add(port)
            slots_of[queue].add(key_slot(key.encode()))
    assert all(len(slots) == 1 for slots in slots_of.values()), slots_of
    assert all(len(nodes) == 1 for nodes in nodes_of.values()), nodes_of
    # the three queues' tags hash to slots that redis-cli gave to different masters
    assert len({next(iter(nodes)) for nodes in nodes_of.values()}) >= 2
    fq_keys = [k for keys in keys_by_node(on_cluster).values() for k in keys if ":fq:" in k]
    assert any(k.endswith(":fq:ready") for k in fq_keys)
    assert not any(k.endswith(":fq:jobs") for k in fq_keys)  # its meta is in its opts
    assert cluster_client.zcard(f"{PREFIX}:{{email}}:prioritized") == 42


# -- the fair order, consumed by stock workers ---------------------------------------------


async def _drain_python(nodes: list[str], count: int) -> list[str]:
    connection = AsyncRedisCluster(
        startup_nodes=[ClusterNode(n.split(":")[0], int(n.split(":")[1])) for n in nodes],
        decode_responses=True,
    )
    seen: list[str] = []
    await stock_worker_until(
        PREFIX, "{email}", lambda job: seen.append(job.id), count, connection=connection
    )
    return seen


def test_stock_python_worker_on_a_cluster_client_runs_the_fair_order(on_cluster, cluster_client):
    fill_email()
    expected = cluster_client.zrange(f"{PREFIX}:{{email}}:prioritized", 0, -1)
    processed = asyncio.run(_drain_python(on_cluster.nodes, len(expected)))
    assert processed == expected and len(set(processed)) == 42
    first = [level_of(cluster_client, job_id) for job_id in processed[:14]]
    # critical 4 : normal 2 : low 1 from the head of the queue
    assert first.count("critical") == 8 and first.count("normal") == 4
    assert first.count("low") == 2


@pytest.fixture(scope="module")
def node():
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "bullmq").is_dir():
        if os.environ.get("CI"):
            pytest.fail("node and tests/node/node_modules are required in CI (.ci/run installs)")
        pytest.skip("node or tests/node/node_modules missing (run: cd tests/node && npm ci)")
    return node


def test_stock_node_worker_on_ioredis_cluster_runs_the_fair_order(on_cluster, cluster_client, node):
    fill_email()
    (legacy,) = _add_foreign(on_cluster, {"tenantId": "d"})  # priority 0: adopted
    assert rebalance_queue("email").adopted == 1
    expected = cluster_client.zrange(f"{PREFIX}:{{email}}:prioritized", 0, -1)
    done = subprocess.run(
        [
            node,
            str(NODE_DIR / "cluster_worker.mjs"),
            ",".join(on_cluster.nodes),
            PREFIX,
            "{email}",
            str(len(expected)),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    processed = done.stdout.split()
    assert processed == expected and len(set(processed)) == 43 and legacy in processed
    assert cluster_client.zcard(f"{PREFIX}:{{email}}:completed") == 43


# -- the pass, its lock, the dashboard, fairqueue's worker ----------------------------------


def _add_foreign(cluster: LocalCluster, *payloads: dict) -> list[str]:
    """Jobs a plain BullMQ producer adds (no fairqueue tag: priority 0, the wait list)."""

    async def add():
        connection = AsyncRedisCluster(
            startup_nodes=[
                ClusterNode(n.split(":")[0], int(n.split(":")[1])) for n in cluster.nodes
            ],
            decode_responses=True,
        )
        queue = Queue("{email}", {"connection": connection, "prefix": PREFIX})
        ids = [(await queue.add("legacy", data)).id for data in payloads]
        await queue.close()
        return ids

    return asyncio.run(add())


def test_pass_adopts_foreign_jobs_and_promoted_delayed_jobs_under_its_lock(
    on_cluster, cluster_client
):
    enqueue_jobs("email", [{}] * 3, tenant_id="a", priority_level="low")
    legacy = _add_foreign(on_cluster, {"tenantId": "x", "priorityLevel": "critical"}, {})
    result = rebalance_as_leader("email", token="rebalancer-1", interval_ms=5_000)
    assert result is not None and result.adopted == 2 and not result.lock_lost
    order = cluster_client.zrange(f"{PREFIX}:{{email}}:prioritized", 0, -1)
    assert order[0] == legacy[0]  # the critical foreign job goes first
    assert cluster_client.llen(f"{PREFIX}:{{email}}:wait") == 0
    # another rebalancer cannot take the queue's lock while it is held
    lock = LeaderLock("{email}", "rebalancer-2", 10_000)
    assert lock.acquire() is False
    assert rebalance_as_leader("email", token="rebalancer-2", interval_ms=5_000) is None
    sync = get_sync_broker()
    holder, ttl = sync.run(sync.broker.lock.lock_holder, lock.key)
    assert holder == "rebalancer-1" and ttl > 0


def test_dashboard_reads_the_cluster(on_cluster):
    fill_email()
    stats = queue_stats("email")
    assert stats["queue"] == "{email}"
    assert stats["counts"]["prioritized"] == 42 and stats["waiting_total"] == 42


def test_fairqueue_worker_drains_queues_on_different_masters(on_cluster):
    seen: dict[str, list[str]] = {"email": [], "report": []}
    lock = threading.Lock()

    def record(job_type):
        def run(payload, job):
            with lock:
                seen[job_type].append(payload["n"])

        return run

    handlers.autodiscover()
    saved = {t: handlers.get_handler(t) for t in handlers.registered_job_types()}
    for job_type in ("email", "report"):
        handlers.unregister(job_type)
        fairqueue.handler(job_type)(record(job_type))
    try:
        enqueue_jobs("email", [{"n": str(i)} for i in range(20)], tenant_id="a")
        enqueue_jobs("report", [{"n": str(i)} for i in range(15)], tenant_id="b")
        FairWorker(
            ["email", "report"], concurrency=2, burst=True, install_signal_handlers=False
        ).run()
    finally:
        for job_type in handlers.registered_job_types():
            handlers.unregister(job_type)
        for job_type, fn in saved.items():
            handlers.handler(job_type)(fn)
    assert sorted(seen["email"], key=int) == [str(i) for i in range(20)]
    assert sorted(seen["report"], key=int) == [str(i) for i in range(15)]
    broker = get_sync_broker()
    assert (
        broker.run(broker.broker.workers.count_unfinished, "{email}") == 0
        and broker.run(broker.broker.workers.count_unfinished, "{report}") == 0
    )


def test_broker_takes_a_cluster_url(on_cluster, cluster_client):
    broker = SyncBroker(Broker("redis+cluster://" + ",".join(on_cluster.nodes), PREFIX))
    try:
        assert broker.run(broker.broker.ping) is True
        assert repr(broker.broker.target) == (
            "RedisTarget(cluster via " + ",".join(on_cluster.nodes) + ")"
        )
    finally:
        broker.close()


def test_unreachable_cluster__broker_unavailable_error_naming_no_password():
    (port,) = free_ports(1, bus=True)
    broker = SyncBroker(Broker(f"redis+cluster://:pw-secret@127.0.0.1:{port}", PREFIX))
    try:
        with pytest.raises(BrokerUnavailableError) as info:
            broker.run(broker.broker.ping)
        with pytest.raises(BrokerUnavailableError):
            broker.add_job("{email}", NewJob("x", {}, PriorityLevel.NORMAL))
    finally:
        broker.close()
    assert "pw-secret" not in str(info.value)
