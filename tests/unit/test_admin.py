"""Admin for plans, classifier rules and the read-only audit log."""

import pytest
from django.urls import reverse

from fairqueue.enqueue.lookups import lookup_tenant_plan, lookup_tenant_weight
from fairqueue.models import (
    ClassifierRule,
    PriorityOverrideAudit,
    SubscriptionClassifier,
    TenantPlan,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def audit_row():
    return PriorityOverrideAudit.objects.create(
        job_type="email",
        queue="email",
        job_id="7",
        tenant_id="acme",
        requested_override="critical",
        resolved_level="critical",
        numeric_priority=1,
        rule="override",
        source="test",
        actor="<script>alert(1)</script>",
    )


def test_tenant_plan_changelist_search_and_filter(admin_client):
    TenantPlan.objects.create(tenant_id="acme", display_name="Acme", plan_tier="enterprise")
    TenantPlan.objects.create(tenant_id="bolt", plan_tier="free")
    url = reverse("admin:fairqueue_tenantplan_changelist")
    assert b"acme" in admin_client.get(url, {"q": "acme"}).content
    response = admin_client.get(url, {"plan_tier__exact": "free"})
    assert b"bolt" in response.content and b"Acme" not in response.content


def test_tenant_plan_changelist__shows_and_filters_by_weight(admin_client):
    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro", weight=7)
    TenantPlan.objects.create(tenant_id="bolt", plan_tier="pro")
    url = reverse("admin:fairqueue_tenantplan_changelist")
    page = admin_client.get(url)
    assert b"column-weight" in page.content
    assert b'<td class="field-weight">7</td>' in page.content
    filtered = admin_client.get(url, {"weight": "7"})
    assert b"acme" in filtered.content and b"bolt" not in filtered.content


def _change_form_data(plan, **changes):
    return {
        "tenant_id": plan.tenant_id,
        "display_name": plan.display_name,
        "plan_tier": plan.plan_tier,
        "subscription": "{}",
        "weight": plan.weight,
        **changes,
    }


def test_tenant_plan_change_form__edits_weight_and_invalidates_cache(admin_client):
    plan = TenantPlan.objects.create(tenant_id="acme", plan_tier="pro")
    assert lookup_tenant_weight("acme") == 1
    url = reverse("admin:fairqueue_tenantplan_change", args=[plan.pk])
    assert b'name="weight"' in admin_client.get(url).content
    response = admin_client.post(url, _change_form_data(plan, weight="5"))
    assert response.status_code == 302
    plan.refresh_from_db()
    assert plan.weight == 5
    assert lookup_tenant_weight("acme") == 5
    assert lookup_tenant_plan("acme") == "pro"


@pytest.mark.parametrize("weight", ["0", "101", "1.5"])
def test_tenant_plan_change_form__refuses_out_of_range_weight(admin_client, weight):
    plan = TenantPlan.objects.create(tenant_id="acme", plan_tier="pro", weight=2)
    url = reverse("admin:fairqueue_tenantplan_change", args=[plan.pk])
    response = admin_client.post(url, _change_form_data(plan, weight=weight))
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["weight"]
    plan.refresh_from_db()
    assert plan.weight == 2


def test_set_tier_action__confirms_then_applies_and_invalidates_cache(admin_client):
    plan = TenantPlan.objects.create(tenant_id="acme", plan_tier="free")
    assert lookup_tenant_plan("acme") == "free"
    url = reverse("admin:fairqueue_tenantplan_changelist")
    data = {"action": "set_tier", "_selected_action": [plan.pk]}
    confirm = admin_client.post(url, data)
    assert confirm.status_code == 200
    assert b"New plan tier" in confirm.content
    plan.refresh_from_db()
    assert plan.plan_tier == "free"
    done = admin_client.post(url, {**data, "apply": "1", "plan_tier": "enterprise"})
    assert done.status_code == 302
    plan.refresh_from_db()
    assert plan.plan_tier == "enterprise"
    assert lookup_tenant_plan("acme") == "enterprise"


def test_classifier_admin_with_ordered_rules(admin_client):
    classifier = SubscriptionClassifier.objects.create(name="stripe")
    ClassifierRule.objects.create(
        classifier=classifier, position=2, product_id="b", plan_tier="pro"
    )
    response = admin_client.get(
        reverse("admin:fairqueue_subscriptionclassifier_change", args=[classifier.pk])
    )
    assert response.status_code == 200
    assert b"rules-0-position" in response.content


def test_audit_log_is_read_only_for_everyone(admin_client, audit_row):
    changelist = admin_client.get(reverse("admin:fairqueue_priorityoverrideaudit_changelist"))
    assert changelist.status_code == 200
    assert b"&lt;script&gt;" in changelist.content
    assert admin_client.get(reverse("admin:fairqueue_priorityoverrideaudit_add")).status_code == 403
    detail_url = reverse("admin:fairqueue_priorityoverrideaudit_change", args=[audit_row.pk])
    detail = admin_client.get(detail_url)
    assert detail.status_code == 200
    assert b'name="_save"' not in detail.content
    admin_client.post(detail_url, {"actor": "tampered"})
    audit_row.refresh_from_db()
    assert audit_row.actor == "<script>alert(1)</script>"
    delete_url = reverse("admin:fairqueue_priorityoverrideaudit_delete", args=[audit_row.pk])
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert PriorityOverrideAudit.objects.count() == 1


def test_audit_log_filters(admin_client, audit_row):
    url = reverse("admin:fairqueue_priorityoverrideaudit_changelist")
    assert admin_client.get(url, {"requested_override__exact": "critical"}).status_code == 200
    assert admin_client.get(url, {"q": "acme"}).status_code == 200


# -- usage: a plan's last 30 days, the top consumers per tier this month ----------------------


@pytest.fixture
def may_2019():
    """Now is 2019-05-28 for usage (a year no loop writes rows for)."""
    import datetime as dt

    from fairqueue.models import TenantUsage
    from fairqueue.usage import holds

    holds.set_clock(lambda: dt.datetime(2019, 5, 28, 12, tzinfo=dt.UTC))
    day = dt.date(2019, 5, 28)
    rows = [
        ("acme", day, 9_000),
        ("acme", day - dt.timedelta(days=3), 3_000),
        ("acme", day - dt.timedelta(days=40), 99_000),  # outside the chart and the month
        ("beta", day, 5_000),
        ("gamma", day, 7_000),
        ("delta", day, 1_000),
    ]
    for tenant, when, ms in rows:
        TenantUsage.objects.create(
            tenant_id=tenant, job_type="email", day=when, worker_ms=ms, attempts=ms // 1000
        )
    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro")
    TenantPlan.objects.create(tenant_id="beta", plan_tier="pro")
    TenantPlan.objects.create(tenant_id="gamma", plan_tier="free")
    yield day
    holds.set_clock(None)


def test_tenant_plan_change_page__its_last_30_days_of_usage_as_a_chart(admin_client, may_2019):
    from fairqueue.admin.usage_admin import daily_usage

    days = daily_usage("acme")
    assert len(days) == 30 and days[-1] == ("2019-05-28", 9.0) and days[-4] == ("2019-05-25", 3.0)
    assert sum(seconds for _, seconds in days) == 12.0
    plan = TenantPlan.objects.get(tenant_id="acme")
    page = admin_client.get(reverse("admin:fairqueue_tenantplan_change", args=[plan.pk]))
    html = page.content.decode()
    assert "Usage, last 30 days" in html and "12.0 worker seconds" in html
    assert 'data-fq-chart="usage"' in html and html.count('class="fq-bar fq-bar-usage"') == 30
    assert "2019-05-28: 9.0 worker seconds" in html and "busiest day 9.0 s" in html


def test_usage_list__top_consumers_per_plan_tier_this_month(admin_client, may_2019):
    from fairqueue.admin.usage_admin import top_consumers

    top = top_consumers(per_tier=1)
    assert [(t["tier"], [r["tenant_id"] for r in t["rows"]]) for t in top] == [
        ("pro", ["acme"]),  # 12 s this month (the row of April is not counted)
        ("free", ["gamma"]),
        ("no plan", ["delta"]),
    ]
    assert top[0]["month"] == "2019-05" and top[0]["rows"][0]["worker_seconds"] == 12.0
    page = admin_client.get(reverse("admin:fairqueue_tenantusage_changelist"))
    html = page.content.decode()
    assert "Top consumers per plan tier, 2019-05 (UTC)" in html
    section = html[html.index("data-fq-top-consumers") :]
    assert section.index(">acme<") < section.index(">beta<") < section.index(">gamma<")
    assert section.index(">gamma<") < section.index(">delta<")


def test_usage_list__filtered_by_account_totals_its_tenants_rows(admin_client, may_2019):
    from fairqueue.models import Account
    from fairqueue.usage.account_quotas import account_used_ms

    shop = Account.objects.create(account_id="shop & co")
    TenantPlan.objects.filter(tenant_id__in=["acme", "beta"]).update(account=shop)
    url = reverse("admin:fairqueue_tenantusage_changelist")
    page = admin_client.get(url, {"account": "shop & co"})
    shown = sorted(row.tenant_id for row in page.context["cl"].queryset)
    assert shown == ["acme", "acme", "acme", "beta"]  # its two tenants, every day
    assert page.context["usage_totals"]["worker_ms"] == 9_000 + 3_000 + 99_000 + 5_000
    # the month's worker time, as the account's quota counts it
    assert account_used_ms("shop & co", "month") == 9_000 + 3_000 + 5_000
    assert "shop &amp; co" in page.content.decode()  # offered among the filter's accounts


def test_tenant_plan_change_page__its_usage_link_keeps_an_odd_tenant_id_whole(admin_client):
    """A tenant id with ``&``, ``#`` or a space must reach the usage list's search whole:
    unescaped, ``a&b`` searched for ``a`` and ``x#1`` for ``x``."""
    from urllib.parse import parse_qs, urlsplit

    plan = TenantPlan.objects.create(tenant_id="a&b #1", plan_tier="pro")
    page = admin_client.get(reverse("admin:fairqueue_tenantplan_change", args=[plan.pk]))
    url = page.context["usage_url"]
    parts = urlsplit(url)
    assert parts.path == reverse("admin:fairqueue_tenantusage_changelist")
    assert parse_qs(parts.query) == {"q": ["a&b #1"]} and parts.fragment == ""
