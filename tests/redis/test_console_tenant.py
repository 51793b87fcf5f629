"""The console's tenant page and its actions against a real Redis and database: its
counts against BullMQ's, search, pause/resume audited, limits applied at once, retry of
its failed jobs, removal of its waiting jobs."""

from __future__ import annotations

import math

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from fairqueue.dashboard import stats as dashboard
from fairqueue.dashboard.tenant_page import tenant_page_data
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.models import TenantPauseAudit, TenantPlan
from tests.helpers import bullmq_counts, staff, wait_until
from tests.helpers.console import fail_jobs

pytestmark = pytest.mark.django_db

TENANT = "admin:fairqueue_dashboard_tenant"
ACTION = "admin:fairqueue_dashboard_tenant_action"


@pytest.fixture
def operator(operator):
    dashboard.clear_backlog_cache()
    return operator


def test_tenant_page__its_counts_add_up_to_bullmqs(limited, operator):
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme")  # 2 takeable, 3 held
    enqueue_jobs("email", [{} for _ in range(4)], tenant_id="beta", priority_level="low")
    counts = bullmq_counts(limited, "email")
    acme = next(q for q in tenant_page_data("acme").queues if q.job_type == "email")
    beta = next(q for q in tenant_page_data("beta").queues if q.job_type == "email")
    assert (acme.waiting_total, acme.held, acme.running) == (2, 3, 0)
    assert beta.waiting["low"] == 4 and beta.held == 0
    # Every waiting job is one tenant's; every held job is delayed in BullMQ's eyes.
    assert acme.waiting_total + beta.waiting_total == counts["prioritized"] + counts["wait"]
    assert acme.held + beta.held == counts["delayed"]
    assert [j.position for j in acme.next_jobs] == [1, 2]
    html = operator.get(reverse(TENANT, args=["acme"])).content.decode()
    assert 'data-fq-t="held">3<' in html and "Numbers read at" in html
    assert "data-fq-effective-level>normal<" in html  # pro -> normal
    # where a job enqueued now would start: acme is at its limit, so not before its room
    assert 'data-fq-t="new_job_start">' in html
    assert acme.new_job_start


def test_tenant_search__exact_id_goes_to_its_page_a_prefix_lists_matches(limited, operator):
    TenantPlan.objects.create(tenant_id="acme-eu", plan_tier="enterprise")
    url = reverse("admin:fairqueue_dashboard_tenants")
    assert operator.get(url, {"q": "acme"})["Location"] == reverse(TENANT, args=["acme"])
    html = operator.get(url, {"q": "acme-"}).content.decode()
    assert 'data-fq-tenant="acme-eu"' in html and "critical" in html
    assert 'data-fq-tenant="beta"' not in html


def test_tenant_actions__pause_and_resume_confirm_on_get_act_on_post_and_are_audited(
    limited, operator
):
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="beta")
    confirm = operator.get(reverse(ACTION, args=["beta", "pause"]))
    assert confirm.status_code == 200 and not TenantPauseAudit.objects.exists()
    assert operator.post(reverse(ACTION, args=["beta", "pause"])).status_code == 302
    assert TenantPlan.objects.get(tenant_id="beta").paused
    page = next(q for q in tenant_page_data("beta").queues if q.job_type == "email")
    assert (page.held, page.waiting_total, page.next_run) == (
        2,
        0,
        "not while it is paused",
    )
    operator.post(reverse(ACTION, args=["beta", "resume"]))
    audit = list(TenantPauseAudit.objects.filter(tenant_id="beta").values_list("action", "actor"))
    assert sorted(audit) == [("paused", "operator"), ("resumed", "operator")]


