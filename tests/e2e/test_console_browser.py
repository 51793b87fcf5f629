"""The console in a real browser (Debian's Chromium, as tests/e2e/test_dashboard_browser.py
drives it), every page and every action as an operator clicks through it: the overview's
counts against BullMQ's, a tenant found by search, paused and resumed from its page,
its weight and limits changed there, its failed jobs retried as fair turns, its waiting
jobs removed; a job's position and why, the job page's retry and remove; pause and
resume from the plan's admin page, the plan list's actions (pause, resume, retry, set
tier); the audit list's job links; a rebalance pass. Each console action is confirmed
on a page of its own, and what the page shows after an action is checked against
Redis's and BullMQ's own state and the audit rows in the database. Saves screenshots to
``tests/artifacts/`` (console-*.png)."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.enqueue.priority import wire_tenant_plan_lookup
from fairqueue.models import TenantPauseAudit, TenantPlan
from fairqueue.tenants import pause_tenant
from tests.helpers import bullmq_counts, wait_until
from tests.helpers.console import age_jobs, fail_jobs
from tests.helpers.console_driver import ARTIFACTS, OPERATOR_PERMS, off_loop, require_chromium

require_chromium()
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ADMIN = "admin:fairqueue_dashboard"
EMAIL = "section.fq-tenant-queue[data-job-type=email]"


def tenant_path(tenant_id: str) -> str:
    return reverse(f"{ADMIN}_tenant", args=[tenant_id])


def shown(console, name: str) -> str:
    """A number of the tenant page's email section (``data-fq-t``)."""
    return console.text(f"{EMAIL} [data-fq-t='{name}']")


def counts(prefix: str) -> dict[str, int]:
    """BullMQ's own counts of the email queue (off the browser's loop)."""
    return off_loop(bullmq_counts, prefix, "email")


def log_messages(**filters) -> list[str]:
    """The admin log's change messages, oldest first (off the browser's loop)."""
    rows = LogEntry.objects.filter(**filters).order_by("pk")
    return off_loop(lambda: list(rows.values_list("change_message", flat=True)))


def pause_audit(tenant_id: str) -> list[tuple[str, str, str]]:
    rows = TenantPauseAudit.objects.filter(tenant_id=tenant_id).order_by("pk")
    return off_loop(lambda: list(rows.values_list("action", "actor", "source")))


def plan_of(tenant_id: str, **fields) -> TenantPlan:
    """Its plan row, with the database's lookups wired (enqueues hold it to its limits)."""
    plan = TenantPlan.objects.create(tenant_id=tenant_id, **fields)
    wire_tenant_plan_lookup()
    return plan


def in_line(redis_client, prefix: str, job_ids) -> list[int]:
    """The 1-based places of ``job_ids`` in the email queue's order, as Redis has it."""
    order = redis_client.zrange(f"{prefix}:email:prioritized", 0, -1)
    return [place for place, job_id in enumerate(order, 1) if job_id in set(job_ids)]


def jobs_in_line(console) -> list[int]:
    """The tenant page's "its jobs in line" (email): their places, as its links say."""
    links = console.page.locator(f"{EMAIL} a[data-fq-in-line]").all_inner_texts()
    return [int(text.lstrip("#")) for text in links]


