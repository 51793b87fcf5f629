import logging

import pytest

from fairqueue import plans
from fairqueue.enqueue import priority as prio
from fairqueue.enqueue.priority import PriorityRule, resolve_priority
from fairqueue.exceptions import (
    ConflictingPriorityError,
    InvalidPlanError,
    InvalidPriorityError,
    InvalidPriorityLevelError,
    InvalidTenantError,
    InvalidTenantWeightError,
)
from fairqueue.scheduling.levels import PriorityLevel

PLANS = {"t-ent": "enterprise", "t-pro": "pro", "t-free": "free", "t-odd": "platinum"}


@pytest.mark.parametrize(
    ("plan", "level"),
    [
        ("enterprise", "critical"),
        ("pro", "normal"),
        ("free", "low"),
        (None, "normal"),
        ("platinum", "normal"),
        ("ENTERPRISE", "critical"),
    ],
)
def test_priority_from_plan(plan, level):
    assert plans.priority_from_plan(plan) == PriorityLevel(level)


def test_parse_plan__strict():
    with pytest.raises(InvalidPlanError, match="plan='platinum' is not allowed"):
        plans.parse_plan("platinum")


def test_priority_from_override__unknown_is_an_error():
    with pytest.raises(InvalidPriorityLevelError, match="priority_override='asap'"):
        prio.priority_from_override("asap")


def test_rule_1__explicit_level_wins_everything():
    prio.wire_tenant_plan_lookup(PLANS.get)
    result = resolve_priority(tenant_id="t-free", priority_level="high", priority_override="low")
    assert (result.level, result.numeric, result.rule) == ("high", 3, PriorityRule.EXPLICIT_LEVEL)


def test_rule_1__explicit_numeric_priority_keeps_its_number():
    result = resolve_priority(tenant_id=None, priority=7)
    assert (result.level, result.numeric, result.rule) == ("low", 7, "explicit_priority")


def test_rule_1__both_priority_and_level_is_an_error():
    with pytest.raises(ConflictingPriorityError, match="priority=1 and priority_level='low'"):
        resolve_priority(priority=1, priority_level="low")


def test_rule_1__bad_numeric_priority():
    with pytest.raises(InvalidPriorityError):
        resolve_priority(priority=-3)


def test_rule_2__override_beats_plan_and_internal():
    prio.wire_tenant_plan_lookup(PLANS.get)
    result = resolve_priority(tenant_id="t-free", priority_override="critical")
    assert (result.level, result.rule) == ("critical", PriorityRule.OVERRIDE)
    result = resolve_priority(tenant_id=None, priority_override="low")
    assert (result.level, result.rule) == ("low", PriorityRule.OVERRIDE)


def test_rule_3__internal_job_is_critical_even_with_flag_off():
    result = resolve_priority(tenant_id=None, enabled=False)
    assert (result.level, result.numeric, result.rule) == ("critical", 1, "internal")
    assert result.tenant_id is None
    assert result.tenant_bucket == "(internal)"  # apart from every tenant and "default"


def test_reserved_key__no_tenant_id_may_take_the_internal_jobs_key():
    from fairqueue import ReservedTenantIdError
    from fairqueue.exceptions import InvalidTenantError

    with pytest.raises(ReservedTenantIdError, match=r"tenant_id='\(internal\)' is not allowed"):
        resolve_priority(tenant_id="(internal)")
    assert issubclass(ReservedTenantIdError, InvalidTenantError)
    assert resolve_priority(tenant_id="default").tenant_bucket == "default"


@pytest.mark.parametrize(
    ("tenant", "level"),
    [
        ("t-ent", "critical"),
        ("t-pro", "normal"),
        ("t-free", "low"),
        ("t-odd", "normal"),
    ],
)
def test_rule_4__plan_lookup_decides(tenant, level):
    prio.wire_tenant_plan_lookup(PLANS.get)
    result = resolve_priority(tenant_id=tenant, enabled=True)
    assert (result.level, result.rule) == (level, PriorityRule.PLAN)
    assert result.tenant_id == tenant


def test_rule_4__no_plan_row_is_normal_and_says_so_not_plan():
    """A tenant the lookup has no plan for gets the default level under its own rule, so
    `EnqueuedJob.rule` tells "no plan" apart from a plan that decided; ids are
    case-sensitive: "T-ENT" is not "t-ent"."""
    prio.wire_tenant_plan_lookup(PLANS.get)
    for tenant in ("unknown", "T-ENT"):
        result = resolve_priority(tenant_id=tenant, enabled=True)
        assert (result.level, result.rule) == ("normal", PriorityRule.NO_PLAN)


