import pytest
from django.core.cache import cache

from fairqueue import priority
from fairqueue.models import (
    ClassifierRule,
    PriorityOverrideAudit,
    SubscriptionClassifier,
    TenantPlan,
    lookup_tenant_plan,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _clear_cache():
    cache.clear()
    yield
    cache.clear()


def subscription(*product_ids):
    return {"products": [{"subscriptionProductId": p} for p in product_ids]}


@pytest.fixture
def classifier():
    c = SubscriptionClassifier.objects.create(name="stripe", default_tier="free")
    ClassifierRule.objects.create(
        classifier=c, position=0, product_id="prod_enterprise", plan_tier="enterprise"
    )
    ClassifierRule.objects.create(classifier=c, position=1, product_id="", plan_tier="pro")
    return c


def test_explicit_tier_wins():
    TenantPlan.objects.create(
        tenant_id="a", plan_tier="free", subscription=subscription("prod_enterprise")
    )
    assert lookup_tenant_plan("a") == "free"


def test_database_classifier_rules_in_order(classifier):
    TenantPlan.objects.create(tenant_id="e", subscription=subscription("x", "prod_enterprise"))
    TenantPlan.objects.create(tenant_id="p", subscription=subscription("prod_basic"))
    TenantPlan.objects.create(tenant_id="f", subscription={})
    assert [lookup_tenant_plan(t) for t in "epf"] == ["enterprise", "pro", "free"]


def test_unknown_tenant_is_none():
    assert lookup_tenant_plan("ghost") is None


def test_code_classifier_takes_precedence(classifier):
    TenantPlan.objects.create(tenant_id="e", subscription=subscription("prod_enterprise"))
    priority.set_subscription_to_plan_tier(lambda sub: "free")
    assert lookup_tenant_plan("e") == "free"


def test_cache_hit_makes_no_query(django_assert_num_queries):
    TenantPlan.objects.create(tenant_id="a", plan_tier="pro")
    lookup_tenant_plan("a")
    with django_assert_num_queries(0):
        assert lookup_tenant_plan("a") == "pro"


def test_plan_change_invalidates_cache():
    plan = TenantPlan.objects.create(tenant_id="a", plan_tier="pro")
    assert lookup_tenant_plan("a") == "pro"
    plan.plan_tier = "enterprise"
    plan.save()
    assert lookup_tenant_plan("a") == "enterprise"
    plan.delete()
    assert lookup_tenant_plan("a") is None


def test_rule_change_invalidates_every_cached_plan(classifier):
    TenantPlan.objects.create(tenant_id="p", subscription=subscription("prod_basic"))
    assert lookup_tenant_plan("p") == "pro"
    rule = classifier.rules.get(product_id="")
    rule.plan_tier = "free"
    rule.save()
    assert lookup_tenant_plan("p") == "free"


def test_wired_lookup_drives_resolution(classifier):
    TenantPlan.objects.create(tenant_id="e", subscription=subscription("prod_enterprise"))
    priority.wire_tenant_plan_lookup()
    assert priority.resolve_priority(tenant_id="e", enabled=True).level == "critical"


def test_audit_rows_are_immutable():
    row = PriorityOverrideAudit.objects.create(
        job_type="email",
        queue="email",
        job_id="1",
        resolved_level="low",
        numeric_priority=10,
        rule="override",
    )
    row.actor = "someone else"
    with pytest.raises(ValueError, match="immutable"):
        row.save()
    with pytest.raises(ValueError, match="immutable"):
        row.delete()
