"""TenantPlan's admin in the console: the level its jobs get (classifier included),
pause/resume from its change page, audit rows linking to the job."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils.http import urlencode

from fairqueue.models import (
    ClassifierRule,
    PriorityOverrideAudit,
    SubscriptionClassifier,
    TenantPlan,
)

pytestmark = pytest.mark.django_db


def test_tenantplan_list__shows_the_level_the_classifier_gives_a_tierless_tenant(
    fq_prefix, admin_client
):
    rules = SubscriptionClassifier.objects.create(name="billing", default_tier="free")
    ClassifierRule.objects.create(classifier=rules, product_id="prod_big", plan_tier="enterprise")
    TenantPlan.objects.create(
        tenant_id="bigco", subscription={"products": [{"subscriptionProductId": "prod_big"}]}
    )
    TenantPlan.objects.create(tenant_id="smallco", plan_tier="free")
    html = admin_client.get(reverse("admin:fairqueue_tenantplan_changelist")).content.decode()
    assert "Level of its jobs" in html
    bigco = html.split(">bigco<", 1)[1].split("</tr>", 1)[0]
    assert ">critical</span>" in bigco and "by the classifier" in bigco
    assert ">low</span>" in html.split(">smallco<", 1)[1].split("</tr>", 1)[0]


def test_tenantplan_change_page__offers_pause_then_resume_through_the_console(
    fq_prefix, admin_client
):
    plan = TenantPlan.objects.create(tenant_id="acme", plan_tier="pro")
    url = reverse("admin:fairqueue_tenantplan_change", args=[plan.pk])
    back = "?" + urlencode({"next": url})  # confirmed in the console, then back here
    pause = reverse("admin:fairqueue_dashboard_tenant_action", args=["acme", "pause"]) + back
    assert f'href="{pause}" data-fq-pause-link>Pause' in admin_client.get(url).content.decode()
    assert admin_client.post(pause)["Location"] == url
    resume = reverse("admin:fairqueue_dashboard_tenant_action", args=["acme", "resume"]) + back
    assert f'href="{resume}" data-fq-pause-link>Resume' in admin_client.get(url).content.decode()
    # Only a page of this site: another host's address goes to the tenant page instead.
    elsewhere = resume.split("?")[0] + "?" + urlencode({"next": "https://evil.example/"})
    assert admin_client.post(elsewhere)["Location"] == reverse(
        "admin:fairqueue_dashboard_tenant", args=["acme"]
    )


def test_override_audit__job_ids_link_to_the_job_page(fq_prefix, admin_client):
    PriorityOverrideAudit.objects.create(
        job_type="email",
        job_id="42",
        tenant_id="acme",
        requested_override="critical",
        resolved_level="critical",
        rule="override",
        numeric_priority=1,
    )
    html = admin_client.get(reverse("admin:fairqueue_priorityoverrideaudit_changelist")).content
    job = reverse("admin:fairqueue_dashboard_job", args=["email", "42"])
    assert f'<a href="{job}">42</a>'.encode() in html
