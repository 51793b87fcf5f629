"""Dashboard server time over a large backlog: the overview and the tenant page under
300 ms at 1,000,000 waiting jobs and 10,000 limited tenants (``--jobs 1000000``).

Seeds ``--jobs`` waiting jobs (four levels, 50 tenants) on a private BullMQ prefix with
``enqueue_jobs`` in batches of 1,000, runs one rebalance pass, then times the dashboard
through Django's test client (the whole server-side stack: middleware, permission
checks, Redis reads, template rendering) over ``--requests`` requests each:

* page: ``/admin/fairqueue/dashboard/`` (the overview of every queue, then each queue,
  first 20 jobs);
* tenant page: ``/admin/fairqueue/dashboard/tenants/tenant-7/`` (one of the 50 tenants:
  its counts in every queue, its next jobs among the first 1,000 in line, its failures);
* JSON: the endpoint the page polls;
* deep page: the queue page at the last page of the backlog;
* starting a scan: the first page after the backlog-scan cache was emptied (it starts
  the background scan and must not wait for it), then one more page while that scan
  is still running (its Redis reads interleave with the scan's pages).

Also reports the background backlog scan's own time (it is off the request path above
``dashboard.SYNC_SCAN_LIMIT`` jobs), and, in the ``report`` queue, ``--tenants`` limited
tenants (``max_active=1``) with 2 jobs each, one takeable and one held (added by the add
script 250 jobs of many tenants a call, as the outbox relay adds them): that queue's page
and JSON, and the Redis connections fairqueue holds after them (``CLIENT LIST`` by its
connection name; reads of one request each are gathered, never one per tenant).
Everything is removed afterwards.

    python benchmarks/bench_dashboard.py [--jobs 100000] [--requests 30] [--tenants 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

from benchmarks.common import REDIS_URL, delete_prefix  # noqa: E402

django.setup()

import redis  # noqa: E402
from django.contrib.auth.models import Permission, User  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import (  # noqa: E402
    override_settings,
    setup_databases,
    setup_test_environment,
    teardown_databases,
    teardown_test_environment,
)

from fairqueue import conf  # noqa: E402
from fairqueue.broker import NewJob, close_brokers, get_sync_broker  # noqa: E402
from fairqueue.broker.clients import client_name  # noqa: E402
from fairqueue.dashboard import stats as dashboard  # noqa: E402
from fairqueue.enqueue.api import enqueue_jobs  # noqa: E402
from fairqueue.rebalance.passes import rebalance_queue  # noqa: E402
from fairqueue.scheduling.levels import PriorityLevel  # noqa: E402
from fairqueue.scheduling.limits import TenantLimits  # noqa: E402
from fairqueue.scheduling.wire import encoded_limits  # noqa: E402

QUEUES = {"email": "email", "report": "report", "cleanup": "cleanup"}
LEVELS = ("critical", "high", "normal", "low")
BATCH = 1_000
BUDGET_MS = 300.0
#: The 10,000-tenant rows' budget (design: correct and under 1 s with 10,000 tenants
#: holding jobs).
HELD_BUDGET_MS = 1_000.0


def seed(n: int) -> float:
    started = time.perf_counter()
    for b in range(0, n, BATCH):
        size = min(BATCH, n - b)
        # One level and tenant per batch call; levels and tenants rotate across batches.
        enqueue_jobs(
            "email",
            [{"i": b + i, "to": "someone@example.com"} for i in range(size)],
            tenant_id=f"tenant-{(b // BATCH) % 50}",
            priority_level=LEVELS[(b // BATCH) % 4],
        )
    return time.perf_counter() - started


def seed_holding(n: int, queue: str = "report") -> float:
    """``n`` tenants with ``max_active=1`` and 2 jobs each in ``queue``: one takeable, one
    held. Seconds taken."""
    started = time.perf_counter()
    limits = encoded_limits(TenantLimits(max_active=1))
    jobs = [
        NewJob(
            name=queue,
            data={"tenantId": f"held-{t:05d}", "priorityLevel": "normal"},
            level=PriorityLevel.NORMAL,
            tenant=f"held-{t:05d}",
            limits=limits,
        )
        for t in range(n)
        for _ in range(2)
    ]
    sync = get_sync_broker()
    for start in range(0, len(jobs), 250):
        sync.add_jobs(queue, jobs[start : start + 250])
    return time.perf_counter() - started


def connections(prefix: str) -> int:
    """fairqueue's Redis connections of ``prefix`` (its connection name)."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        return sum(1 for c in client.client_list() if c.get("name") == client_name(prefix))
    finally:
        client.close()


