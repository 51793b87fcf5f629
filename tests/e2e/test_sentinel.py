"""fairqueue through Redis Sentinel: a private master, a replica and three sentinels (on
free loopback ports, in a directory under /tmp, stopped afterwards). A producer, the
rebalance pass and fairqueue's worker run while Sentinel fails the master over; every job
is counted: none lost, none run twice, and the new master holds each exactly once."""

from __future__ import annotations

import threading
import time

import pytest
import redis

import fairqueue
from fairqueue import conf
from fairqueue.broker import close_brokers, get_sync_broker
from fairqueue.dashboard.stats import clear_backlog_cache, queue_stats
from fairqueue.enqueue.api import enqueue_job
from fairqueue.exceptions import BrokerUnavailableError
from fairqueue.rebalance.passes import rebalance_as_leader
from fairqueue.worker import handlers
from fairqueue.worker.runner import Worker
from tests.helpers.servers import LocalSentinel, cluster_support, start_sentinel

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
PREFIX = "fqs"


@pytest.fixture(scope="module")
def sentinel():
    reason = cluster_support()  # the same redis-server and redis-cli
    if reason is not None:
        pytest.skip(f"no local Sentinel: {reason}")
    deployment = start_sentinel(3)
    yield deployment
    deployment.stop()


@pytest.fixture
def on_sentinel(sentinel: LocalSentinel, settings):
    settings.FAIRQUEUE = {
        "REDIS": {"sentinel": sentinel.sentinels, "service": sentinel.service},
        "PREFIX": PREFIX,
        "QUEUES": {"email": "email"},
    }
    conf.reload_settings()
    yield sentinel
    close_brokers()
    conf.reload_settings()


@pytest.fixture
def recording_handler():
    """An ``email`` handler recording every job id it runs (restored afterwards)."""
    handlers.autodiscover()
    saved = {t: handlers.get_handler(t) for t in handlers.registered_job_types()}
    runs: list[str] = []
    lock = threading.Lock()

    def run(payload, job):
        time.sleep(0.002)
        with lock:
            runs.append(job.job_id)

    handlers.unregister("email")
    fairqueue.handler("email")(run)
    yield runs
    for job_type in handlers.registered_job_types():
        handlers.unregister(job_type)
    for job_type, fn in saved.items():
        handlers.handler(job_type)(fn)


def _enqueue_until_added(job_id: str, errors: list[str]) -> None:
    """Enqueue with an explicit id, retrying with the same id while Redis fails over (the
    id makes a retry add nothing if an earlier attempt got through)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            enqueue_job("email", {"n": job_id}, tenant_id=f"t{int(job_id[2:]) % 3}", job_id=job_id)
            return
        except BrokerUnavailableError as exc:
            errors.append(type(exc).__name__)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _unfinished() -> int:
    try:
        sync = get_sync_broker()
        return sync.run(sync.broker.workers.count_unfinished, "email")
    except BrokerUnavailableError:
        return -1


def test_failover_during_a_run__no_job_lost_or_run_twice(on_sentinel, recording_handler):
    total, before = 600, 200
    old_master = on_sentinel.master_port_now()
    errors: list[str] = []
    for i in range(before):
        _enqueue_until_added(f"j-{i:04d}", errors)

    worker = Worker(["email"], concurrency=4, install_signal_handlers=False)
    worker_thread = threading.Thread(target=worker.run, daemon=True)
    worker_thread.start()

    stop_passes = threading.Event()
    pass_errors: list[str] = []
    passes = [0]

    def rebalance_loop():
        while not stop_passes.is_set():
            try:
                if rebalance_as_leader("email", token="sentinel-test", interval_ms=200):
                    passes[0] += 1
            except BrokerUnavailableError as exc:
                pass_errors.append(type(exc).__name__)
            stop_passes.wait(0.2)

    def produce():
        for i in range(before, total):
            _enqueue_until_added(f"j-{i:04d}", errors)
            time.sleep(0.01)

    rebalancer = threading.Thread(target=rebalance_loop, daemon=True)
    producer = threading.Thread(target=produce, daemon=True)
    rebalancer.start()
    producer.start()
    time.sleep(1.0)  # the worker is draining, the producer adding, the pass running
    new_master = on_sentinel.failover()  # planned: writes paused, then SENTINEL FAILOVER
    producer.join(60)
    assert not producer.is_alive()
    # Every job run and none left waiting or active (a job a failover caught between
    # run and completion would come back once BullMQ finds it stalled: then run twice).
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if len(set(recording_handler)) >= total and _unfinished() == 0:
            break
        time.sleep(0.2)
    worker.request_stop()
    worker_thread.join(30)
    stop_passes.set()
    rebalancer.join(10)

    runs = list(recording_handler)
    expected = {f"j-{i:04d}" for i in range(total)}
    assert new_master != old_master
    assert set(runs) == expected, f"lost: {sorted(expected - set(runs))[:10]}"
    assert len(runs) == total, f"run twice: {len(runs) - len(set(runs))}"
    assert passes[0] > 0
    # The new master holds every job exactly once, completed; nothing left waiting.
    client = redis.Redis(port=new_master, decode_responses=True)
    try:
        completed = client.zrange(f"{PREFIX}:email:completed", 0, -1)
        assert sorted(completed) == sorted(expected)
        jobs = {
            key.split(":", 2)[2]
            for key in client.scan_iter(f"{PREFIX}:email:j-*", count=1000)
            if key.count(":") == 2
        }
        assert jobs == expected  # no job hash lost, none added twice under another id
        # The dashboard and the leader lock read the new master through Sentinel.
        clear_backlog_cache()
        stats = queue_stats("email")
        assert stats["waiting_total"] == 0 and stats["counts"]["completed"] == total
        assert rebalance_as_leader("email", token="sentinel-test", interval_ms=200)
        sync = get_sync_broker()
        assert sync.run(sync.broker.lock.lock_holder, f"{PREFIX}:email:fq:leader")[0] == (
            "sentinel-test"
        )
        assert sync.run(sync.broker.workers.count_unfinished, "email") == 0
    finally:
        client.delete(*client.keys(f"{PREFIX}:*"))
        client.close()
    print(
        f"failover {old_master}->{new_master}: {total} jobs, {len(errors)} enqueue retries, "
        f"{len(pass_errors)} pass errors, {passes[0]} passes"
    )
