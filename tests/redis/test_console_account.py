"""The console's account page against a real Redis and database: each of its tenants'
waiting and running jobs and entitlement are the numbers its tenant page shows, their
sums are BullMQ's, ids are escaped into the URL, and the tenant page links back."""

from __future__ import annotations

import re
import threading

import pytest
from django.urls import reverse

from fairqueue.dashboard import stats as dashboard
from fairqueue.dashboard.account_page import ACCOUNT_TENANTS
from fairqueue.dashboard.tenant_page import tenant_page_data
from fairqueue.enqueue import priority
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.models import Account, TenantPlan
from tests.helpers import bullmq_counts, holding_worker, wait_until
from tests.helpers.jobs import write_history

pytestmark = pytest.mark.django_db

ACCOUNT = "admin:fairqueue_dashboard_account"
TENANT = "admin:fairqueue_dashboard_tenant"
#: Jobs the stock worker holds running.
RUNNING = 3


def _cell(html: str, tenant: str, name: str) -> str:
    row = html.split(f'data-fq-account-tenant="{tenant}"', 1)[1].split("</tr>", 1)[0]
    found = re.search(rf'data-fq-at="{re.escape(name)}">([^<]*)<', row)
    return found.group(1) if found else ""


@pytest.fixture
def customers(fq_prefix, operator):
    """Account 'acct/big' (weight 2) owning 'big-1' (weight 3), 'big-2' and 'big/3'
    (no job); 'solo' a tenant without an account; the database lookups wired."""
    big = Account.objects.create(account_id="acct/big", plan_tier="pro", weight=2)
    TenantPlan.objects.create(tenant_id="big-1", account=big, weight=3)
    TenantPlan.objects.create(tenant_id="big-2", account=big)
    TenantPlan.objects.create(tenant_id="big/3", account=big)
    TenantPlan.objects.create(tenant_id="solo", plan_tier="pro")
    priority.wire_tenant_plan_lookup()
    priority.wire_tenant_weight_lookup()
    dashboard.clear_backlog_cache()
    return fq_prefix


def test_account_page__its_tenants_numbers_are_their_tenant_pages(
    customers, operator, redis_client
):
    one = enqueue_jobs("email", [{} for _ in range(8)], tenant_id="big-1")
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="big-2")
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="big-2", priority_level="low")
    enqueue_jobs("email", [{} for _ in range(6)], tenant_id="solo")
    level = one[0].level
    started: list[str] = []
    release = threading.Event()
    thread = holding_worker(customers, RUNNING, started, release)
    thread.start()
    try:
        assert wait_until(lambda: len(started) == RUNNING, 15)
        write_history(redis_client, customers, {(level, "big-1"): 3.0, (level, "solo"): 1.0})
        dashboard.clear_backlog_cache()
        url = reverse(ACCOUNT, args=["acct/big"])
        assert "/accounts/acct_2Fbig/" in url  # escaped into one segment
        html = operator.get(url).content.decode()
        email = html.split('class="fq-account-queue" data-job-type="email"', 1)[1]
        email = email.split("</section>", 1)[0]
        assert 'data-fq-a="weight">2<' in html and 'data-fq-a="tenants">3' in html
        counts = bullmq_counts(customers, "email")
        waiting = running = 0
        for tenant in ("big-1", "big-2", "big/3"):
            (queue,) = [q for q in tenant_page_data(tenant).queues if q.job_type == "email"]
            assert _cell(email, tenant, "waiting") == str(queue.waiting_total), tenant
            assert _cell(email, tenant, "running") == str(queue.running), tenant
            for share in queue.entitled_shown:
                assert _cell(email, tenant, f"entitled.{share.level}") == share.share, tenant
            waiting += queue.waiting_total or 0
            running += queue.running
            tenant_html = operator.get(reverse(TENANT, args=[tenant])).content.decode()
            assert f'data-fq-account><a href="{url}">acct/big</a>' in tenant_html
        (solo,) = [q for q in tenant_page_data("solo").queues if q.job_type == "email"]
        # the account's tenants and solo hold every job of the queue, none counted twice
        assert waiting + (solo.waiting_total or 0) == counts["wait"] + counts["prioritized"]
        assert running + solo.running == counts["active"] == RUNNING
        assert f"wait for {waiting} and run {running} job(s)" in email
        # a rate is measured, so shares are known; big-2 alone in low is entitled to all of it
        assert _cell(email, "big-1", f"entitled.{level}").endswith("%")
        assert _cell(email, "big-2", "entitled.low") == "100%"
        assert _cell(email, "big/3", "waiting") == "0" and 'href="/admin/' in email
        assert 'data-fq-account-tenant="solo"' not in html
        solo_html = operator.get(reverse(TENANT, args=["solo"])).content.decode()
        assert "data-fq-account>none: an account of its own<" in solo_html
    finally:
        release.set()
        thread.join(15)