def test_rule_4__failing_lookup_falls_back_to_normal():
    def broken(tenant_id):
        raise RuntimeError("db down")

    prio.wire_tenant_plan_lookup(broken)
    result = resolve_priority(tenant_id="t-ent", enabled=True)
    assert (result.level, result.rule) == ("normal", PriorityRule.PLAN_LOOKUP_FAILED)


def test_rule_5__no_lookup_is_normal():
    result = resolve_priority(tenant_id="t-ent", enabled=True)
    assert (result.level, result.numeric, result.rule) == ("normal", 5, PriorityRule.NO_LOOKUP)


def test_rule_6__no_tenant_argument_is_normal_in_default_bucket():
    result = resolve_priority()
    assert (result.level, result.rule, result.tenant_id) == ("normal", "default", "default")


def test_flag_off__plan_tenants_get_normal():
    prio.wire_tenant_plan_lookup(PLANS.get)
    result = resolve_priority(tenant_id="t-ent", enabled=False)
    assert (result.level, result.rule) == ("normal", PriorityRule.FLAG_DISABLED)


def test_flag_read_from_environment(monkeypatch):
    from fairqueue import conf

    prio.wire_tenant_plan_lookup(PLANS.get)
    monkeypatch.setenv("JOB_PRIORITY_ENABLED", "false")
    conf.reload_settings()
    try:
        assert resolve_priority(tenant_id="t-ent").level == "normal"
        monkeypatch.setenv("JOB_PRIORITY_ENABLED", "true")
        conf.reload_settings()
        assert resolve_priority(tenant_id="t-ent").level == "critical"
    finally:
        conf.reload_settings()


@pytest.mark.parametrize("bad", ["", "x" * 256, 42, b"bytes"])
def test_bad_tenant_id(bad):
    with pytest.raises(InvalidTenantError, match="tenant_id=.* is not allowed"):
        resolve_priority(tenant_id=bad)


def test_bad_tenant_id_message_does_not_echo_the_tenant():
    with pytest.raises(InvalidTenantError) as info:
        resolve_priority(tenant_id="s" * 300)
    assert "sss" not in str(info.value)


# --- tenant weights ---------------------------------------------------------------


WEIGHTS = {"t-ent": 5, "t-pro": 3}


def weights_lookup(tenant_id):
    return WEIGHTS.get(tenant_id, 1)


def plans_lookup(tenant_id):
    return PLANS.get(tenant_id)


def test_weight__no_lookup_wired_means_weight_1():
    assert resolve_priority(tenant_id="t-ent").tenant_weight == 1


def test_weight__looked_up_for_a_tenant_whatever_rule_decided_the_level():
    prio.wire_tenant_plan_lookup(PLANS.get)
    prio.wire_tenant_weight_lookup(weights_lookup)
    cases = [
        ({"enabled": True}, PriorityRule.PLAN),
        ({"enabled": False}, PriorityRule.FLAG_DISABLED),
        ({"priority_level": "low"}, PriorityRule.EXPLICIT_LEVEL),
        ({"priority": 2}, PriorityRule.EXPLICIT_PRIORITY),
        ({"priority_override": "high"}, PriorityRule.OVERRIDE),
    ]
    for kwargs, rule in cases:
        result = resolve_priority(tenant_id="t-ent", **kwargs)
        assert (result.rule, result.tenant_weight) == (rule, 5)


def test_weight__looked_up_without_a_plan_lookup_and_with_the_flag_off():
    prio.wire_tenant_weight_lookup(weights_lookup)
    result = resolve_priority(tenant_id="t-pro", enabled=False)
    assert (result.rule, result.tenant_weight) == (PriorityRule.FLAG_DISABLED, 3)
    assert resolve_priority(tenant_id="t-pro").rule == PriorityRule.NO_LOOKUP


def test_weight__internal_jobs_and_the_default_bucket_weigh_1_without_asking_the_lookup():
    asked = []
    prio.wire_tenant_weight_lookup(lambda tenant_id: asked.append(tenant_id) or 7)
    assert resolve_priority(tenant_id=None).tenant_weight == 1
    assert resolve_priority().tenant_weight == 1
    assert resolve_priority(priority_override="low").tenant_weight == 1
    assert asked == []
    assert resolve_priority(tenant_id="t-x").tenant_weight == 7
    assert asked == ["t-x"]


