"""Shared fixtures: every test that touches Redis gets its own BullMQ key prefix."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
import redis

from fairqueue import conf, plans
from fairqueue.broker import close_brokers
from fairqueue.enqueue import priority
from tests.fresh_project import copy_checkout, run_ok
from tests.settings import TEST_REDIS_URL  # noqa: E402 - after the imports above

REDIS_URL = os.environ.get("FAIRQUEUE_REDIS_URL", TEST_REDIS_URL)
#: This run's mark in every key prefix the suite makes (all xdist workers share it), so
#: the sweep at the end deletes this run's leftovers and never another run's keys.
RUN_ID = (os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex)[:8]


def run_prefix(kind: str = "fqtest") -> str:
    """A fresh BullMQ key prefix of this run (see :data:`RUN_ID`)."""
    return f"{kind}-{RUN_ID}-{uuid.uuid4().hex[:12]}"


def pytest_sessionfinish(session, exitstatus):
    """Delete what this run left in the suite's Redis database (a test killed half-way
    leaves its prefix): only keys under this run's prefixes, never FLUSHDB."""
    try:
        for kind in ("fqtest", "fqquick"):
            delete_prefix(f"{kind}-{RUN_ID}-*")
    except redis.RedisError:
        pass  # no Redis (tests/unit alone): nothing was written


TEST_QUEUES = {"email": "email", "report": "report", "cleanup": "cleanup"}


def delete_prefix(prefix: str, url: str = REDIS_URL) -> None:
    """Delete every key under ``prefix`` on the Redis at ``url``."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
    finally:
        client.close()


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def fq_prefix(settings):
    """A private BullMQ prefix, configured in FAIRQUEUE and removed afterwards."""
    prefix = run_prefix()
    settings.FAIRQUEUE = {"PREFIX": prefix, "QUEUES": dict(TEST_QUEUES), "REDIS_URL": REDIS_URL}
    conf.reload_settings()
    yield prefix
    close_brokers()
    delete_prefix(prefix)
    conf.reload_settings()


@pytest.fixture(autouse=True)
def _reset_plan_lookup():
    from django.core.cache import cache as django_cache

    from fairqueue.enqueue import lookups  # imports the models: not before Django is set up

    priority.unwire_tenant_plan_lookup()
    priority.unwire_tenant_weight_lookup()
    plans.set_subscription_to_plan_tier(None)
    lookups.clear_local_plans()  # a rolled-back test database sends no signals
    # nor does it drop the plans in the Django cache: a tenant paused in one test would
    # still be paused for the next one's enqueues (an add sends the lookup's pause)
    django_cache.clear()
    yield
    priority.unwire_tenant_plan_lookup()
    priority.unwire_tenant_weight_lookup()
    plans.set_subscription_to_plan_tier(None)
    lookups.clear_local_plans()


@pytest.fixture
def limited(fq_prefix):
    """Tenant 'acme' limited to 2 running jobs, 'beta' without limits, DB lookups wired
    (tests/redis/test_limits.py, tests/redis/test_limit_leaks.py)."""
    from fairqueue.enqueue.priority import wire_tenant_plan_lookup
    from fairqueue.models import TenantPlan

    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro", max_active=2)
    TenantPlan.objects.create(tenant_id="beta", plan_tier="pro")
    wire_tenant_plan_lookup()
    return fq_prefix


@pytest.fixture
def viewer(client):
    """The test client logged in as a staff user who may view the dashboard."""
    from tests.helpers import staff

    client.force_login(staff("viewer", "view_dashboard"))
    return client


@pytest.fixture
def operator(client):
    """The test client logged in as a staff user who may view the dashboard and change
    tenant plans (pause, resume, limits)."""
    from tests.helpers import staff

    client.force_login(staff("operator", "view_dashboard", "change_tenantplan"))
    return client


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> Path:
    """django-fairqueue as pip installs it: the wheel built from a clean copy of this
    checkout, installed into a directory of its own (its dependencies come from the test
    environment). It proves the package ships what a project needs (templates, static
    files, the Lua)."""
    wheels = tmp_path_factory.mktemp("wheel")
    site = tmp_path_factory.mktemp("site")

    def pip(*args: str) -> None:
        run_ok(
            [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], timeout=300
        )

    source = copy_checkout(tmp_path_factory.mktemp("source") / "django-fairqueue")
    pip("wheel", "--no-deps", "-w", str(wheels), str(source))
    (wheel,) = wheels.glob("django_fairqueue-*.whl")
    pip("install", "--no-deps", "--target", str(site), str(wheel))
    return site