def test_browser__overview_tenant_search_pause_and_job_page(console, fq_prefix, redis_client):
    plan_of("exports-co", plan_tier="enterprise", max_active=2)
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="exports-co")  # 2 takeable, 3 held
    for i in range(6):
        enqueue_job("email", {}, tenant_id=f"shop-{i}", priority_level="low")
    old = enqueue_jobs("report", [{} for _ in range(2)], tenant_id="late")
    age_jobs(redis_client, fq_prefix, "report", [j.job_id for j in old], by_ms=600_000)
    target = enqueue_job("email", {}, tenant_id="shop-9", priority_level="low")
    before = bullmq_counts(fq_prefix, "email")
    ARTIFACTS.mkdir(exist_ok=True)

    page = console.open("operator", *OPERATOR_PERMS)
    console.go(reverse(f"{ADMIN}_changelist") + "?refresh_ms=60000")
    row = "[data-fq-overview-row=email]"
    waiting = before["wait"] + before["prioritized"]
    assert console.text(f"{row} [data-fq-ov=waiting]") == str(waiting)
    assert console.text(f"{row} [data-fq-ov=held]") == "3"
    assert console.text(f"{row} [data-fq-ov=delayed]") == str(before["delayed"] - 3)
    # The queue needing attention (jobs past the bound) comes first.
    first = page.locator("[data-fq-overview-row]").first
    assert first.get_attribute("data-fq-overview-row") == "report"
    page.screenshot(path=str(ARTIFACTS / "console-overview.png"))

    # Search by the start of an id, open the tenant, pause it (confirm, then act).
    page.fill("#fq-ov-tenant", "exports")
    console.follow("form[action$='/tenants/'] input[type=submit]")
    console.follow("text=exports-co")
    assert console.text("[data-fq-effective-level]") == "critical"
    assert (shown(console, "held"), shown(console, "waiting_total")) == ("3", "2")
    page.screenshot(path=str(ARTIFACTS / "console-tenant.png"), full_page=True)
    assert "None of its jobs starts" in console.confirm("text=Pause…")
    assert console.message() == "Paused exports-co: 2 of its job(s) taken back from the line."
    assert console.text("[data-fq-paused-state]") == "yes"
    assert (shown(console, "held"), shown(console, "waiting_total")) == ("5", "0")
    after = counts(fq_prefix)
    assert after["delayed"] == before["delayed"] + 2
    assert after["prioritized"] + after["wait"] == waiting - 2

    # A job's page: its position in line and why.
    console.go(reverse(f"{ADMIN}_jobs") + f"?id={target.job_id}")
    position = in_line(redis_client, fq_prefix, [target.job_id])
    assert console.text("[data-fq-position]") == str(*position)
    assert "next turn" in console.text("[data-fq-why]")
    page.screenshot(path=str(ARTIFACTS / "console-job.png"), full_page=True)
    assert pause_audit("exports-co") == [("paused", "operator", "console")]


def test_browser__a_narrow_screen_scrolls_the_overview_table_not_the_page(console, fq_prefix):
    for i in range(6):
        enqueue_job("email", {}, tenant_id=f"shop-{i}", priority_level="low")
    page = console.open("operator", "view_dashboard")
    page.set_viewport_size({"width": 420, "height": 900})
    console.go(reverse(f"{ADMIN}_changelist") + "?refresh_ms=60000")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 440, width
    page.screenshot(path=str(ARTIFACTS / "console-narrow.png"))


def test_browser__resume_releases_its_held_jobs_and_is_audited(console, fq_prefix):
    plan_of("acme", plan_tier="pro")
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="acme")
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="beta")
    pause_tenant("acme", actor="pager-bot", source="incident")
    assert counts(fq_prefix)["delayed"] == 3

    console.open("operator", *OPERATOR_PERMS)
    console.go(tenant_path("acme"))
    assert console.text("[data-fq-paused-state]") == "yes"
    assert shown(console, "next_run") == "not while it is paused"
    touches = console.confirm("text=Resume…")
    assert touches == "Its held jobs are released in their order, as its other limits allow."
    assert console.message() == "Resumed acme: 3 held job(s) released at once."
    assert console.text("[data-fq-paused-state]") == "no"
    assert (shown(console, "held"), shown(console, "waiting_total")) == ("0", "3")
    after = counts(fq_prefix)
    assert (after["delayed"], after["prioritized"]) == (0, 5)
    assert "resumed by operator (console)" in console.text(".fq-tenant-page [data-fq-audits]")
    assert pause_audit("acme") == [
        ("paused", "pager-bot", "incident"),
        ("resumed", "operator", "console"),
    ]
    assert not off_loop(lambda: TenantPlan.objects.get(tenant_id="acme").paused)


def save_limits(console, **fields: str) -> None:
    """The tenant page's "Weight and limits…" form, ``fields`` typed in, saved."""
    console.follow("text=Weight and limits…")
    for name, value in fields.items():
        console.page.fill(f"#id_{name}", value)
    console.follow("input[type=submit][value=Save]")


