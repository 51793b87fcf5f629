"""The console in a real browser (Debian's Chromium, as tests/e2e/test_dashboard_browser.py
drives it): the overview's counts against BullMQ's, a tenant found by search, paused
from its page (confirmed, audited) and resumed, a job's position and why, on a narrow
screen too. Saves screenshots to ``tests/artifacts/`` (console-*.png)."""

from __future__ import annotations

import pytest

from fairqueue.dashboard import stats as dashboard
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.models import TenantPauseAudit, TenantPlan
from tests.e2e.browser import ARTIFACTS, chromium, log_in, staff_user
from tests.helpers import bullmq_counts
from tests.redis.test_dashboard import age_jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_browser__overview_tenant_search_pause_and_job_page(live_server, fq_prefix, redis_client):
    dashboard.clear_backlog_cache()
    staff_user("operator", "view_dashboard", "change_tenantplan", "view_tenantplan")
    TenantPlan.objects.create(tenant_id="exports-co", plan_tier="enterprise", max_active=2)
    from fairqueue.enqueue.priority import wire_tenant_plan_lookup

    wire_tenant_plan_lookup()
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="exports-co")  # 2 takeable, 3 held
    for i in range(6):
        enqueue_job("email", {}, tenant_id=f"shop-{i}", priority_level="low")
    old = enqueue_jobs("report", [{} for _ in range(2)], tenant_id="late")
    age_jobs(redis_client, fq_prefix, "report", [j.job_id for j in old], by_ms=600_000)
    target = enqueue_job("email", {}, tenant_id="shop-9", priority_level="low")
    counts = bullmq_counts(fq_prefix, "email")  # before the browser's event loop runs
    ARTIFACTS.mkdir(exist_ok=True)

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        log_in(page, live_server.url, "operator")

        page.goto(f"{live_server.url}/admin/fairqueue/dashboard/?refresh_ms=60000")
        row = "[data-fq-overview-row=email]"
        assert page.locator(f"{row} [data-fq-ov=waiting]").inner_text() == str(
            counts["wait"] + counts["prioritized"]
        )
        assert page.locator(f"{row} [data-fq-ov=held]").inner_text() == "3"
        assert page.locator(f"{row} [data-fq-ov=delayed]").inner_text() == str(
            counts["delayed"] - 3
        )
        # The queue needing attention (jobs past the bound) comes first.
        first = page.locator("[data-fq-overview-row]").first
        assert first.get_attribute("data-fq-overview-row") == "report"
        page.screenshot(path=str(ARTIFACTS / "console-overview.png"))

        # Search by the start of an id, open the tenant, pause it (confirm, then act).
        page.fill("#fq-ov-tenant", "exports")
        page.click("form[action$='/tenants/'] input[type=submit]")
        page.click("text=exports-co")
        assert page.locator("[data-fq-effective-level]").inner_text() == "critical"
        queue = "section.fq-tenant-queue[data-job-type=email]"
        assert page.locator(f"{queue} [data-fq-t=held]").inner_text() == "3"
        assert page.locator(f"{queue} [data-fq-t=waiting_total]").inner_text() == "2"
        page.screenshot(path=str(ARTIFACTS / "console-tenant.png"), full_page=True)
        page.click("text=Pause…")
        assert "None of its jobs starts" in page.locator("[data-fq-touches]").inner_text()
        page.click("input[type=submit][value^='Yes']")
        assert page.locator("[data-fq-paused-state]").inner_text() == "yes"
        assert page.locator(f"{queue} [data-fq-t=held]").inner_text() == "5"

        # A job's page: its position in line and why.
        page.goto(f"{live_server.url}/admin/fairqueue/dashboard/jobs/?id={target.job_id}")
        order = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)
        position = str(order.index(target.job_id) + 1)
        assert page.locator("[data-fq-position]").inner_text() == position
        assert "next turn" in page.locator("[data-fq-why]").inner_text()
        page.screenshot(path=str(ARTIFACTS / "console-job.png"), full_page=True)

        # A narrow screen: the overview table scrolls inside its box, the page does not.
        narrow = browser.new_page(viewport={"width": 420, "height": 900})
        narrow.context.add_cookies(page.context.cookies())
        narrow.goto(f"{live_server.url}/admin/fairqueue/dashboard/?refresh_ms=60000")
        width = narrow.evaluate("document.documentElement.scrollWidth")
        assert width <= 440, width
        narrow.screenshot(path=str(ARTIFACTS / "console-narrow.png"))
    # The pause was audited with the operator's name (the database is read after the
    # browser's event loop is gone).
    assert TenantPauseAudit.objects.filter(tenant_id="exports-co", actor="operator").exists()
