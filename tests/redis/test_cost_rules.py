"""What keeps fairqueue's per-job cost down : lookups once per call, a warm
lookup that asks neither the Django cache nor the database, and how fast a plan change
reaches every process (in-process cache + the shared version token)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.cache import cache
from django.core.cache.backends.locmem import LocMemCache
from django.db import transaction

from fairqueue.enqueue import lookups
from fairqueue.enqueue import priority as prio
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.enqueue.lookups import (
    VERSION_CHECK_S,
    LocalPlans,
    _tenant_key,
    forget_tenant_plan,
    lookup_tenant_plan,
    lookup_tenant_weight,
)
from fairqueue.models import ClassifierRule, SubscriptionClassifier, TenantPlan
from fairqueue.scheduling.limits import NO_LIMITS
from tests.helpers.keys import REDIS_URL

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


class CountingCache(LocMemCache):
    """A LocMemCache that counts the calls made to it: each stands for a round trip to a
    shared cache (a Redis call with django-redis)."""

    calls: list[str] = []

    def get(self, *args, **kwargs):
        CountingCache.calls.append("get")
        return super().get(*args, **kwargs)

    def get_many(self, keys, *args, **kwargs):
        CountingCache.calls.append("get_many")
        found = {}
        for key in keys:  # not super().get_many: it calls get(), which counts
            value = LocMemCache.get(self, key, *args, **kwargs)
            if value is not None:
                found[key] = value
        return found

    def set(self, *args, **kwargs):
        CountingCache.calls.append("set")
        return super().set(*args, **kwargs)

    def delete(self, *args, **kwargs):
        CountingCache.calls.append("delete")
        return super().delete(*args, **kwargs)

    def incr(self, *args, **kwargs):
        CountingCache.calls.append("incr")
        return super().incr(*args, **kwargs)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def counting_cache(settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "tests.redis.test_cost_rules.CountingCache",
            "LOCATION": "fairqueue-cost-rules",
        }
    }
    cache.clear()
    CountingCache.calls.clear()
    yield CountingCache.calls
    cache.clear()


@pytest.fixture
def clock(monkeypatch):
    """This process's in-memory plans on a clock the test moves."""
    fake = Clock()
    monkeypatch.setattr(lookups, "_local", LocalPlans(clock=fake))
    return fake


def as_process(monkeypatch, local: LocalPlans) -> None:
    """Run the next lookups as another process would: with its own in-memory plans (the
    Django cache and the database are what processes share)."""
    monkeypatch.setattr(lookups, "_local", local)


# -- once per call ------------------------------------------------------------------------


def test_enqueue_jobs__asks_each_lookup_once_per_call(fq_prefix):
    asked: list[str] = []
    prio.wire_tenant_plan_lookup(lambda tenant_id: asked.append("plan") or "enterprise")
    prio.wire_tenant_weight_lookup(lambda tenant_id: asked.append("weight") or 3)
    jobs = enqueue_jobs("email", [{"i": i} for i in range(300)], tenant_id="t")
    assert asked == ["plan", "weight"]
    assert {(job.level, job.tenant_weight) for job in jobs} == {("critical", 3)}
    enqueue_job("email", {}, tenant_id="t")
    assert asked == ["plan", "weight"] * 2


# -- a warm lookup asks nothing -----------------------------------------------------------


def test_warm_enqueue__no_cache_and_no_database_round_trip(
    fq_prefix, counting_cache, clock, django_assert_num_queries
):
    TenantPlan.objects.create(tenant_id="t", plan_tier="enterprise", weight=4)
    prio.wire_tenant_plan_lookup()
    enqueue_job("email", {}, tenant_id="t")  # cold: the cache, then the database
    assert counting_cache
    counting_cache.clear()
    with django_assert_num_queries(0):
        job = enqueue_job("email", {}, tenant_id="t")
        batch = enqueue_jobs("email", [{}] * 10, tenant_id="t")
        level = enqueue_job("email", {}, tenant_id="t", priority_level="low")
    assert (job.level, job.tenant_weight, job.rule) == ("critical", 4, "plan")
    assert {(b.level, b.tenant_weight) for b in batch} == {("critical", 4)}
    assert (level.level, level.tenant_weight) == ("low", 4)
    assert counting_cache == []
    # Once a second the process reads the version token: one cache call, no query.
    clock.now += VERSION_CHECK_S
    with django_assert_num_queries(0):
        enqueue_job("email", {}, tenant_id="t")
    assert counting_cache == ["get"]