def timed(client: Client, url: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{url} answered HTTP {response.status_code}")
    return times


def wait_for_scans(limit_s: float = 60.0) -> None:
    started = time.perf_counter()
    while dashboard.scans_in_flight():
        if time.perf_counter() - started > limit_s:
            raise SystemExit(f"background scan did not finish in {limit_s:.0f} s")
        time.sleep(0.02)


def cold_rounds(client: Client, url: str, n: int) -> tuple[list[float], list[float]]:
    first, during = [], []
    for _ in range(n):
        wait_for_scans()
        dashboard.clear_backlog_cache()
        first.extend(timed(client, url, 1))
        if not dashboard.scans_in_flight():
            raise SystemExit("expected a background scan to be running")
        during.extend(timed(client, url, 1))
    wait_for_scans()
    return first, during


def _budget(row: str) -> float:
    """A row's p95 budget: 300 ms for the overview and the tenant page, whatever the
    backlog and the tenants holding jobs; a queue's own page and its JSON over 10,000
    tenants holding jobs list 200 of them in full (design: under 1 s)."""
    held_page = "holding" in row and ("queue page" in row or "JSON" in row)
    return HELD_BUDGET_MS if held_page else BUDGET_MS


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument(
        "--tenants",
        type=int,
        default=10_000,
        help="limited tenants holding jobs in the report queue (0: leave that row out)",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=int,
        default=300_000,
        help="the wait bound; 1 makes every job overdue (the worst case for the scan)",
    )
    args = parser.parse_args()

    prefix = f"fqbench-dash-{uuid.uuid4().hex[:8]}"
    setup_test_environment()
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        with override_settings(
            FAIRQUEUE={
                "PREFIX": prefix,
                "QUEUES": QUEUES,
                "REDIS_URL": REDIS_URL,
                "MAX_WAIT_MS": args.max_wait_ms,
            },
            ALLOWED_HOSTS=["testserver"],
        ):
            conf.reload_settings()
            dashboard.clear_backlog_cache()
            print(f"seeding {args.jobs} jobs on prefix {prefix} ...", flush=True)
            seed_s = seed(args.jobs)
            result = rebalance_queue("email", rebalancer="bench")
            print(f"seeded in {seed_s:.1f} s; one pass: {result.summary()}")

            user = User.objects.create_user("bench", password="x", is_staff=True)
            user.user_permissions.add(Permission.objects.get(codename="view_dashboard"))
            client = Client()
            client.force_login(user)
            page_url = "/admin/fairqueue/dashboard/"
            json_url = "/admin/fairqueue/dashboard/stats.json?page=1&per_page=20"
            last_page = max(1, -(-args.jobs // 20))
            deep_url = f"/admin/fairqueue/dashboard/queue/email/?page={last_page}&per_page=20"
            tenant_url = "/admin/fairqueue/dashboard/tenants/tenant-7/"

            # The first request starts the background scan; wait for it to land.
            client.get(page_url)
            wait_for_scans()
            stats = dashboard.queue_stats("email")
            print(
                f"background backlog scan: {stats['backlog']['scan_ms']:.0f} ms for "
                f"{stats['waiting_total']} waiting jobs (off the request path); "
                f"levels: { ({k: v['waiting'] for k, v in stats['levels'].items()}) }"
            )
            for url in (page_url, json_url, deep_url, tenant_url):  # warm templates, scripts
                client.get(url)

            rows = [
                ("overview", timed(client, page_url, args.requests)),
                ("tenant page", timed(client, tenant_url, args.requests)),
                ("JSON endpoint", timed(client, json_url, args.requests)),
                (f"deep page {last_page}", timed(client, deep_url, args.requests)),
            ]
            # At or below the exact scan's limit a page scans on the request, and no
            # background scan starts (a smoke run's tiny --jobs): those rows do not exist.
            if args.jobs > dashboard.SYNC_SCAN_LIMIT:
                starting, during = cold_rounds(client, page_url, max(3, args.requests // 3))
                rows += [("page starting a scan", starting), ("page during a scan", during)]
            held_rows: list[tuple[str, list[float]]] = []
            held_connections = 0
            if args.tenants:
                seeded_s = seed_holding(args.tenants)
                print(f"{args.tenants} tenants holding jobs seeded in {seeded_s:.1f} s")
                held_url = "/admin/fairqueue/dashboard/queue/report/"
                held_json = "/admin/fairqueue/dashboard/stats.json?queue=report"
                stats = dashboard.queue_stats("report")
                limits = stats["limits"]
                # Every held job is in BullMQ's delayed set (the add script may hold both
                # of a tenant's jobs and leave the release to the loop's step).
                delayed = stats["counts"]["delayed"]
                if (limits["held_total"], limits["holding"]) != (delayed, args.tenants):
                    raise SystemExit(f"{delayed} delayed, {limits['held_total']} held")
                for url in (held_url, held_json):
                    client.get(url)
                held_tenant = "/admin/fairqueue/dashboard/tenants/held-00042/"
                client.get(held_tenant)
                held_rows = [
                    (f"{args.tenants} holding: overview", timed(client, page_url, args.requests)),
                    (
                        f"{args.tenants} holding: tenant page",
                        timed(client, held_tenant, args.requests),
                    ),
                    (f"{args.tenants} holding: queue page", timed(client, held_url, args.requests)),
                    (f"{args.tenants} holding: JSON", timed(client, held_json, args.requests)),
                ]
                held_connections = connections(prefix)
            print()
            print(
                f"dashboard server time, {args.jobs} waiting jobs "
                f"({stats['overdue_total']} overdue), {args.requests} requests"
            )
            print(f"{'request':<26}{'median ms':>10}{'p95 ms':>10}{'max ms':>10}{'budget':>8}  ok")
            verdicts = []
            for name, times in rows + held_rows:
                budget = _budget(name)
                ok = p95(times) <= budget
                verdicts.append(ok)
                print(
                    f"{name:<26}{statistics.median(times):>10.1f}{p95(times):>10.1f}"
                    f"{max(times):>10.1f}{budget:>8.0f}  {'yes' if ok else 'NO'}"
                )
            print(
                f"\np95 {'within its budget in every row' if all(verdicts) else 'OVER BUDGET'} "
                f"({BUDGET_MS:.0f} ms for the overview and the tenant page); "
                f"{held_connections} Redis connections of fairqueue's open after them"
            )
    finally:
        # Let a background scan still running finish before its keys go away.
        time.sleep(0.5)
        close_brokers()
        delete_prefix(prefix)
        conf.reload_settings()
        teardown_databases(old_config, verbosity=0)
        teardown_test_environment()


if __name__ == "__main__":
    main()