def test_browser__limits_from_the_tenant_page_release_and_hold_its_jobs(console, fq_prefix):
    plan = plan_of("acme", plan_tier="pro", max_active=2)
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme")  # 2 takeable, 3 held

    console.open("operator", *OPERATOR_PERMS)
    console.go(tenant_path("acme"))
    assert (shown(console, "waiting_total"), shown(console, "held")) == ("2", "3")
    save_limits(console, max_active="4")
    assert console.message().startswith("Saved max_active: its held jobs are released")
    assert "at once: 4 ·" in console.text(".fq-tenant-page dl")
    assert (shown(console, "waiting_total"), shown(console, "held")) == ("4", "1")
    after = counts(fq_prefix)
    assert (after["prioritized"], after["delayed"]) == (4, 1)

    # Lowered: its jobs already in line stay there (and count against it), the held one
    # stays held.
    save_limits(console, max_active="1")
    assert "at once: 1 ·" in console.text(".fq-tenant-page dl")
    assert (shown(console, "waiting_total"), shown(console, "held")) == ("4", "1")
    assert counts(fq_prefix) == after
    assert (
        log_messages(object_id=str(plan.pk), user__username="operator")
        == ["Changed max_active from the console."] * 2
    )


def test_browser__weight_from_the_tenant_page_is_counted_at_once(console, fq_prefix, redis_client):
    plan = plan_of("acme", plan_tier="pro", weight=1)  # normal, as beta
    jobs = {
        tenant: enqueue_jobs("email", [{} for _ in range(4)], tenant_id=tenant)
        for tenant in ("beta", "acme")
    }
    acme_ids = [job.job_id for job in jobs["acme"]]

    console.open("operator", *OPERATOR_PERMS)
    console.go(tenant_path("acme"))
    assert shown(console, "weight.normal") == "1 of 2"
    before = in_line(redis_client, fq_prefix, acme_ids)
    assert jobs_in_line(console) == before
    save_limits(console, weight="3")
    assert console.message().startswith("Saved weight:")
    # What the page says the scheduler counts is Redis's word: acme's flow weight 3,
    # the level's flows 3 + 1.
    assert shown(console, "weight.normal") == "3 of 4"
    assert redis_client.hget(f"{fq_prefix}:email:fq:fweights", "normal\nacme") == "3"
    assert redis_client.hget(f"{fq_prefix}:email:fq:state", "W:normal") == "4"
    assert console.text(".fq-tenant-page [data-fq-plan-weight]") == "3"
    # Its waiting jobs were placed again by it: nearer the front, as the page shows.
    after = in_line(redis_client, fq_prefix, acme_ids)
    assert jobs_in_line(console) == after
    assert sum(after) < sum(before), (before, after)
    assert log_messages(object_id=str(plan.pk)) == ["Changed weight from the console."]


def test_browser__retry_from_a_failed_jobs_page_puts_them_back_as_fair_turns(
    console, fq_prefix, redis_client
):
    failed = enqueue_jobs("email", [{} for _ in range(3)], tenant_id="acme", attempts=1)
    fail_jobs(fq_prefix, "email", 3)  # a stock BullMQ worker whose jobs raise
    assert wait_until(lambda: redis_client.zcard(f"{fq_prefix}:email:failed") == 3, 10)
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="beta")
    acme_ids = [job.job_id for job in failed]

    console.open("operator", *OPERATOR_PERMS)
    console.go(reverse(f"{ADMIN}_job", args=["email", acme_ids[0]]))
    assert console.text("[data-fq-failure]").startswith("ValueError: export broke")
    assert "retrying its tenant's failed jobs" in console.text("[data-fq-why]")
    touches = console.confirm("text=Retry all its tenant's failed jobs…")
    assert "email: 3 failed job(s) among the last" in touches
    assert console.message() == "Retried 3 failed job(s) of acme, as fair turns."
    assert (shown(console, "failed"), shown(console, "waiting_total")) == ("0", "3")
    after = counts(fq_prefix)
    assert (after["failed"], after["prioritized"], after["wait"]) == (0, 6, 0)
    # Fair turns: neither all at the front (where BullMQ's own retry puts them) nor all
    # behind beta's jobs; the page's links are their places in Redis's order.
    places = in_line(redis_client, fq_prefix, acme_ids)
    assert places not in ([1, 2, 3], [4, 5, 6]), places
    assert jobs_in_line(console) == places
    # Back on the job's page: in line, where Redis has it.
    console.go(reverse(f"{ADMIN}_job", args=["email", acme_ids[0]]))
    assert console.text("[data-fq-position]") == str(
        *in_line(redis_client, fq_prefix, acme_ids[:1])
    )
    assert log_messages(user__username="operator") == ["Retried 3 failed job(s) from the console."]


