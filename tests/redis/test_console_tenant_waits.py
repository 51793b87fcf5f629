"""The tenant page's waits and worker-time share, recorded per tenant by the loop from
BullMQ's events stream while a stock worker drains two tenants' backlogs, checked against
what the job hashes say (processedOn less the ready time)."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from fairqueue.dashboard.tenant_page import WINDOWS_MIN, tenant_page_data
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.scheduling import shares
from fairqueue.scheduling.attempts import TENANT_BUCKET_S
from fairqueue.scheduling.shares import bin_bounds, wait_bin
from tests.helpers import stock_worker_until

# Timing-sensitive (live workers, loops): `make test` runs them after the parallel part.
pytestmark = [pytest.mark.django_db, pytest.mark.serial]

#: The worker stamps processedOn with its clock, Redis the event with its own: the same
#: machine's clock, read a moment apart.
CLOCKS_MS = 3


async def _drain(prefix: str, count: int) -> None:
    async def process(job):
        await asyncio.sleep(0.012 if job.data["tenantId"] == "acme" else 0.004)

    await stock_worker_until(prefix, "email", process, count)


def _exact(redis_client, prefix: str, ids: list[str]) -> tuple[list[int], int]:
    """Waits (processedOn less fqReady) and worker ms (finishedOn less processedOn)."""
    waits, worked = [], 0
    for job_id in ids:
        opts, processed, finished = redis_client.hmget(
            f"{prefix}:email:{job_id}", "opts", "processedOn", "finishedOn"
        )
        waits.append(int(processed) - int(json.loads(opts)["fqReady"]))
        worked += int(finished) - int(processed)
    return sorted(waits), worked


def _within_a_bin(estimate: float, exact: int) -> bool:
    low = bin_bounds(wait_bin(max(0, exact - CLOCKS_MS)))[0]
    high = bin_bounds(wait_bin(exact + CLOCKS_MS))[1]
    return low <= estimate <= high


def test_tenant_waits__percentiles_and_worker_share_match_the_job_hashes(fq_prefix, redis_client):
    rebalance_queue("email", rebalancer="waits-test")  # the history starts here
    ids = {"acme": [], "beta": []}
    for _ in range(150):
        for tenant in ids:
            (job,) = enqueue_jobs("email", [{}], tenant_id=tenant, priority_level="normal")
            ids[tenant].append(job.job_id)
    asyncio.run(_drain(fq_prefix, 300))
    for _ in range(5):  # every page of the events stream
        rebalance_queue("email", rebalancer="waits-test")

    pages = {
        tenant: next(q for q in tenant_page_data(tenant).queues if q.job_type == "email")
        for tenant in ids
    }
    worked = {}
    for tenant, tenant_ids in ids.items():
        waits, worked[tenant] = _exact(redis_client, fq_prefix, tenant_ids)
        rows = {row["minutes"]: row for row in pages[tenant].waits}
        assert sorted(rows) == sorted(WINDOWS_MIN)
        for minutes in WINDOWS_MIN:
            row = rows[minutes]
            assert row["waits"] == 150  # every first attempt, once
            for q, key in ((0.5, "p50_ms"), (0.99, "p99_ms")):
                exact = waits[max(0, math.ceil(q * len(waits)) - 1)]
                assert _within_a_bin(row[key], exact), (tenant, minutes, key, row[key], exact)
    # Its worker time and its level's: the two tenants' add up to the level's, and the
    # shares are those the job hashes show (each attempt's ms read a moment apart).
    for minutes in WINDOWS_MIN:
        acme = pages["acme"].waits[WINDOWS_MIN.index(minutes)]["worker"]["normal"]
        beta = pages["beta"].waits[WINDOWS_MIN.index(minutes)]["worker"]["normal"]
        assert acme["level_ms"] == beta["level_ms"] == acme["ms"] + beta["ms"]
        exact_share = worked["acme"] / (worked["acme"] + worked["beta"])
        assert acme["share"] == pytest.approx(exact_share, abs=300 * CLOCKS_MS / acme["level_ms"])
        assert acme["share"] > 0.55  # its jobs take three times as long (with margin for load)
    # Attempts started: every one, each tenant half of its level's.
    for tenant in ids:
        for row in pages[tenant].started:
            assert row["started"] == 150
            assert row["share"] == "50% of normal's 300"

    # Bounded: one small hash per tenant and minute, with the history's expiry.
    keys = redis_client.keys(f"{fq_prefix}:email:fq:hist:tw:*")
    assert {key.rsplit(":", 1)[1] for key in keys} == {"acme", "beta"}
    assert len(keys) <= 2 * 3  # the drain spans at most a minute boundary or two
    for key in keys:
        assert 0 < redis_client.ttl(key) <= shares.RETENTION_S + 2 * shares.BUCKET_S
        start = int(key.split(":")[-2])
        assert start % TENANT_BUCKET_S == 0
        assert redis_client.hlen(key) <= len(shares.WAIT_EDGES) + 5


def test_tenant_starts__exact_for_every_tenant_however_many_start_in_a_bucket(fq_prefix):
    """40 tenants start jobs within seconds (the queue's 10 s buckets keep their 32 most
    served tenants): each tenant's page counts every attempt it started."""
    rebalance_queue("email", rebalancer="starts-test")  # the history starts here
    tenants = [f"t{n:02d}" for n in range(40)]
    for tenant in tenants:
        enqueue_jobs("email", [{} for _ in range(3)], tenant_id=tenant, priority_level="normal")
    enqueue_jobs("email", [{} for _ in range(40)], tenant_id="big", priority_level="normal")
    asyncio.run(_drain(fq_prefix, 160))
    for _ in range(5):  # every page of the events stream
        rebalance_queue("email", rebalancer="starts-test")
    for tenant, expected in [*((tenant, 3) for tenant in tenants), ("big", 40)]:
        page = next(q for q in tenant_page_data(tenant).queues if q.job_type == "email")
        assert [row["started"] for row in page.started] == [expected] * len(WINDOWS_MIN)
        assert page.started[0]["share"] == f"{round(100 * expected / 160)}% of normal's 160"