def test_local_entries_expire_after_plan_local_cache_timeout(
    settings, counting_cache, clock, django_assert_num_queries
):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "PLAN_LOCAL_CACHE_TIMEOUT": 5}
    TenantPlan.objects.create(tenant_id="t", plan_tier="pro", weight=2)
    assert lookup_tenant_plan("t") == "pro"
    TenantPlan.objects.filter(tenant_id="t").update(weight=7)  # no signal
    clock.now += 4.9
    assert lookup_tenant_weight("t") == 2  # the local entry
    clock.now += 0.1
    counting_cache.clear()
    with django_assert_num_queries(0):
        assert lookup_tenant_weight("t") == 2  # the shared entry: still the old row
    assert "get_many" in counting_cache


def test_plan_local_cache_timeout_0__every_lookup_asks_the_django_cache(settings, counting_cache):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "PLAN_LOCAL_CACHE_TIMEOUT": 0}
    TenantPlan.objects.create(tenant_id="t", plan_tier="pro")
    lookup_tenant_plan("t")
    counting_cache.clear()
    assert [lookup_tenant_plan("t") for _ in range(3)] == ["pro"] * 3
    assert counting_cache == ["get_many"] * 3


# -- a change reaches every process -------------------------------------------------------


def test_plan_change_reaches_another_process_within_version_check_s(monkeypatch, clock):
    """Two processes share the database and the Django cache; each has its own memory.
    A change saved in one is seen by the other within VERSION_CHECK_S, although the
    other's local entry would live PLAN_LOCAL_CACHE_TIMEOUT (10 s)."""
    here = lookups._local
    there = LocalPlans(clock=clock)
    plan = TenantPlan.objects.create(tenant_id="t", plan_tier="free", weight=1)
    assert (lookup_tenant_plan("t"), lookup_tenant_weight("t")) == ("free", 1)
    as_process(monkeypatch, there)
    assert (lookup_tenant_plan("t"), lookup_tenant_weight("t")) == ("free", 1)

    as_process(monkeypatch, here)
    plan.plan_tier, plan.weight = "enterprise", 5
    plan.save()  # the signal: forgotten here at once, a new version token for the rest
    assert (lookup_tenant_plan("t"), lookup_tenant_weight("t")) == ("enterprise", 5)

    as_process(monkeypatch, there)
    clock.now += VERSION_CHECK_S - 0.01
    assert lookup_tenant_plan("t") == "free"  # not yet checked: the bound, not sooner
    clock.now += 0.01
    assert (lookup_tenant_plan("t"), lookup_tenant_weight("t")) == ("enterprise", 5)


def test_rule_change_reaches_another_process_within_version_check_s(monkeypatch, clock):
    classifier = SubscriptionClassifier.objects.create(name="stripe", default_tier="free")
    rule = ClassifierRule.objects.create(
        classifier=classifier, position=0, product_id="", plan_tier="pro"
    )
    TenantPlan.objects.create(
        tenant_id="t", subscription={"products": [{"subscriptionProductId": "p"}]}
    )
    there = LocalPlans(clock=clock)
    as_process(monkeypatch, there)
    assert lookup_tenant_plan("t") == "pro"
    as_process(monkeypatch, LocalPlans(clock=clock))
    rule.plan_tier = "enterprise"
    rule.save()
    as_process(monkeypatch, there)
    assert lookup_tenant_plan("t") == "pro"
    clock.now += VERSION_CHECK_S
    assert lookup_tenant_plan("t") == "enterprise"


