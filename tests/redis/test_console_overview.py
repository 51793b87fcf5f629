"""The overview and the noisy neighbours: counts against BullMQ's for a state with
held, delayed, failed and overdue jobs of many tenants; the noisy rule, pure and live."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.urls import reverse

from fairqueue.broker import get_sync_broker
from fairqueue.dashboard import stats as dashboard
from fairqueue.dashboard.overview import noisy_figures
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.scheduling.noisy import FlowWeight, noisy_tenants
from tests.helpers import bullmq_counts, staff, wait_until
from tests.helpers.console import DASHBOARD, age_jobs, fail_jobs
from tests.helpers.keys import REDIS_URL

pytestmark = pytest.mark.django_db


def test_noisy__a_flood_holding_the_workers_is_flagged_a_tenant_within_its_share_never():
    level_weights = {"normal": 2}  # two tenants of weight 1 have work waiting
    flows = {("normal", "flood"): FlowWeight(1, True), ("normal", "fair"): FlowWeight(1, True)}
    flagged = noisy_tenants({("normal", "flood"): 8, ("normal", "fair"): 2}, level_weights, flows)
    assert [(n.tenant, n.running) for n in flagged] == [("flood", 8)]
    # Equal shares, or nobody else waiting: nobody is noisy.
    assert (
        noisy_tenants({("normal", "flood"): 5, ("normal", "fair"): 5}, level_weights, flows) == []
    )
    alone = {("normal", "flood"): FlowWeight(1, True)}
    assert noisy_tenants({("normal", "flood"): 10}, {"normal": 1}, alone) == []
    # Weights count: a weight-4 tenant may run 4 of 5.
    heavy = {("normal", "big"): FlowWeight(4, True), ("normal", "small"): FlowWeight(1, True)}
    assert noisy_tenants({("normal", "big"): 4, ("normal", "small"): 1}, {"normal": 5}, heavy) == []
    # Entitled now, not by weight: beside a held tenant that uses little, the flood is
    # entitled to 80% of the level and 8 of 10 running is within it; measured says so.
    running = {("normal", "flood"): 8, ("normal", "fair"): 2}
    now = {("normal", "flood"): 0.8, ("normal", "fair"): 0.2}
    assert noisy_tenants(running, level_weights, flows, now) == []
    (flagged,) = noisy_tenants(running, level_weights, flows, {("normal", "flood"): 0.3})
    assert (flagged.entitled, flagged.measured) == (0.3, True)
    (by_weight,) = noisy_tenants(running, level_weights, flows, {("normal", "flood"): None})
    assert (by_weight.entitled, by_weight.measured) == (0.5, False)


def test_noisy__by_worker_time_a_tenant_of_short_jobs_within_its_share_is_never_flagged():
    """Fairness by time: four workers' snapshot can show a tenant of short jobs within its
    share holding 3 of 4; its worker time over the last minute says it is within it."""
    level_weights = {"normal": 3}
    flows = {
        (level, tenant): FlowWeight(1, True)
        for level, tenant in (("normal", "healthy"), ("normal", "slow"), ("normal", "failing"))
    }
    running = {("normal", "healthy"): 3, ("normal", "slow"): 1}
    entitled = {("normal", "healthy"): 0.29, ("normal", "slow"): 0.36}
    assert [n.tenant for n in noisy_tenants(running, level_weights, flows, entitled)] == [
        "healthy"
    ]  # by the snapshot alone
    worked = {("normal", "healthy"): 0.28, ("normal", "slow"): 0.37}
    assert noisy_tenants(running, level_weights, flows, entitled, worked) == []
    assert noisy_tenants(running, level_weights, flows, entitled, {}) == []  # none recorded
    # A flood by worker time too is flagged, with its share of the level's worker time.
    (flagged,) = noisy_tenants(
        running, level_weights, flows, entitled, {("normal", "healthy"): 0.7}
    )
    assert (flagged.tenant, flagged.worked) == ("healthy", 0.7)
    with pytest.raises(ValueError, match=r"worked\[\('normal', 'slow'\)\]=1.5 is not allowed"):
        noisy_tenants(running, level_weights, flows, entitled, {("normal", "slow"): 1.5})


def test_overview__every_count_equals_bullmqs_for_held_delayed_failed_and_overdue_jobs(
    limited, client, redis_client
):
    client.force_login(staff("viewer", "view_dashboard"))
    dashboard.clear_backlog_cache()
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="doomed", attempts=1)
    fail_jobs(limited, "email", 2)
    assert wait_until(lambda: redis_client.zcard(f"{limited}:email:failed") == 2, 10)
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme")  # 2 waiting, 3 held
    for i in range(6):
        enqueue_job("email", {}, tenant_id=f"t{i}", priority_level="low")
    old = enqueue_jobs("email", [{} for _ in range(2)], tenant_id="late")
    age_jobs(redis_client, limited, "email", [j.job_id for j in old], by_ms=600_000)
    enqueue_job("email", {}, tenant_id="later", delay_ms=60_000)
    html = client.get(reverse(DASHBOARD)).content.decode()
    counts = bullmq_counts(limited, "email")
    stats = dashboard.queue_stats("email")
    row = 'data-fq-overview-row="email"'
    assert row in html
    section = html.split(row, 1)[1].split("</tr>", 1)[0]
    held = stats["limits"]["held_total"]
    assert held == 3
    expected = {
        "waiting": counts["wait"] + counts["prioritized"],
        "active": counts["active"],
        "delayed": counts["delayed"] - held,
        "held": held,
        "failed": counts["failed"],
        "overdue": 2,
    }
    assert expected["waiting"] == 2 + 6 + 2 and expected["delayed"] == 1
    for name, value in expected.items():
        assert f'data-fq-ov="{name}">{value}<' in section, name
    assert "2 job(s) past the wait bound" in section and "fq-state-red" in html


def test_noisy__live_a_tenant_holding_every_worker_while_another_waits(fq_prefix):
    from bullmq import Worker

    release = threading.Event()
    started: list[str] = []

    async def run() -> None:
        async def process(job, token):
            started.append(job.id)
            while not release.is_set():
                await asyncio.sleep(0.05)

        opts = {"connection": REDIS_URL, "prefix": fq_prefix, "concurrency": 4}
        worker = Worker("email", process, opts)
        while not release.is_set():
            await asyncio.sleep(0.05)
        await worker.close()

    thread = threading.Thread(target=asyncio.run, args=(run(),))
    enqueue_jobs("email", [{} for _ in range(4)], tenant_id="flood")
    thread.start()
    try:
        assert wait_until(lambda: len(started) == 4, 10)
        enqueue_jobs("email", [{} for _ in range(2)], tenant_id="quiet")
        noisy = noisy_figures("email", broker=get_sync_broker())
        assert [(n["tenant"], n["running"], n["entitled"]) for n in noisy["tenants"]] == [
            ("flood", 4, "50% by weight")  # no service rate measured yet
        ]
    finally:
        release.set()
        thread.join(20)


def test_metrics__the_web_process_reports_the_last_pass_and_noisy_count_from_redis(
    fq_prefix, client
):
    """Passes run by Celery beat export nothing from the worker that ran them: the web's
    /metrics reads what every path records in Redis. No tenant label."""
    from fairqueue.rebalance.passes import rebalance_queue

    rebalance_queue("email", rebalancer="celery-beat")
    body = client.get("/metrics").content.decode()
    last = [
        line
        for line in body.splitlines()
        if line.startswith("queue_fair_last_pass_recorded_timestamp_seconds{")
    ]
    assert any('job_type="email",queue="email"' in line for line in last)
    noisy = [line for line in body.splitlines() if line.startswith("queue_fair_noisy_tenants{")]
    assert noisy and all("tenant" not in line.split("{")[1].split("}")[0] for line in noisy)