def test_tenant_limits__saved_on_its_plan_and_applied_to_its_waiting_jobs_at_once(
    limited, operator, django_capture_on_commit_callbacks
):
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme")  # 2 takeable, 3 held
    url = reverse("admin:fairqueue_dashboard_tenant_limits", args=["acme"])
    form = {"weight": 3, "max_active": 4, "rate_max": "", "rate_duration_ms": "", "max_waiting": ""}
    with django_capture_on_commit_callbacks(execute=True):
        assert operator.post(url, form).status_code == 302
    plan = TenantPlan.objects.get(tenant_id="acme")
    assert (plan.weight, plan.max_active) == (3, 4)
    counts = bullmq_counts(limited, "email")
    assert (counts["prioritized"], counts["delayed"]) == (4, 1)
    assert LogEntry.objects.filter(change_message__contains="max_active").exists()


def test_tenant_weight__counted_at_once_by_its_waiting_flow_and_its_levels_total(
    fq_prefix, operator, redis_client, django_capture_on_commit_callbacks
):
    """A real backlog of two tenants of one level; the operator raises one's weight from
    the tenant page. At once (no enqueue of that tenant in between) its flow counts the
    new weight and the level's total with it: the other tenant's next job is placed by
    the new total, and the raised tenant's next one by its new weight, as the model
    places them; its jobs already waiting are placed again at a third of their distance
    from the virtual time, the other tenant's keep their places."""
    from fairqueue.broker import TAG_FLOOR, TAG_RESOLUTION
    from fairqueue.enqueue.priority import wire_tenant_plan_lookup
    from fairqueue.scheduling.fair_clock import FairClock
    from fairqueue.scheduling.levels import PriorityLevel
    from fairqueue.scheduling.order import replaced_tag

    normal = PriorityLevel.NORMAL
    TenantPlan.objects.create(tenant_id="acme", weight=1)
    wire_tenant_plan_lookup()  # enqueues look weights up, as the database has them
    key = f"{fq_prefix}:email:prioritized"
    clock, tags, owner = FairClock(), [], {}

    def place(tenant: str, count: int) -> None:
        jobs = enqueue_jobs(
            "email", [{} for _ in range(count)], tenant_id=tenant, priority_level="normal"
        )
        for job in jobs:
            tag = clock.place(normal, tenant, clock_weights[tenant])
            tags.append(tag)
            owner[job.job_id] = tenant
            clock.observe_head(min(tags), normal)
            expected = TAG_FLOOR * 2**32 + math.floor(tag * TAG_RESOLUTION) * 4 + 2
            assert redis_client.zscore(key, job.job_id) == expected

    clock_weights = {"acme": 1, "beta": 1}
    place("acme", 6)
    place("beta", 6)
    before = dict(redis_client.zscan_iter(key))
    url = reverse("admin:fairqueue_dashboard_tenant_limits", args=["acme"])
    form = {"weight": 3, "max_active": "", "rate_max": "", "rate_duration_ms": ""}
    form["max_waiting"] = ""
    with django_capture_on_commit_callbacks(execute=True):
        assert operator.post(url, form).status_code == 302
    assert redis_client.hget(f"{fq_prefix}:email:fq:fweights", "normal\nacme") == "3"
    assert redis_client.hget(f"{fq_prefix}:email:fq:state", "W:normal") == "4"
    (anchor, ratio), *_ = clock.reweight("acme", 3).values()
    assert ratio == 1 / 3
    for job_id, score in before.items():
        if owner[job_id] == "acme":
            tag = replaced_tag((score - TAG_FLOOR * 2**32) // 4 / TAG_RESOLUTION, anchor, ratio)
            before[job_id] = TAG_FLOOR * 2**32 + math.floor(tag * TAG_RESOLUTION) * 4 + 2
    assert dict(redis_client.zscan_iter(key)) == before
    tags[:] = [(score - TAG_FLOOR * 2**32) // 4 / TAG_RESOLUTION for score in before.values()]
    clock_weights["acme"] = 3
    place("beta", 2)  # at the spacing of a level total of 4, not 2
    place("acme", 2)  # at weight 3, behind its own waiting jobs


def test_tenant_retry_and_remove__its_failed_jobs_retried_its_waiting_jobs_removed(
    fq_prefix, operator, redis_client
):
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="acme", attempts=1)
    fail_jobs(fq_prefix, "email", 3)
    assert wait_until(lambda: redis_client.zcard(f"{fq_prefix}:email:failed") == 3, 10)
    page = next(q for q in tenant_page_data("acme").queues if q.job_type == "email")
    assert page.failed_count == 3
    failure = page.failed[0]
    assert failure.error_class == "ValueError"
    assert "hunter2" not in failure.message and "example" not in failure.message
    touches = operator.get(reverse(ACTION, args=["acme", "retry"])).content.decode()
    assert "email: 3 failed job(s)" in touches
    operator.post(reverse(ACTION, args=["acme", "retry"]))
    assert bullmq_counts(fq_prefix, "email")["prioritized"] == 3
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="other")
    operator.post(reverse(ACTION, args=["acme", "remove"]))
    counts = bullmq_counts(fq_prefix, "email")
    assert (counts["prioritized"], counts["failed"]) == (2, 0)
    assert LogEntry.objects.filter(change_message__startswith="Removed 3 waiting").exists()


