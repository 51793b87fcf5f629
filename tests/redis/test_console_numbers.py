"""The console's numbers agree with each other and with BullMQ's own counts, in words an
operator reads (real Redis, each test under its own prefix)."""

from __future__ import annotations

import asyncio

import pytest
from django.urls import reverse

from fairqueue.dashboard import crumbs
from fairqueue.dashboard import stats as dashboard
from fairqueue.enqueue.api import enqueue_jobs
from tests.conftest import REDIS_URL
from tests.helpers import bullmq_counts
from tests.redis.test_dashboard import QUEUE, seed_mixed

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(viewer):
    dashboard.clear_backlog_cache()
    return viewer


def test_numbers__at_rest_the_by_level_scan_agrees_with_bullmq(fq_prefix):
    seed_mixed()
    stats = dashboard.queue_stats("email")
    counts = bullmq_counts(fq_prefix, "email")
    by_level = sum(level["waiting"] for level in stats["levels"].values())
    assert by_level == stats["waiting_total"] == counts["wait"] + counts["prioritized"] == 12
    assert stats["backlog"]["agrees"] is True
    assert stats["backlog"]["note"].startswith("Exact: BullMQ counts 12 waiting jobs")
    assert stats["read_at"]["at"].endswith("UTC")


def test_numbers__a_queue_that_moved_during_the_scan_is_not_called_exact(fq_prefix):
    seed_mixed()
    # As if BullMQ's counts were read before 5 more jobs arrived and the scan after.
    counts = dashboard.get_sync_broker().run(
        dashboard.get_sync_broker().broker.passes.counts, "email"
    )
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="late")
    from fairqueue.dashboard.moment import settle_exact

    sync = dashboard.get_sync_broker()
    scan = sync.run(sync.broker.dashboard.scan_backlog, "email", cutoff_ms=0)
    settled = sync.run(settle_exact, sync.broker, "email", counts, scan, {"exact": True})
    assert settled["agrees"] is False
    assert "counted 12 waiting jobs before the by-level scan and 17 after" in settled["note"]


def test_words__no_internal_names_backticks_or_a_default_tenant_on_the_page(viewer, fq_prefix):
    from bullmq import Queue

    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="acme")

    async def add_foreign() -> None:
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        await queue.add("foreign", {"from": "node"})
        await queue.close()

    asyncio.run(add_foreign())
    html = viewer.get(reverse(QUEUE, args=["email"])).content.decode()
    assert "(no tenant)" in html and ">default<" not in html
    assert "weighted_fair" not in html and "its flow&#x27;s fair turn" in html
    assert "`" not in html.split("<body", 1)[1]
    assert "Numbers read at" in html


@pytest.mark.parametrize("as_list", [False, True])
def test_breadcrumbs__in_the_markup_the_running_admin_styles(
    viewer, fq_prefix, as_list, monkeypatch
):
    monkeypatch.setattr(crumbs, "AS_LIST", as_list)
    html = viewer.get(reverse(QUEUE, args=["email"])).content.decode()
    if as_list:  # Django 6
        assert '<ol class="breadcrumbs"><li><a href="/admin/">Home</a></li>' in html
        assert '<li aria-current="page">email</li></ol>' in html
    else:  # Django 5.2
        assert '<div class="breadcrumbs"><a href="/admin/">Home</a> &rsaquo; ' in html
        assert "&rsaquo; email</div>" in html
