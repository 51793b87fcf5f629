"""The console's numbers agree with each other and with BullMQ's own counts, in words an
operator reads (real Redis, each test under its own prefix)."""

from __future__ import annotations

import asyncio
import re

import pytest
from django.urls import reverse

from fairqueue.dashboard import crumbs
from fairqueue.dashboard import stats as dashboard
from fairqueue.dashboard.job_page import HELD_AFTER_MS
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.scheduling.shares import LEVEL_NAMES
from tests.helpers import bullmq_counts
from tests.helpers.console import DASHBOARD, FLOOD, JOB, QUEUE, TENANT, seed_culprits, seed_mixed
from tests.helpers.keys import REDIS_URL

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


def _numbers(html: str, attr: str) -> dict[str, str]:
    """``data-<attr>="name">value<`` pairs of a page (the first of each name)."""
    found: dict[str, str] = {}
    for name, value in re.findall(rf'data-{attr}="([^"]+)"[^>]*>([^<]*)<', html):
        found.setdefault(name, value.strip())
    return found


def _tenant_numbers(client, tenant: str) -> dict[str, str]:
    html = client.get(reverse(TENANT, args=[tenant])).content.decode()
    email = html.split('class="fq-tenant-queue" data-job-type="email"', 1)[1].split("</section>")[0]
    found = _numbers(email, "fq-t")
    found["in_line"] = ",".join(re.findall(r"data-fq-in-line>#(\d+)<", email))
    return found


def test_numbers__every_page_agrees_with_bullmqs_sets_and_each_other(
    limited, operator, redis_client
):
    """Overview, queue, tenant and job pages against BullMQ's own sets, with held,
    delayed, failed, overdue, paused and quiet tenants present."""
    ids = seed_culprits(limited, redis_client)
    key = f"{limited}:email"
    in_wait = redis_client.llen(f"{key}:wait") + redis_client.zcard(f"{key}:prioritized")
    delayed = redis_client.zrange(f"{key}:delayed", 0, -1, withscores=True)
    held = sum(1 for _, score in delayed if int(score) // 4096 >= HELD_AFTER_MS)
    failed = redis_client.zcard(f"{key}:failed")
    assert (in_wait, held, len(delayed) - held, failed) == (11, 5, 1, 6)

    overview = operator.get(reverse(DASHBOARD)).content.decode()
    row = overview.split('data-fq-overview-row="email"', 1)[1].split("</tr>", 1)[0]
    shown = _numbers(row, "fq-ov")
    assert shown == {
        "waiting": str(in_wait),
        "active": "0",
        "delayed": str(len(delayed) - held),
        "held": str(held),
        "failed": str(failed),
        "overdue": str(FLOOD),
    }
    queue = operator.get(reverse(QUEUE, args=["email"])).content.decode()
    q = _numbers(queue, "fq")
    assert q["waiting_total"] == shown["waiting"] and q["overdue_total"] == shown["overdue"]
    assert q["limits.held_total"] == shown["held"] and q["counts.failed"] == shown["failed"]
    assert int(q["counts.delayed"]) == len(delayed)
    assert sum(int(q[f"levels.{level}.waiting"]) for level in LEVEL_NAMES) == in_wait
    assert sum(int(q[f"levels.{level}.overdue"]) for level in LEVEL_NAMES) == FLOOD

    tenants = {
        t: _tenant_numbers(operator, t) for t in ("flood", "acme", "sleepy", "quiet", "doomed")
    }
    assert sum(int(t["waiting_total"]) for t in tenants.values()) == in_wait
    assert sum(int(t["held"]) for t in tenants.values()) == held
    assert sum(int(t["overdue"]) for t in tenants.values()) == FLOOD
    assert sum(int(t["failed"]) for t in tenants.values()) == failed
    # Each tenant's waiting per level is the queue page's top tenants' figure.
    top = dict(re.findall(r'/tenants/([^/]+)/">[^<]+</a> \((\d+)\)', queue.split("fq-levels")[1]))
    for tenant, found in tenants.items():
        assert top.get(tenant, "0") == found["waiting_total"], tenant
    # A tenant with nothing waiting says nothing of jobs in line; the others' places are
    # the job pages' positions and BullMQ's ranks.
    assert tenants["doomed"]["in_line"] == tenants["sleepy"]["in_line"] == ""
    wait_len = redis_client.llen(f"{key}:wait")
    for tenant in ("flood", "quiet"):
        places = [int(p) for p in tenants[tenant]["in_line"].split(",")]
        job_ids = ids[tenant]
        ranks = sorted(
            wait_len + redis_client.zrank(f"{key}:prioritized", job_id) + 1 for job_id in job_ids
        )
        assert places == ranks[: len(places)], tenant
        job = operator.get(reverse(JOB, args=["email", job_ids[0]])).content.decode()
        position = int(re.search(r"data-fq-position>(\d+)<", job).group(1))
        assert position == wait_len + redis_client.zrank(f"{key}:prioritized", job_ids[0]) + 1
        assert int(re.search(r"data-fq-ahead>(\d+)<", job).group(1)) == position - 1
    # The failures the queue page groups are the failed set's.
    groups = queue.split("data-fq-failure-groups", 1)[1].split("</table>", 1)[0]
    counts = [
        int(n)
        for n in re.findall(r"</td><td>(\d+)</td><td><a href=\"[^\"]+\">doomed</a></td>", groups)
    ]
    assert sum(counts) == failed
    # The paused tenant: one on the overview, paused on its page and in the limits table.
    assert "1 tenant(s) paused" in row
    sleepy = operator.get(reverse(TENANT, args=["sleepy"])).content.decode()
    assert "data-fq-paused-state>yes<" in sleepy
    assert 'data-fq-limited="sleepy"' in queue
