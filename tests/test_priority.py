import pytest

from fairqueue import priority as prio
from fairqueue.exceptions import (
    ConflictingPriorityError,
    InvalidPlanError,
    InvalidPriorityError,
    InvalidPriorityLevelError,
    InvalidTenantError,
)
from fairqueue.levels import PriorityLevel
from fairqueue.priority import PriorityRule, resolve_priority

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
    assert prio.priority_from_plan(plan) == PriorityLevel(level)


def test_parse_plan__strict():
    with pytest.raises(InvalidPlanError, match="plan='platinum' is not allowed"):
        prio.parse_plan("platinum")


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
    assert result.tenant_bucket == "default"


@pytest.mark.parametrize(
    ("tenant", "level"),
    [
        ("t-ent", "critical"),
        ("t-pro", "normal"),
        ("t-free", "low"),
        ("t-odd", "normal"),
        ("unknown", "normal"),
    ],
)
def test_rule_4__plan_lookup_decides(tenant, level):
    prio.wire_tenant_plan_lookup(PLANS.get)
    result = resolve_priority(tenant_id=tenant, enabled=True)
    assert (result.level, result.rule) == (level, PriorityRule.PLAN)
    assert result.tenant_id == tenant


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
