"""The console's worker list: the liveness records worker processes write (one per
process of ``fairqueue_worker --processes N``), shown on the queue's page and in its
JSON; a record past its staleness bound is a dead process, left out and deleted."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from fairqueue.broker import WorkerProcess, get_sync_broker

pytestmark = pytest.mark.django_db

QUEUE = "admin:fairqueue_dashboard_queue"
STATS = "admin:fairqueue_dashboard_stats"


def beat(slot: int, pid: int, *, age_s: float = 0.0, jobs_done: int = 0) -> None:
    now_ms = int(time.time() * 1000)
    process = WorkerProcess(
        host="web-1",
        pid=pid,
        supervisor_pid=4000,
        slot=slot,
        concurrency=8,
        started_ms=now_ms - 60_000,
        beat_ms=now_ms - int(age_s * 1000),
        jobs_done=jobs_done,
    )
    broker = get_sync_broker()
    broker.run(broker.broker.workers.beat, "email", process, stale_after_s=15)


def test_worker_list__shows_each_live_process_and_drops_dead_ones(viewer, fq_prefix, redis_client):
    beat(0, 4001, jobs_done=12)
    beat(1, 4002, jobs_done=7)
    beat(1, 3999, age_s=60)  # the slot's previous process: died a minute ago

    html = viewer.get(reverse(QUEUE, args=["email"])).content.decode()
    assert 'data-fq-worker="4001"' in html and 'data-fq-worker="4002"' in html
    assert 'data-fq-worker="3999"' not in html
    assert 'data-fq="workers.processes">2<' in html and 'data-fq="workers.slots">16<' in html
    key = f"{fq_prefix}:email:fq:procs"
    assert sorted(redis_client.hkeys(key)) == ["web-1:4001", "web-1:4002"]  # dead one deleted

    (stats,) = viewer.get(reverse(STATS), {"queue": "email"}).json()["queues"]
    rows = stats["workers"]["rows"]
    assert [(row["pid"], row["slot"], row["jobs_done"]) for row in rows] == [
        (4001, 0, 12),
        (4002, 1, 7),
    ]
    assert 0 < redis_client.ttl(key) <= 60  # a prefix no worker uses again leaves nothing


def test_worker_list__says_when_no_process_reports(viewer, fq_prefix):
    html = viewer.get(reverse(QUEUE, args=["email"])).content.decode()
    assert "data-fq-workers-none" in html
