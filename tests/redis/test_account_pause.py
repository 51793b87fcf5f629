"""Pausing an account: every tenant of it paused in Redis as ``pause_tenant`` pauses
one, audited on each; a tenant resumed alone stays held while its account is paused; a
tenant joining a paused account is paused, one leaving it is resumed; resuming the
account leaves a tenant's own pause in force; the database's copy (the rebuild) says
the same (real Redis, real BullMQ)."""

from __future__ import annotations

import html

import pytest
from django.test import Client
from django.urls import reverse

from fairqueue import pause_account, pause_tenant, resume_account, resume_tenant
from fairqueue.broker import get_sync_broker
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.enqueue.priority import wire_tenant_plan_lookup
from fairqueue.exceptions import InvalidAccountError, UnknownAccountError
from fairqueue.models import Account, TenantPauseAudit, TenantPlan
from fairqueue.tenants import database_limits
from tests.helpers import bullmq_counts, staff

pytestmark = pytest.mark.django_db


def paused(tenant_id: str) -> list[bool]:
    """Whether Redis has ``tenant_id`` paused, in each of the email and report queues."""
    sync = get_sync_broker()
    return [sync.run(sync.broker.limits.is_paused, q, tenant_id) for q in ("email", "report")]


def takeable(prefix: str) -> int:
    counts = bullmq_counts(prefix, "email")
    return counts["wait"] + counts["prioritized"]


@pytest.fixture
def shop(fq_prefix):
    """Account 'shop' owning 'shop-1' and 'shop-2'; 'solo' of no account; lookups wired."""
    account = Account.objects.create(account_id="shop", plan_tier="pro")
    TenantPlan.objects.create(tenant_id="shop-1", account=account)
    TenantPlan.objects.create(tenant_id="shop-2", account=account)
    TenantPlan.objects.create(tenant_id="solo", plan_tier="pro")
    wire_tenant_plan_lookup()
    return fq_prefix


def test_pause_account__holds_every_tenant_of_it_and_audits_each(shop):
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="shop-1")
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="shop-2")
    enqueue_jobs("email", [{} for _ in range(4)], tenant_id="solo")
    assert takeable(shop) == 9
    assert pause_account("shop", actor="ops", source="incident 7") == 5
    assert takeable(shop) == 4  # solo's alone
    assert bullmq_counts(shop, "email")["delayed"] == 5
    assert paused("shop-1") == paused("shop-2") == [True, True]
    assert paused("solo") == [False, False]
    # its tenants' new jobs are held too
    enqueue_jobs("email", [{}], tenant_id="shop-2")
    assert takeable(shop) == 4
    assert Account.objects.get(account_id="shop").paused
    audits = TenantPauseAudit.objects.order_by("tenant_id")
    assert list(audits.values_list("tenant_id", "action", "actor", "source")) == [
        ("shop-1", "paused", "ops", "account shop: incident 7"),
        ("shop-2", "paused", "ops", "account shop: incident 7"),
    ]
    # the database's copy: Redis's rebuild pauses them again
    _, held = database_limits()
    assert {"shop-1", "shop-2"} <= held and "solo" not in held

    assert resume_account("shop", actor="ops", source="fixed") == 6
    assert takeable(shop) == 10
    assert paused("shop-1") == paused("shop-2") == [False, False]
    assert not Account.objects.get(account_id="shop").paused
    resumed = TenantPauseAudit.objects.filter(action="resumed", source="account shop: fixed")
    assert resumed.count() == 2


def test_pause_account__a_tenants_own_pause_and_the_accounts_both_hold(shop):
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="shop-1")
    pause_tenant("shop-1", actor="ops")
    pause_account("shop", actor="ops")
    # resuming the tenant alone: its account's pause still holds it
    assert resume_tenant("shop-1", actor="ops") == 0
    assert paused("shop-1") == [True, True] and takeable(shop) == 0
    pause_tenant("shop-1", actor="ops")
    # resuming the account: the tenant's own pause still holds it; its sibling goes
    resume_account("shop", actor="ops")
    assert paused("shop-1") == [True, True] and paused("shop-2") == [False, False]
    assert resume_tenant("shop-1", actor="ops") == 2
    assert takeable(shop) == 2


