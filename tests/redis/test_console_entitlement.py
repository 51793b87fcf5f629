"""One entitlement everywhere: a tenant's max-min share of its level given who is asking
now is one figure on its tenant page, in the queue's noisy table (page and JSON) and in
what ``/metrics`` counts, with a flooding tenant, a second backlogged one, a quiet
weight-2 tenant, a ``max_active``-held tenant and a paused one in one level (real Redis,
a stock BullMQ worker holding the flood's jobs)."""

from __future__ import annotations

import html as html_module
import re
import threading

import pytest
from django.urls import reverse

from fairqueue import pause_tenant
from fairqueue.broker import get_sync_broker
from fairqueue.dashboard import stats as dashboard
from fairqueue.dashboard.overview import entitled_now
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.models import TenantPlan
from fairqueue.scheduling.noisy import FlowWeight
from tests.helpers import holding_worker, wait_until
from tests.helpers.console import QUEUE
from tests.helpers.jobs import write_history

pytestmark = pytest.mark.django_db

STATS = "admin:fairqueue_dashboard_stats"
TENANT = "admin:fairqueue_dashboard_tenant"
#: The flood's jobs the worker holds running (all of its slots).
RUNNING = 4


def _page_entitled(client, tenant: str, level: str) -> str:
    page = client.get(reverse(TENANT, args=[tenant])).content.decode()
    email = page.split('class="fq-tenant-queue" data-job-type="email"', 1)[1]
    return re.search(rf'data-fq-t="entitled\.{level}">([^<]+)<', email).group(1)


def test_one_entitlement__tenant_page_noisy_table_json_and_metric_agree(
    limited, operator, redis_client
):
    TenantPlan.objects.create(tenant_id="flood", plan_tier="pro")
    TenantPlan.objects.create(tenant_id="crowd", plan_tier="pro")
    TenantPlan.objects.create(tenant_id="quiet", plan_tier="pro", weight=2)
    TenantPlan.objects.create(tenant_id="sleepy", plan_tier="pro")
    flood = enqueue_jobs("email", [{} for _ in range(20)], tenant_id="flood")
    level = flood[0].level
    started: list[str] = []
    release = threading.Event()
    thread = holding_worker(limited, RUNNING, started, release)
    thread.start()
    try:
        assert wait_until(lambda: len(started) == RUNNING, 15)
        # the last half minute: the flood's starts alone (the rate is measured)
        write_history(redis_client, limited, {(level, "flood"): 4.0})
        enqueue_jobs("email", [{} for _ in range(20)], tenant_id="crowd")
        enqueue_job("email", {}, tenant_id="quiet")  # one job: it asks for what it uses
        enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme")  # 2 in line, 3 held
        enqueue_jobs("email", [{} for _ in range(2)], tenant_id="sleepy")
        pause_tenant("sleepy", actor="test", source="test")
        dashboard.clear_backlog_cache()
        assert {j.level for j in flood} == {level}

        # What the noisy table computes, for every tenant at its counted weight.
        sync = get_sync_broker()
        weights = {"flood": 1, "crowd": 1, "quiet": 2, "acme": 1, "sleepy": 1}
        asks = {(level, tenant): FlowWeight(w, True) for tenant, w in weights.items()}
        shared = sync.run(entitled_now, sync.broker, "email", asks)
        shown = {tenant: f"{100 * shared[(level, tenant)]:.0f}%" for tenant in weights}
        # Max-min given who asks: the two floods split what the quiet and the held
        # tenants leave; the quiet tenant would get its weight's 2 parts of 4 once it
        # asks; not "weight 1 of the 5 counted" (20%).
        assert shown == {
            "flood": "50%",
            "crowd": "50%",
            "quiet": "50%",
            "acme": "33%",
            "sleepy": "33%",
        }
        # The tenant page says the same for each of them, held, paused and quiet ones too.
        for tenant, share in shown.items():
            assert _page_entitled(operator, tenant, level) == share, tenant

        # The noisy table, JSON and page: the flood runs all 4 of the level's running
        # jobs against its 50%, and the figure is the tenant page's.
        body = operator.get(reverse(STATS), {"queue": "email"}).json()
        (stats,) = body["queues"]
        noisy = stats["noisy"]
        assert [(n["tenant"], n["running"], n["entitled"]) for n in noisy["tenants"]] == [
            ("flood", RUNNING, shown["flood"])
        ]
        assert noisy["tenants"][0]["factor"] == "2.0"
        queue_page = operator.get(reverse(QUEUE, args=["email"])).content.decode()
        row = queue_page.split('data-fq-noisy="flood"', 1)[1].split("</tr>", 1)[0]
        cells = re.findall(r"<td>([^<]*)</td>", row)
        assert cells == [level, str(RUNNING), str(RUNNING), "100%", shown["flood"], "2.0"]
        # The flood's own page names the same entitlement in its verdict.
        flood_page = html_module.unescape(
            operator.get(reverse(TENANT, args=["flood"])).content.decode()
        )
        assert f"against its entitlement now of {shown['flood']}, 2.0 times it" in flood_page

        # /metrics counts the tenants the table lists, from the same figure (no tenant label).
        metrics = operator.get("/metrics").content.decode()
        counted = re.search(
            r'^queue_fair_noisy_tenants\{job_type="email",queue="email"\} (\S+)$',
            metrics,
            re.MULTILINE,
        )
        assert counted is not None and float(counted.group(1)) == noisy["count"] == 1
        assert 'tenant="' not in metrics and "flood" not in metrics
    finally:
        release.set()
        thread.join(20)