def test_browser__remove_a_tenants_waiting_and_held_jobs_confirmed_and_logged(console, fq_prefix):
    plan = plan_of("acme", plan_tier="pro", max_active=2)
    enqueue_jobs("email", [{} for _ in range(4)], tenant_id="acme")  # 2 takeable, 2 held
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="beta")

    console.open("operator", *OPERATOR_PERMS)
    console.go(tenant_path("acme"))
    # "No, go back" leaves every job where it was.
    console.follow("text=Remove its waiting jobs…")
    console.follow("text=No, go back")
    assert (shown(console, "waiting_total"), shown(console, "held")) == ("2", "2")
    touches = console.confirm("text=Remove its waiting jobs…")
    assert "email: 4 waiting or held job(s)" in touches
    assert console.message() == "Removed 4 waiting or held job(s) of acme."
    assert (shown(console, "waiting_total"), shown(console, "held")) == ("0", "0")
    after = counts(fq_prefix)
    assert (after["prioritized"], after["delayed"]) == (2, 0)  # beta's stay
    assert log_messages(object_id=str(plan.pk)) == [
        "Removed 4 waiting job(s) from the console (0 had started)."
    ]


def test_browser__job_found_from_the_overview_and_removed_from_its_page(
    console, fq_prefix, redis_client
):
    keep = enqueue_job("email", {}, tenant_id="acme")
    job = enqueue_job("email", {}, tenant_id="acme")

    page = console.open("operator", *OPERATOR_PERMS)
    console.go(reverse(f"{ADMIN}_changelist") + "?refresh_ms=60000")
    page.fill("#fq-ov-job", job.job_id)
    console.follow("form[action$='/jobs/'] input[type=submit]")
    assert console.text("[data-fq-position]") == "2"
    touches = console.confirm("text=Remove this job…")
    assert touches.startswith(f"Remove job {job.job_id} of email")
    assert console.message() == f"Removed job {job.job_id}."
    assert page.url.endswith(reverse(f"{ADMIN}_queue", args=["email"]))
    assert redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1) == [keep.job_id]
    assert not redis_client.exists(f"{fq_prefix}:email:{job.job_id}")
    assert log_messages(user__username="operator") == [
        f"Removed job {job.job_id} from the console."
    ]


def link_text(console) -> str:
    """The plan page's pause link as written (the admin's object tools show it in
    capitals)."""
    return console.page.locator("[data-fq-pause-link]").text_content().strip()


def test_browser__pause_and_resume_from_the_plans_admin_page(console, fq_prefix):
    plan = plan_of("acme", plan_tier="pro")
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="acme")
    change = reverse("admin:fairqueue_tenantplan_change", args=[plan.pk])

    console.open("operator", *OPERATOR_PERMS)
    console.go(change)
    assert link_text(console) == "Pause…"
    console.confirm("[data-fq-pause-link]")
    assert console.page.url.endswith(change)
    assert console.message() == "Paused acme: 2 of its job(s) taken back from the line."
    assert console.page.locator(".field-paused img").get_attribute("alt") == "True"
    assert counts(fq_prefix)["delayed"] == 2
    console.confirm("[data-fq-pause-link]")
    assert console.message() == "Resumed acme: 2 held job(s) released at once."
    assert console.page.locator(".field-paused img").get_attribute("alt") == "False"
    assert link_text(console) == "Pause…"
    assert counts(fq_prefix)["prioritized"] == 2
    assert pause_audit("acme") == [
        ("paused", "operator", "console"),
        ("resumed", "operator", "console"),
    ]


