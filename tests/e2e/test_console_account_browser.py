"""The account page in a real browser (tests/e2e/test_console_browser.py's driver): from
the accounts' admin list to an account's page, its tenants' waiting jobs and links,
a tenant page and back to its account, and the overview's top consumers by account.
Saves ``tests/artifacts/console-account.png``."""

from __future__ import annotations

import pytest
from django.urls import reverse

from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.enqueue.priority import wire_tenant_plan_lookup, wire_tenant_weight_lookup
from fairqueue.models import Account, TenantPauseAudit, TenantPlan
from tests.helpers import bullmq_counts
from tests.helpers.console_driver import ARTIFACTS, OPERATOR_PERMS, off_loop, require_chromium
from tests.helpers.jobs import write_history

require_chromium()
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ADMIN = "admin:fairqueue_dashboard"
EMAIL = "section.fq-account-queue[data-job-type=email]"


def test_browser__account_page_from_the_admin_its_tenants_and_the_overview(
    console, fq_prefix, redis_client
):
    shop = Account.objects.create(account_id="shop & co", display_name="Shop Co", weight=2)
    for tenant in ("store/1", "store-2"):
        TenantPlan.objects.create(tenant_id=tenant, plan_tier="pro", account=shop)
    TenantPlan.objects.create(tenant_id="solo", plan_tier="pro")
    wire_tenant_plan_lookup()
    wire_tenant_weight_lookup()
    enqueue_jobs("email", [{} for _ in range(4)], tenant_id="store/1")
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="store-2")
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="solo")
    write_history(redis_client, fq_prefix, {("normal", "store/1"): 2.0, ("normal", "solo"): 1.0})

    page = console.open("operator", *OPERATOR_PERMS, superuser=True)
    console.go(reverse("admin:fairqueue_account_changelist"))
    console.follow("text=its page")
    assert "Shop Co" in console.text("[data-fq-account-page] h2")
    assert console.text("[data-fq-a=weight]") == "2"
    row = f"{EMAIL} [data-fq-account-tenant='store/1']"
    assert console.text(f"{row} [data-fq-at=waiting]") == "4"
    assert console.text(f"{EMAIL} [data-fq-account-tenant='store-2'] [data-fq-at=waiting]") == "2"
    assert console.text(f"{row} [data-fq-at='entitled.normal']").endswith("%")
    assert page.locator(f"{EMAIL} [data-fq-account-tenant=solo]").count() == 0
    # the account's own entitlement (weight 2 beside solo's 1), and its worker time
    assert console.text(f"{EMAIL} [data-fq-at='account.normal']").endswith("%")
    assert "s today" in console.text("[data-fq-a=usage]")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "console-account.png"), full_page=True)

    # its tenant's page, and back to the account from there
    console.follow(f"{row} a")
    assert page.url.endswith(reverse(f"{ADMIN}_tenant", args=["store/1"]))
    console.follow("[data-fq-account] a")
    assert page.url.endswith(reverse(f"{ADMIN}_account", args=["shop & co"]))

    # the overview: the account's starts (store/1's) before solo's
    console.go(reverse(f"{ADMIN}_changelist") + "?refresh_ms=60000")
    tops = page.locator("[data-fq-top-account]")
    assert [tops.nth(i).get_attribute("data-fq-top-account") for i in range(2)] == [
        "shop & co",
        "solo",
    ]
    console.follow("[data-fq-top-account='shop & co'] a")
    assert console.text("[data-fq-a=tenants]").startswith("2")


def test_browser__pause_and_resume_an_account_from_its_admin_list(console, fq_prefix):
    shop = Account.objects.create(account_id="shop", plan_tier="pro")
    for tenant in ("shop-1", "shop-2"):
        TenantPlan.objects.create(tenant_id=tenant, account=shop)
    wire_tenant_plan_lookup()
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="shop-1")
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="shop-2")
    enqueue_jobs("email", [{}], tenant_id="other")

    console.open("operator", *OPERATOR_PERMS, "change_account", "view_account")

    def run(action: str) -> str:
        console.go(reverse("admin:fairqueue_account_changelist"))
        console.page.locator("#result_list tr", has_text="shop").locator(
            "input.action-select"
        ).check()
        console.page.select_option("select[name=action]", action)
        console.follow("button[name=index]")
        return console.message()

    assert run("pause") == "Paused 1 account(s)."
    assert off_loop(bullmq_counts, fq_prefix, "email")["delayed"] == 5  # held
    console.go(reverse(f"{ADMIN}_account", args=["shop"]))
    assert console.text("[data-fq-a=paused]").startswith("yes")
    assert console.text(f"{EMAIL} [data-fq-account-tenant='shop-1'] [data-fq-at=waiting]") == "0"
    console.go(reverse(f"{ADMIN}_tenant", args=["shop-2"]))
    assert console.text("[data-fq-paused-state]") == "yes"
    audits = TenantPauseAudit.objects.filter(source="account shop: admin", actor="operator")
    assert off_loop(audits.count) == 2

    assert run("resume") == "Resumed 1 account(s)."
    counts = off_loop(bullmq_counts, fq_prefix, "email")
    assert counts["delayed"] == 0 and counts["wait"] + counts["prioritized"] == 6
    console.go(reverse(f"{ADMIN}_account", args=["shop"]))
    assert console.text("[data-fq-a=paused]") == "no"