def test_account_page__unknown_ids_are_404_and_viewing_needs_the_permission(
    customers, client, viewer
):
    assert viewer.get(reverse(ACCOUNT, args=["nobody"])).status_code == 404
    assert viewer.get("/admin/fairqueue/dashboard/accounts/acct%2Fbig/").status_code == 404
    assert viewer.get(reverse(ACCOUNT, args=["acct/big"])).status_code == 200
    client.logout()
    assert client.get(reverse(ACCOUNT, args=["acct/big"])).status_code == 302  # to login


def test_account_page__shows_its_limits_and_quota_over_all_its_tenants(customers, viewer):
    html = viewer.get(reverse(ACCOUNT, args=["acct/big"])).content.decode()
    limits = html.split('data-fq-a="limits">', 1)[1].split("</dd>", 1)[0]
    assert "at once: —" in limits and "rate: —" in limits
    assert 'data-fq-a="quota">none<' in html
    Account.objects.filter(account_id="acct/big").update(
        max_active=4,
        rate_max=10,
        rate_duration_ms=1000,
        max_waiting=500,
        quota_worker_seconds=3600,
        quota_period="month",
    )
    html = viewer.get(reverse(ACCOUNT, args=["acct/big"])).content.decode()
    limits = html.split('data-fq-a="limits">', 1)[1].split("</dd>", 1)[0]
    assert "at once: 4" in limits and "rate: 10 per " in limits
    assert "waiting at most: 500" in limits
    assert 'data-fq-a="quota">3,600 worker seconds a month<' in html


def test_account_page__lists_at_most_its_first_tenants_and_says_how_many(customers, viewer):
    big = Account.objects.get(account_id="acct/big")
    TenantPlan.objects.bulk_create(
        TenantPlan(tenant_id=f"many-{n:04d}", account=big) for n in range(ACCOUNT_TENANTS)
    )
    html = viewer.get(reverse(ACCOUNT, args=["acct/big"])).content.decode()
    total = ACCOUNT_TENANTS + 3
    assert f'data-fq-a="tenants">{total} <span class="fq-muted">(the first' in html
    email = html.split('data-job-type="email"', 1)[1].split("</section>", 1)[0]
    assert email.count("data-fq-account-tenant=") == ACCOUNT_TENANTS


def test_overview__top_consumers_by_account_sum_their_tenants_starts(
    customers, operator, redis_client
):
    write_history(
        redis_client,
        customers,
        {("normal", "big-1"): 3.0, ("low", "big-2"): 2.0, ("normal", "solo"): 4.0},
    )
    body = operator.get(reverse("admin:fairqueue_dashboard_stats"), {"queue": "email"}).json()
    (stats,) = body["queues"]
    started = {(t["level"], t["tenant"]): t["served"] for t in stats["history"]["tenants"]}
    big = started[("normal", "big-1")] + started[("low", "big-2")]
    solo = started[("normal", "solo")]
    assert big > solo > 0  # 5 a second against 4
    total = stats["history"]["served_total"]
    assert [(a["account"], a["tenant"], a["served"], a["tenants"]) for a in stats["accounts"]] == [
        ("acct/big", None, big, 2),
        (None, "solo", solo, 1),
    ]
    assert stats["accounts"][0]["url"] == reverse(ACCOUNT, args=["acct/big"])
    assert stats["accounts"][1]["url"] == reverse(TENANT, args=["solo"])
    html = operator.get(reverse("admin:fairqueue_dashboard_changelist")).content.decode()
    table = html.split("data-fq-top-accounts", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r'data-fq-top-account="([^"]+)">.*?<td>(\d+)</td><td>([^<]+)</td>', table)
    assert rows == [
        ("acct/big", str(big), f"{100 * big / total:.0f}%"),
        ("solo", str(solo), f"{100 * solo / total:.0f}%"),
    ]
    assert "(tenant, no account)" in table