def test_forget_tenant_plan_after_an_update_reaches_another_process(monkeypatch, clock):
    TenantPlan.objects.create(tenant_id="t", weight=2)
    there = LocalPlans(clock=clock)
    as_process(monkeypatch, there)
    assert lookup_tenant_weight("t") == 2
    as_process(monkeypatch, LocalPlans(clock=clock))
    TenantPlan.objects.filter(tenant_id="t").update(weight=6)
    forget_tenant_plan("t")
    as_process(monkeypatch, there)
    clock.now += VERSION_CHECK_S
    assert lookup_tenant_weight("t") == 6


def test_change_in_a_transaction_is_forgotten_again_on_commit(
    clock, django_capture_on_commit_callbacks
):
    """A process that reads the row between the save and the commit caches the old
    value; the commit forgets it again."""
    plan = TenantPlan.objects.create(tenant_id="t", plan_tier="free")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with transaction.atomic():
            plan.plan_tier = "enterprise"
            plan.save()
            # Another process, not seeing the uncommitted row, caches the old one.
            cache.set(_tenant_key("t"), (lookups._ENTRY, 0, ("free", 1, NO_LIMITS, None)))
            lookups._local.get("t")  # the version check of this second
            lookups._local.put("t", ("free", 1, NO_LIMITS, None), 10, lookups._local.epoch)
            assert lookup_tenant_plan("t") == "free"
    assert callbacks
    assert lookup_tenant_plan("t") == "enterprise"


def test_a_value_fetched_before_a_drop_is_not_kept_after_it(clock):
    local = LocalPlans(clock=clock)
    epoch = local.epoch
    local.forget("t")  # a change while the value was being fetched
    local.put("t", ("free", 1, NO_LIMITS, None), 10, epoch)
    assert local.get("t") is None
    local.put("t", ("pro", 1, NO_LIMITS, None), 10, local.epoch)
    assert local.get("t")[:2] == ("pro", 1)


def test_local_plans_keep_a_bounded_number_of_tenants(clock, monkeypatch):
    monkeypatch.setattr(lookups, "MAX_LOCAL_TENANTS", 3)
    local = LocalPlans(clock=clock)
    local.get("warm-up")  # reads the version once
    for tenant in "abcd":
        local.put(tenant, (None, 1, NO_LIMITS, None), 10, local.epoch)
    assert [(local.get(t) or (None,))[:2] for t in "abcd"] == [
        (None,),
        (None, 1),
        (None, 1),
        (None, 1),
    ]


CHILD = """
import json, os, sys, time
import django
django.setup()
from django.test.utils import override_settings
with override_settings(CACHES=json.loads(os.environ["FQ_CACHES"])):
    from fairqueue.enqueue.lookups import LocalPlans
    local = LocalPlans()
    local.get("t")  # reads the version token
    local.put("t", ("free", 1), 3600, local.epoch)
    sys.stdin.readline()
    time.sleep(1.1)  # past a version check: nothing changed yet, the entry stays
    print(json.dumps({"kept": local.get("t") is not None}), flush=True)
    sys.stdin.readline()  # the parent changed the plan
    changed = time.monotonic()
    while local.get("t") is not None and time.monotonic() - changed < 30:
        time.sleep(0.01)
    print(json.dumps({"dropped": local.get("t") is None,
                      "after_s": time.monotonic() - changed}), flush=True)
"""


def test_a_change_reaches_a_real_other_process_through_a_shared_cache(fq_prefix, settings):
    """Another interpreter with a Redis-backed Django cache drops its in-memory entry
    (kept for an hour) once this process forgets the tenant: within VERSION_CHECK_S,
    with slack for a loaded machine."""
    caches = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": fq_prefix,  # removed with the prefix's keys afterwards
        }
    }
    settings.CACHES = caches
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "FQ_CACHES": json.dumps(caches),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child.stdin.write("check\n")
        child.stdin.flush()
        assert json.loads(child.stdout.readline()) == {"kept": True}
        forget_tenant_plan("t")
        child.stdin.write("go\n")
        child.stdin.flush()
        report = json.loads(child.stdout.readline())
    finally:
        child.kill()
        child.wait(10)
    assert report["dropped"], report
    assert report["after_s"] <= VERSION_CHECK_S + 5, report
