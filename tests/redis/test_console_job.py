"""The console's job page and job search: position in line and why, what is ahead of
it, a held job's reason, a failure's class and sanitized message, removal."""

from __future__ import annotations

import pytest
from django.urls import reverse

from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from tests.helpers import bullmq_counts, wait_until
from tests.helpers.console import JOB, fail_jobs

pytestmark = pytest.mark.django_db


def test_job_page__position_why_and_what_is_ahead_match_the_pop_order(
    fq_prefix, operator, redis_client
):
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="big")
    mine = enqueue_job("email", {}, tenant_id="small")
    order = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)
    html = operator.get(reverse(JOB, args=["email", mine.job_id])).content.decode()
    position = order.index(mine.job_id) + 1
    assert f"data-fq-position>{position}<" in html
    assert "stands at its flow (level normal, tenant small)&#x27;s next turn" in html
    assert f"{position - 1} job(s) come first, 0 of them its own flow" in html
    assert "/admin/fairqueue/dashboard/tenants/small/" in html
    # its expected start (docs/design.md, "When a job will start"): before any run is
    # measured there is no service rate to go by, and the page says so
    assert "data-fq-expected>unknown (no service rate measured yet)<" in html


def test_job_page__a_held_job_says_its_tenants_limit_holds_it(limited, operator):
    jobs = enqueue_jobs("email", [{} for _ in range(3)], tenant_id="acme")  # max_active 2
    html = operator.get(reverse(JOB, args=["email", jobs[2].job_id])).content.decode()
    assert "held by its tenant&#x27;s limits" in html and "year 9999" in html


def test_job_page__failure_class_and_message_without_secrets(fq_prefix, operator, redis_client):
    job = enqueue_job("email", {}, tenant_id="acme", attempts=1)
    fail_jobs(fq_prefix, "email", 1)
    assert wait_until(lambda: redis_client.zcard(f"{fq_prefix}:email:failed") == 1, 10)
    html = operator.get(reverse(JOB, args=["email", job.job_id])).content.decode()
    assert "<strong>ValueError</strong>: export broke: [hidden]" in html
    assert "hunter2" not in html and "db.example" not in html


def test_job_search_and_remove(fq_prefix, operator):
    job = enqueue_job("email", {}, tenant_id="acme")
    found = operator.get(reverse("admin:fairqueue_dashboard_jobs"), {"id": job.job_id})
    assert found["Location"] == reverse(JOB, args=["email", job.job_id])
    missing = operator.get(reverse("admin:fairqueue_dashboard_jobs"), {"id": "nope"})
    assert "No configured queue holds" in missing.content.decode()
    remove = reverse("admin:fairqueue_dashboard_job_remove", args=["email", job.job_id])
    assert operator.get(remove).status_code == 200
    assert bullmq_counts(fq_prefix, "email")["prioritized"] == 1
    assert operator.post(remove).status_code == 302
    assert bullmq_counts(fq_prefix, "email")["prioritized"] == 0