def test_metrics__accounts_running_counts_accounts_never_names_them(customers, client):
    """Two tenants of one account and a tenant of none run: two accounts, no id label."""
    for tenant in ("big-1", "big-2", "solo"):
        enqueue_jobs("email", [{}], tenant_id=tenant)
    started: list[str] = []
    release = threading.Event()
    thread = holding_worker(customers, RUNNING, started, release)
    thread.start()
    try:
        assert wait_until(lambda: len(started) == RUNNING, 15)
        body = client.get("/metrics").content.decode()
    finally:
        release.set()
        thread.join(15)
    lines = [line for line in body.splitlines() if line.startswith("queue_fair_accounts_running{")]
    assert 'queue_fair_accounts_running{job_type="email",queue="email"} 2.0' in lines
    assert 'queue_fair_accounts_running{job_type="report",queue="report"} 0.0' in lines
    assert not any("acct" in line or "solo" in line for line in lines)


def test_noisy_account__its_tenants_together_over_the_accounts_share_are_flagged(
    customers, operator, client, redis_client
):
    """Four tenants of one account run 8 jobs while a tenant of none waits: each tenant
    runs a quarter of the level, but the account (weight 1 beside the lone tenant's 1) is
    entitled to half and runs all of it. The queue page lists the account, its page shows
    its half, and /metrics counts one noisy account without naming it."""
    many = Account.objects.create(account_id="acct/many", weight=1)
    tenants = [f"many-{n}" for n in range(4)]
    TenantPlan.objects.bulk_create(TenantPlan(tenant_id=t, account=many) for t in tenants)
    jobs = [job for t in tenants for job in enqueue_jobs("email", [{}, {}], tenant_id=t)]
    level = jobs[0].level
    started: list[str] = []
    release = threading.Event()
    thread = holding_worker(customers, 8, started, release)
    thread.start()
    try:
        assert wait_until(lambda: len(started) == 8, 15)
        enqueue_jobs("email", [{} for _ in range(3)], tenant_id="solo", priority_level=level)
        write_history(
            redis_client, customers, {**{(level, t): 0.5 for t in tenants}, (level, "solo"): 1.0}
        )
        dashboard.clear_backlog_cache()
        body = operator.get(reverse("admin:fairqueue_dashboard_stats"), {"queue": "email"}).json()
        (stats,) = body["queues"]
        (row,) = stats["noisy"]["accounts"]
        assert (row["account"], row["level"], row["tenants"], row["running"]) == (
            "acct/many",
            level,
            4,
            8,
        )
        assert (row["share"], row["entitled"]) == ("100%", "50%")
        assert row["account_url"] == reverse(ACCOUNT, args=["acct/many"])
        assert stats["noisy"]["accounts_count"] == 1
        page = operator.get(reverse("admin:fairqueue_dashboard_queue", args=["email"]))
        assert 'data-fq-noisy-account="acct/many"' in page.content.decode()
        overview = operator.get(reverse("admin:fairqueue_dashboard_changelist")).content
        assert "1 noisy account(s)" in overview.decode()  # an amber attention item
        html = operator.get(reverse(ACCOUNT, args=["acct/many"])).content.decode()
        email = html.split('data-job-type="email"', 1)[1].split("</section>", 1)[0]
        assert f'data-fq-at="account.{level}">50%<' in email
        # its tenants share the account's half: each a quarter of it, once it asks
        for tenant in tenants:
            assert _cell(email, tenant, f"entitled.{level}") in ("12%", "13%"), tenant
        metrics = client.get("/metrics").content.decode()
    finally:
        release.set()
        thread.join(15)
    lines = [line for line in metrics.splitlines() if line.startswith("queue_fair_noisy_accounts{")]
    assert 'queue_fair_noisy_accounts{job_type="email",queue="email"} 1.0' in lines
    assert not any("acct" in line or "many" in line for line in lines)