def test_pause_account__joining_tenants_are_paused_leaving_ones_resumed(
    shop, django_capture_on_commit_callbacks
):
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="solo")
    pause_account("shop", actor="ops")
    with django_capture_on_commit_callbacks(execute=True):
        solo = TenantPlan.objects.get(tenant_id="solo")
        solo.account_id = "shop"
        solo.save()
    assert paused("solo") == [True, True] and takeable(shop) == 0
    with django_capture_on_commit_callbacks(execute=True):
        TenantPlan.objects.create(tenant_id="shop-3", account_id="shop")
    assert paused("shop-3") == [True, True]
    with django_capture_on_commit_callbacks(execute=True):
        solo.account = None
        solo.save()
    assert paused("solo") == [False, False] and takeable(shop) == 2
    # a save that does not touch the account leaves its pause alone
    with django_capture_on_commit_callbacks(execute=True):
        plan = TenantPlan.objects.get(tenant_id="shop-3")
        plan.weight = 2
        plan.save(update_fields=["weight", "updated_at"])
    assert paused("shop-3") == [True, True]


def test_pause_account__bad_and_unknown_ids_are_clear_errors(shop):
    with pytest.raises(UnknownAccountError, match="no Account has that id"):
        pause_account("nobody")
    with pytest.raises(InvalidAccountError, match="account_id="):
        resume_account("")
    assert not TenantPauseAudit.objects.exists()


def test_console__resuming_a_tenant_of_a_paused_account_says_it_stays_held(shop, operator):
    enqueue_jobs("email", [{}], tenant_id="shop-1")
    pause_account("shop", actor="ops")
    url = reverse("admin:fairqueue_dashboard_tenant_action", args=["shop-1", "resume"])
    page = operator.post(url, follow=True).content.decode()
    assert "its account shop is paused, so its jobs stay held" in page
    assert paused("shop-1") == [True, True] and takeable(shop) == 0
    assert "data-fq-account-paused>its account is paused" in page


def test_pause_account__comes_back_when_redis_lost_its_keys(shop, redis_client):
    """Redis forgets every key: an enqueue whose lookup says its account is paused holds
    its job at once, and the rebuild from the database pauses every tenant again."""
    from fairqueue.tenants import rebuild_tenant_limits
    from tests.helpers.keys import delete_prefix

    pause_account("shop", actor="ops")
    delete_prefix(shop)
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="shop-1")
    enqueue_jobs("email", [{}], tenant_id="solo")
    assert takeable(shop) == 1  # solo's; shop-1's held by the add itself
    assert rebuild_tenant_limits()
    assert paused("shop-1") == paused("shop-2") == [True, True]
    assert sorted(redis_client.hkeys(f"{shop}:email:fq:lim:paused")) == ["shop-1", "shop-2"]


def test_console__pause_and_resume_the_account_confirmed_on_its_page(shop, operator):
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="shop-2")
    pause = reverse("admin:fairqueue_dashboard_account_action", args=["shop", "pause"])
    page = reverse("admin:fairqueue_dashboard_account", args=["shop"])
    assert f'href="{pause}"' in operator.get(page).content.decode()
    confirm = html.unescape(operator.get(pause).content.decode())  # GET: asks, does nothing
    assert "None of its tenants' jobs starts" in confirm and paused("shop-2") == [False, False]
    done = operator.post(pause, follow=True).content.decode()
    assert "Paused account shop: 2 job(s) taken back from the line." in done
    assert 'data-fq-a="paused">yes' in done and paused("shop-2") == [True, True]
    assert TenantPauseAudit.objects.filter(source="account shop: console").count() == 2
    resume = reverse("admin:fairqueue_dashboard_account_action", args=["shop", "resume"])
    resumed = operator.post(resume, follow=True).content.decode()
    assert "Resumed account shop: 2 held job(s)" in resumed
    assert takeable(shop) == 2
    # viewing is not acting; no other action; no other account
    viewer = Client()
    viewer.force_login(staff("viewer", "view_dashboard"))
    assert viewer.post(pause).status_code == 403 and paused("shop-2") == [False, False]
    assert f'href="{pause}"' not in viewer.get(page).content.decode()
    other = reverse("admin:fairqueue_dashboard_account_action", args=["shop", "remove"])
    assert operator.get(other).status_code == 404
    nobody = reverse("admin:fairqueue_dashboard_account_action", args=["nobody", "pause"])
    assert operator.post(nobody).status_code == 404


def test_pause_account__a_quota_or_breaker_lifted_meanwhile_does_not_resume_its_tenants(shop):
    from fairqueue.usage.holds import pause_in, resume_in

    pause_in(["email"], "shop-1")  # a quota's hold, then the account's pause
    pause_account("shop", actor="ops")
    assert resume_in(["email"], "shop-1") == []  # the quota ends: the account still holds
    assert paused("shop-1") == [True, True]
    resume_account("shop", actor="ops")
    assert paused("shop-1") == [False, False]