def test_weight__explicit_weight_wins_over_the_lookup_which_is_not_asked():
    asked = []
    prio.wire_tenant_weight_lookup(lambda tenant_id: asked.append(tenant_id) or 7)
    assert resolve_priority(tenant_id="t-ent", tenant_weight=2).tenant_weight == 2
    assert resolve_priority(tenant_id=None, tenant_weight=100).tenant_weight == 100
    assert resolve_priority(tenant_weight=1).tenant_weight == 1
    assert asked == []


def test_weight__failing_lookup_gives_1_and_logs_the_exception_type_only(caplog):
    def broken(tenant_id):
        raise RuntimeError(f"no weight for {tenant_id}")

    prio.wire_tenant_weight_lookup(broken)
    with caplog.at_level(logging.WARNING, logger="fairqueue.priority"):
        result = resolve_priority(tenant_id="secret-tenant-42", enabled=True)
    assert result.tenant_weight == 1
    assert result.rule == PriorityRule.NO_LOOKUP  # the level is unaffected
    assert "RuntimeError" in caplog.text
    assert "secret-tenant-42" not in caplog.text


@pytest.mark.parametrize("bad", [0, 101, -1, True, 2.0, "3", None])
def test_weight__lookup_answering_a_bad_weight_gives_1_and_logs(caplog, bad):
    prio.wire_tenant_weight_lookup(lambda tenant_id: bad)
    with caplog.at_level(logging.WARNING, logger="fairqueue.priority"):
        assert resolve_priority(tenant_id="secret-tenant-42").tenant_weight == 1
    assert "tenant weight lookup failed" in caplog.text
    assert "secret-tenant-42" not in caplog.text


@pytest.mark.parametrize("weight", [1, 50, 100])
def test_weight__explicit_weight_in_range_is_accepted(weight):
    assert resolve_priority(tenant_id="t", tenant_weight=weight).tenant_weight == weight


@pytest.mark.parametrize("bad", [0, 101, -3, True, False, 1.5, "3"])
def test_weight__bad_explicit_weight_names_argument_value_and_range(bad):
    with pytest.raises(InvalidTenantWeightError) as info:
        resolve_priority(tenant_id="t", tenant_weight=bad)
    assert str(info.value) == (
        f"tenant_weight={bad!r} is not allowed: expected an integer in 1..100"
    )
    assert isinstance(info.value, ValueError)


def test_weight__bad_explicit_weight_is_rejected_before_the_lookups_run():
    asked = []
    prio.wire_tenant_plan_lookup(lambda tenant_id: asked.append("plan"))
    prio.wire_tenant_weight_lookup(lambda tenant_id: asked.append("weight") or 1)
    with pytest.raises(InvalidTenantWeightError):
        resolve_priority(tenant_id="t", tenant_weight=0, enabled=True)
    assert asked == []


def test_weight__range_constants_are_exported_from_levels_and_priority():
    from fairqueue.scheduling import levels

    assert (levels.MIN_TENANT_WEIGHT, levels.MAX_TENANT_WEIGHT) == (1, 100)
    assert (prio.MIN_TENANT_WEIGHT, prio.MAX_TENANT_WEIGHT) == (1, 100)


def test_wiring__custom_plan_lookup_leaves_the_weight_lookup_alone():
    assert prio.get_tenant_weight_lookup() is None
    prio.wire_tenant_plan_lookup(plans_lookup)
    assert prio.get_tenant_weight_lookup() is None
    prio.wire_tenant_weight_lookup(weights_lookup)
    prio.wire_tenant_plan_lookup(plans_lookup)
    assert prio.get_tenant_weight_lookup() is weights_lookup


def test_wiring__default_plan_lookup_also_wires_the_database_weight_lookup():
    from fairqueue.enqueue.lookups import lookup_tenant_plan, lookup_tenant_weight

    prio.wire_tenant_plan_lookup()
    assert prio.get_tenant_plan_lookup() is lookup_tenant_plan
    assert prio.get_tenant_weight_lookup() is lookup_tenant_weight


def test_wiring__default_weight_lookup_is_the_database_one_and_unwires_on_its_own():
    from fairqueue.enqueue.lookups import lookup_tenant_weight

    prio.wire_tenant_plan_lookup(plans_lookup)
    prio.wire_tenant_weight_lookup()
    assert prio.get_tenant_weight_lookup() is lookup_tenant_weight
    prio.unwire_tenant_weight_lookup()
    assert prio.get_tenant_weight_lookup() is None
    assert prio.get_tenant_plan_lookup() is plans_lookup
    prio.wire_tenant_weight_lookup(weights_lookup)
    prio.unwire_tenant_plan_lookup()
    assert prio.get_tenant_weight_lookup() is weights_lookup