def test_tenant_remove__a_paused_tenants_held_jobs_leave_its_held_count_at_once(
    fq_prefix, operator
):
    """Removed while paused (no release step pops a paused tenant's held list), its held
    jobs are not counted on its page any more, as BullMQ has none delayed."""
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="acme")
    operator.post(reverse(ACTION, args=["acme", "pause"]))
    assert bullmq_counts(fq_prefix, "email")["delayed"] == 3
    operator.post(reverse(ACTION, args=["acme", "remove"]))
    assert bullmq_counts(fq_prefix, "email")["delayed"] == 0
    page = next(q for q in tenant_page_data("acme").queues if q.job_type == "email")
    assert (page.held, page.held_ids) == (0, [])


def test_tenant_actions__need_the_change_permission(fq_prefix, client):
    client.force_login(staff("looker", "view_dashboard"))
    assert client.get(reverse(TENANT, args=["acme"])).status_code == 200
    assert client.get(reverse(ACTION, args=["acme", "pause"])).status_code == 403
    assert client.post(reverse(ACTION, args=["acme", "remove"])).status_code == 403


@pytest.mark.parametrize("tenant", ["acme", "ac/me é", 'a"c\\me'])
def test_tenant_jobs__picked_out_in_redis_as_reading_every_job_would(fq_prefix, tenant):
    """Its next jobs are matched inside Redis (tenant_jobs.lua): the same positions as
    reading the front of the order job by job, for ids JSON escapes and an id another
    tenant's starts with (its jobs ahead, in BullMQ's wait list): past the order's
    first page."""
    from fairqueue.broker import get_sync_broker
    from fairqueue.broker.console_reads import ORDER_PAGE, ConsoleReads, job_tenant_id
    from tests.helpers.jobs import add_foreign

    enqueue_jobs("email", [{"i": i} for i in range(3)], tenant_id=tenant)
    add_foreign(fq_prefix, *[({"tenantId": tenant + "-2"}, {})] * (ORDER_PAGE + 50))
    sync = get_sync_broker()
    reads = ConsoleReads(sync.broker.conn)
    front = sync.run(reads.order_front, "email")
    expected = [
        (pos, job.job_id) for pos, job in enumerate(front, 1) if job_tenant_id(job) == tenant
    ]
    found = sync.run(reads.tenant_jobs, "email", tenant)
    assert found.next_positions == expected and found.in_window == 3
    assert [(pos, job.job_id) for pos, job in found.next_jobs] == expected
    assert found.order_read == len(front) == ORDER_PAGE + 53
    assert [pos for pos, _ in expected] == [ORDER_PAGE + 51, ORDER_PAGE + 52, ORDER_PAGE + 53]