def test_browser__the_override_audits_job_link_opens_the_jobs_page(
    console, fq_prefix, redis_client
):
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="beta")
    job = enqueue_job("email", {}, tenant_id="acme", priority_override="critical")

    console.open("auditor", "view_dashboard", "view_priorityoverrideaudit")
    console.go(reverse("admin:fairqueue_priorityoverrideaudit_changelist"))
    console.follow(f"#result_list a:text-is('{job.job_id}')")
    assert console.text("#content h2") == f"Job {job.job_id}"
    assert console.text(".fq-level") == "critical"
    assert console.text("[data-fq-position]") == str(
        *in_line(redis_client, fq_prefix, [job.job_id])
    )


def test_browser__one_rebalance_pass_from_the_queue_page_is_logged(console, fq_prefix):
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="acme")

    console.open("operator", "view_dashboard", "run_rebalance")
    console.go(reverse(f"{ADMIN}_queue", args=["email"]) + "?refresh_ms=60000")
    console.follow("text=Run one pass now…")
    assert "No rebalancer holds the leader lock" in console.text("#content")
    console.follow("input[type=submit][value^='Yes']")
    assert console.message().startswith("Ran one pass:")
    assert console.page.url.endswith(reverse(f"{ADMIN}_queue", args=["email"]))
    logged = log_messages(user__username="operator", object_id="email")
    assert len(logged) == 1 and logged[0].startswith("Ran one rebalance pass from the dashboard")
    assert counts(fq_prefix)["prioritized"] == 3


def run_plan_action(console, action: str, *tenant_ids: str) -> None:
    """On the plans' admin list: tick ``tenant_ids``, choose ``action``, Go."""
    console.go(reverse("admin:fairqueue_tenantplan_changelist"))
    for tenant_id in tenant_ids:
        row = console.page.locator("#result_list tr", has_text=tenant_id)
        row.locator("input.action-select").check()
    console.page.select_option("select[name=action]", action)
    console.follow("button[name=index]")


def test_browser__plan_list_actions_pause_and_resume_the_selected_tenants(console, fq_prefix):
    for tenant in ("acme", "beta", "gamma"):
        plan_of(tenant, plan_tier="pro")
        enqueue_jobs("email", [{} for _ in range(2)], tenant_id=tenant)

    console.open("operator", *OPERATOR_PERMS)
    run_plan_action(console, "pause", "acme", "beta")
    assert console.message() == "Paused 2 tenant(s)."
    paused = console.page.locator("#result_list td.field-paused img").evaluate_all(
        "imgs => imgs.map(i => i.alt)"
    )
    assert sorted(paused) == ["False", "True", "True"]
    after = counts(fq_prefix)
    assert (after["delayed"], after["prioritized"]) == (4, 2)  # gamma's still in line
    run_plan_action(console, "resume", "acme", "beta")
    assert console.message() == "Resumed 2 tenant(s)."
    after = counts(fq_prefix)
    assert (after["delayed"], after["prioritized"]) == (0, 6)
    for tenant in ("acme", "beta"):
        audit = [("paused", "operator", "admin"), ("resumed", "operator", "admin")]
        assert pause_audit(tenant) == audit
    assert pause_audit("gamma") == []


def test_browser__plan_list_actions_retry_failed_jobs_and_set_the_tier(
    console, fq_prefix, redis_client
):
    plan_of("acme", plan_tier="free")
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="acme", attempts=1)
    fail_jobs(fq_prefix, "email", 2)  # a stock BullMQ worker whose jobs raise
    assert wait_until(lambda: redis_client.zcard(f"{fq_prefix}:email:failed") == 2, 10)

    console.open("operator", *OPERATOR_PERMS)
    run_plan_action(console, "retry_failed_jobs", "acme")
    assert console.message() == "Retried 2 failed job(s) of 1 tenant(s)."
    after = counts(fq_prefix)
    assert (after["failed"], after["prioritized"]) == (0, 2)

    run_plan_action(console, "set_tier", "acme")  # asks for the tier first
    console.page.select_option("select[name=plan_tier]", "enterprise")
    console.follow("input[name=apply]")
    assert console.message() == "Set 1 tenant(s) to enterprise."
    row = console.page.locator("#result_list tr", has_text="acme")
    assert row.locator("td.field-jobs_level").inner_text().strip() == "critical"
    assert off_loop(lambda: TenantPlan.objects.get(tenant_id="acme").plan_tier) == "enterprise"
