"""Shared fixtures: every test that touches Redis gets its own BullMQ key prefix. Test
modules take fixtures from here and helpers from tests/helpers/, never from each other
(tests/unit/test_house.py checks it)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import redis

from fairqueue import conf, plans
from fairqueue.broker import close_brokers
from fairqueue.enqueue import priority
from tests.helpers.fresh_project import copy_checkout, run_ok
from tests.helpers.keys import REDIS_URL, RUN_ID, TEST_QUEUES, delete_prefix, run_prefix
from tests.helpers.node import NODE_DIR
from tests.helpers.servers import (
    CLUSTER_PREFIX,
    CLUSTER_QUEUES,
    LocalCluster,
    cluster_support,
    start_cluster,
)


def pytest_sessionfinish(session, exitstatus):
    """Delete what this run left in the suite's Redis database (a test killed half-way
    leaves its prefix): only keys under this run's prefixes, never FLUSHDB. Under xdist
    only the controller sweeps, once every worker is done: a worker that finished first
    would delete the keys of the tests the others still run (all share the run's id)."""
    if hasattr(session.config, "workerinput"):
        return
    try:
        for kind in ("fqtest", "fqquick"):
            delete_prefix(f"{kind}-{RUN_ID}-*")
    except redis.RedisError:
        pass  # no Redis (tests/unit alone): nothing was written


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


@pytest.fixture(scope="module")
def node_worker():
    """The argv of tests/node/worker.mjs (a stock Node BullMQ worker recording its order);
    skipped without Node (failed in CI)."""
    node = shutil.which("node")
    installed = (NODE_DIR / "node_modules" / "bullmq").is_dir()
    if node is None or not installed:
        if os.environ.get("CI"):
            pytest.fail("node and tests/node/node_modules are required in CI (.ci/run installs)")
        pytest.skip("node or tests/node/node_modules missing (run: cd tests/node && npm ci)")
    return [node, str(NODE_DIR / "worker.mjs")]


@pytest.fixture
def node():
    """The path of ``node`` (for tests/helpers/node.py's workers); skipped without it."""
    if shutil.which("node") is None or not (NODE_DIR / "node_modules" / "bullmq").is_dir():
        pytest.skip("node or tests/node/node_modules missing (run: cd tests/node && npm ci)")
    return shutil.which("node")


@pytest.fixture(scope="session")
def redis_cluster():
    """A private 3-master Redis Cluster for the session (tests/helpers/servers.py)."""
    reason = cluster_support()
    if reason is not None:
        pytest.skip(f"no local Redis Cluster: {reason}")
    cluster = start_cluster(3)
    yield cluster
    cluster.stop()


@pytest.fixture
def on_cluster(redis_cluster: LocalCluster, settings):
    """fairqueue configured for the private cluster; emptied afterwards."""
    from fairqueue.dashboard.stats import clear_backlog_cache

    settings.FAIRQUEUE = {
        "REDIS": {"cluster": redis_cluster.nodes},
        "PREFIX": CLUSTER_PREFIX,
        "QUEUES": dict(CLUSTER_QUEUES),
    }
    conf.reload_settings()
    clear_backlog_cache()
    yield redis_cluster
    close_brokers()
    clear_backlog_cache()
    redis_cluster.flush()
    conf.reload_settings()
