import pytest
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from fairqueue import plans
from fairqueue.enqueue import priority
from fairqueue.enqueue.lookups import (
    _tenant_key,
    forget_tenant_plan,
    lookup_tenant_plan,
    lookup_tenant_weight,
)
from fairqueue.models import (
    ClassifierRule,
    PriorityOverrideAudit,
    SubscriptionClassifier,
    TenantPlan,
)
from fairqueue.scheduling.limits import NO_LIMITS

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
    plans.set_subscription_to_plan_tier(lambda sub: "free")
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


# --- tenant weights ---------------------------------------------------------------


def test_weight__defaults_to_1():
    assert TenantPlan.objects.create(tenant_id="a").weight == 1


@pytest.mark.parametrize("weight", [1, 3, 100])
def test_weight__in_range_passes_validation(weight):
    TenantPlan(tenant_id="a", weight=weight).full_clean()


@pytest.mark.parametrize(
    ("weight", "message"),
    [(0, "greater than or equal to 1"), (101, "less than or equal to 100")],
)
def test_weight__out_of_range_fails_validation(weight, message):
    with pytest.raises(ValidationError) as info:
        TenantPlan(tenant_id="a", weight=weight).full_clean()
    assert message in str(info.value.message_dict["weight"])


@pytest.mark.parametrize("weight", [0, 101])
def test_weight__database_refuses_out_of_range_writes_that_skip_validation(weight):
    TenantPlan.objects.create(tenant_id="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        TenantPlan.objects.filter(tenant_id="a").update(weight=weight)


def test_weight__lookup_reads_the_row_and_unknown_tenants_weigh_1():
    TenantPlan.objects.create(tenant_id="heavy", plan_tier="pro", weight=7)
    assert lookup_tenant_weight("heavy") == 7
    assert lookup_tenant_weight("ghost") == 1


def test_weight__plan_and_weight_come_from_one_cache_entry(django_assert_num_queries):
    TenantPlan.objects.create(tenant_id="a", plan_tier="pro", weight=4)
    assert lookup_tenant_plan("a") == "pro"
    with django_assert_num_queries(0):
        assert lookup_tenant_weight("a") == 4
        assert lookup_tenant_plan("a") == "pro"
    _, generation, (slug, weight, limits, account) = cache.get(_tenant_key("a"))
    assert (slug, weight, limits.holds, account) == ("pro", 4, False, None)


def test_weight__change_and_delete_invalidate_the_cached_weight():
    plan = TenantPlan.objects.create(tenant_id="a", plan_tier="pro", weight=2)
    assert lookup_tenant_weight("a") == 2
    plan.weight = 9
    plan.save(update_fields=["weight", "updated_at"])
    assert lookup_tenant_weight("a") == 9
    assert lookup_tenant_plan("a") == "pro"
    plan.delete()
    assert lookup_tenant_weight("a") == 1
    assert lookup_tenant_plan("a") is None


def test_weight__update_without_signals_needs_forget_tenant_plan():
    TenantPlan.objects.create(tenant_id="a", weight=2)
    assert lookup_tenant_weight("a") == 2
    TenantPlan.objects.filter(tenant_id="a").update(weight=5)
    assert lookup_tenant_weight("a") == 2  # documented: update() sends no signal
    forget_tenant_plan("a")
    assert lookup_tenant_weight("a") == 5


@pytest.mark.parametrize(
    "old_entry",
    [(0, "free"), (0, ""), "pro", None, (0,), (0, "free", 1), (0, "free", 1, NO_LIMITS, "")],
)
def test_weight__old_or_odd_cache_entries_are_a_miss_and_get_rewritten(old_entry):
    TenantPlan.objects.create(tenant_id="a", plan_tier="enterprise", weight=6)
    cache.set(_tenant_key("a"), old_entry)
    assert lookup_tenant_weight("a") == 6
    assert lookup_tenant_plan("a") == "enterprise"
    assert cache.get(_tenant_key("a"))[2][:2] == ("enterprise", 6)


def test_weight__classifier_change_invalidates_cached_weights_too(classifier):
    TenantPlan.objects.create(tenant_id="p", subscription=subscription("prod_basic"), weight=3)
    assert lookup_tenant_weight("p") == 3
    TenantPlan.objects.filter(tenant_id="p").update(weight=8)
    classifier.save()  # a classifier change bumps the generation of every entry
    assert lookup_tenant_weight("p") == 8


def test_weight__wired_database_lookups_drive_resolution():
    TenantPlan.objects.create(tenant_id="e", plan_tier="enterprise", weight=12)
    priority.wire_tenant_plan_lookup()
    resolved = priority.resolve_priority(tenant_id="e", enabled=True)
    assert (resolved.level, resolved.tenant_weight) == ("critical", 12)
    flag_off = priority.resolve_priority(tenant_id="e", enabled=False)
    assert (flag_off.level, flag_off.tenant_weight) == ("normal", 12)
    assert priority.resolve_priority(tenant_id="ghost").tenant_weight == 1


@pytest.mark.django_db(transaction=True)
def test_accounts_migration__existing_plans_keep_their_tier_weight_and_limits():
    """A plan written before accounts existed resolves as before once migrated forward,
    and the migration goes back cleanly."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [("fairqueue", "0010_breaker_probe")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps.get_model("fairqueue", "TenantPlan")
    old.objects.create(tenant_id="old", plan_tier="enterprise", weight=7, max_active=3)
    old.objects.create(tenant_id="classified", subscription={"products": []})
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    # forward to the latest: the models below read the columns of every later migration
    executor.migrate(executor.loader.graph.leaf_nodes())
    plan = TenantPlan.objects.get(tenant_id="old")
    assert (plan.account_id, plan.resolve_plan(), plan.weight) == (None, "enterprise", 7)
    assert plan.own_limits().max_active == 3
    assert TenantPlan.objects.get(tenant_id="classified").resolve_plan() == "free"
    assert lookup_tenant_plan("old") == "enterprise" and lookup_tenant_weight("old") == 7
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(before)
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
