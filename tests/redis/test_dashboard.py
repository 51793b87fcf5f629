"""The admin dashboard against a real Redis: permissions, the stats function and its JSON
endpoint, job detail and payload permission, the rebalance action, Redis down."""

from __future__ import annotations

import json
import time

import pytest
import redis as redis_lib
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from fairqueue import conf
from fairqueue.broker import close_brokers
from fairqueue.dashboard import stats as dashboard
from fairqueue.dashboard.stats import queue_stats
from fairqueue.dashboard.wording import format_duration
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.rebalance.leadership import LeaderLock
from fairqueue.rebalance.passes import rebalance_queue
from tests.helpers import drain_with_stock_worker, staff, wait_until
from tests.helpers.console import DASHBOARD, JOB, QUEUE, age_jobs, seed_mixed
from tests.helpers.jobs import add_foreign
from tests.helpers.keys import REDIS_URL, TEST_QUEUES

pytestmark = pytest.mark.django_db

STATS = "admin:fairqueue_dashboard_stats"
REBALANCE = "admin:fairqueue_dashboard_rebalance"
STATES = {"wait", "prioritized", "active", "delayed", "failed", "completed"}


@pytest.fixture(autouse=True)
def _fresh_backlog_cache():
    dashboard.clear_backlog_cache()
    yield
    dashboard.clear_backlog_cache()


def enqueued_at(redis_client, prefix, job, queue="email") -> int:
    return int(redis_client.hget(f"{prefix}:{queue}:{job.job_id}", "timestamp"))


# -- permissions -------------------------------------------------------------------------


@pytest.mark.parametrize("name", [DASHBOARD, STATS])
def test_permissions__anonymous_is_sent_to_login(client, fq_prefix, name):
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert reverse("admin:login") in response["Location"]


def test_permissions__non_staff_user_is_sent_to_login(client, fq_prefix):
    user = User.objects.create_user("plain", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_dashboard"))
    client.force_login(user)
    assert client.get(reverse(DASHBOARD)).status_code == 302


@pytest.mark.parametrize(
    "url",
    [
        lambda: reverse(DASHBOARD),
        lambda: reverse(STATS),
        lambda: reverse(QUEUE, args=["email"]),
        lambda: reverse(JOB, args=["email", "1"]),
        lambda: reverse(REBALANCE, args=["email"]),
    ],
)
def test_permissions__staff_without_permission_gets_403(client, fq_prefix, url):
    client.force_login(staff("nobody"))
    assert client.get(url()).status_code == 403


def test_permissions__view_dashboard_gets_200_and_the_index_links_it(viewer, fq_prefix):
    response = viewer.get(reverse(DASHBOARD))
    assert response.status_code == 200
    assert b"Fair queue dashboard" in response.content
    assert all(f'data-job-type="{jt}"'.encode() in response.content for jt in TEST_QUEUES)
    assert reverse(DASHBOARD).encode() in viewer.get(reverse("admin:index")).content
    # The dashboard's link stays out of the index of users without the permission.
    viewer.force_login(staff("other"))
    assert reverse(DASHBOARD).encode() not in viewer.get(reverse("admin:index")).content


def test_permissions__no_add_change_or_delete_pages(viewer, fq_prefix):
    response = viewer.get("/admin/fairqueue/dashboard/add/")
    assert response.status_code in (302, 404)  # admin's catch-all, never a table query


# -- the stats and the JSON endpoint -----------------------------------------------------


def test_stats_json__shape_against_a_real_queue(viewer, fq_prefix):
    jobs = seed_mixed()
    response = viewer.get(reverse(STATS), {"queue": "email", "per_page": 5})
    assert response.status_code == 200
    body = response.json()
    assert body["redis"] == "ok" and isinstance(body["generated_at_ms"], int)
    (stats,) = body["queues"]
    assert stats["job_type"] == "email" and stats["queue"] == "email"
    assert set(stats["counts"]) == STATES
    assert stats["counts"]["prioritized"] == len(jobs) == stats["waiting_total"]
    assert stats["max_wait_ms"] == 300_000 and stats["max_wait"] == "5m 00s"
    assert list(stats["levels"]) == ["critical", "high", "normal", "low"]
    for level in stats["levels"].values():
        assert level["waiting"] == 3 and level["overdue"] == 0
        assert set(level) >= {"weight", "oldest_ms", "oldest_age", "top_tenants", "waiting_pct"}
    assert stats["levels"]["low"]["top_tenants"] == [
        {
            "tenant": "t-a",
            "display": "t-a",
            "waiting": 3,
            "tenant_url": reverse("admin:fairqueue_dashboard_tenant", args=["t-a"]),
        }
    ]
    assert stats["levels"]["critical"]["weight"] == 4
    assert stats["backlog"]["exact"] is True and stats["overdue_total"] == 0
    order = stats["order"]
    assert (order["page"], order["per_page"], order["num_pages"]) == (1, 5, 3)
    assert [row["position"] for row in order["jobs"]] == [1, 2, 3, 4, 5]
    row = order["jobs"][0]
    assert set(row) >= {
        "job_id",
        "name",
        "level",
        "tenant",
        "waited",
        "decision",
        "overdue",
        "drift",
    }
    assert "data" not in row and "payload" not in json.dumps(stats)  # no payloads here
    assert stats["last_pass"] is None and stats["lock"]["holder"] is None
    assert any("no rebalancer holds the leader lock" in w for w in stats["warnings"])
    # Every queue when none is named.
    everything = viewer.get(reverse(STATS)).json()
    assert [q["job_type"] for q in everything["queues"]] == list(TEST_QUEUES)


def test_order__is_what_a_stock_worker_pops(fq_prefix, redis_client):
    seed_mixed(n_per_level=6)
    rebalance_queue("email", rebalancer="test")
    stats = queue_stats("email", per_page=20)
    shown = [row["job_id"] for row in stats["order"]["jobs"]]
    assert len(shown) == 20
    assert shown == redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, 19)
    assert stats["order"]["drift_count"] == 0
    assert all(
        row["drift"] is False and row["decision"] == "weighted_fair"
        for row in stats["order"]["jobs"]
    )
    assert stats["last_pass"]["by"] == "test"
    assert stats["last_pass"]["wrote"]["adopted"] == 0
    processed = drain_with_stock_worker(fq_prefix, "email", 20)
    assert [job_id for job_id, _ in processed] == shown


def test_order__pages_go_deep_in_pop_order(fq_prefix):
    enqueue_jobs("email", [{"i": i} for i in range(30)], tenant_id="t")
    first = queue_stats("email", page=1, per_page=10)["order"]["jobs"]
    second = queue_stats("email", page=3, per_page=10)["order"]["jobs"]
    assert [row["position"] for row in second] == list(range(21, 31))
    everything = queue_stats("email", page=1, per_page=30)["order"]["jobs"]
    assert [r["job_id"] for r in everything[:10]] == [r["job_id"] for r in first]
    assert [r["job_id"] for r in everything[20:]] == [r["job_id"] for r in second]
    assert queue_stats("email", page=4, per_page=10)["order"]["jobs"] == []


def test_unplaced__other_producers_jobs_are_flagged_until_a_pass_places_them(fq_prefix):
    enqueue_jobs("email", [{"i": i} for i in range(5)], tenant_id="flood")
    (legacy,) = add_foreign(fq_prefix, ({"x": 1}, {}))  # priority 0: ahead of everything
    stats = queue_stats("email")
    assert stats["order"]["drift_count"] == 1
    top = stats["order"]["jobs"][0]
    assert top["drift"] is True and top["job_id"] == legacy
    assert any("wait outside the fair order" in w for w in stats["warnings"])
    rebalance_queue("email")
    after = queue_stats("email")
    assert after["order"]["drift_count"] == 0
    assert not any(row["drift"] for row in after["order"]["jobs"])
    assert not any("wait outside the fair order" in w for w in after["warnings"])  # banner gone


@pytest.mark.parametrize("window", [1, 2, 3, 6, 9, 40])
def test_unplaced__counted_from_the_scores_as_reading_every_job_of_the_head(
    fq_prefix, redis_client, window
):
    """The head's unplaced count comes from the prioritized set's scores (no job read):
    the wait list's jobs, other producers' priorities below the tag band, and a job
    BullMQ re-added at the cap past it, whatever the window cuts."""
    from fairqueue.broker import MAX_PRIORITY, get_sync_broker
    from fairqueue.broker.common import SCORE_BASE
    from fairqueue.dashboard.order_rows import is_unplaced

    placed = enqueue_jobs("email", [{"i": i} for i in range(6)], tenant_id="t")
    add_foreign(fq_prefix, ({"x": 1}, {}), ({"x": 2}, {}))  # the wait list
    add_foreign(fq_prefix, ({"x": 3}, {"priority": 5}), ({"x": 4}, {"priority": 9}))
    rerun = placed[2].job_id  # as BullMQ re-adds a job that runs again: at the cap
    redis_client.zadd(f"{fq_prefix}:email:prioritized", {rerun: MAX_PRIORITY * SCORE_BASE + 7})
    sync = get_sync_broker()
    head = sync.run(sync.broker.dashboard.read_page, "email", start=0, count=window)
    expected = (len(head), sum(1 for job in head if is_unplaced(job)))
    assert sync.run(sync.broker.dashboard.head_unplaced, "email", window=window) == expected
    if window == 40:
        assert expected == (10, 5)


def test_overdue__counted_per_level_and_badged(fq_prefix, redis_client):
    fresh = enqueue_jobs("report", [{"i": i} for i in range(4)], tenant_id="t1")
    old = enqueue_jobs("report", [{"i": i} for i in range(3)], tenant_id="t2", priority_level="low")
    age_jobs(redis_client, fq_prefix, "report", [job.job_id for job in old], by_ms=400_000)
    stats = queue_stats("report")
    assert stats["overdue_total"] == 3
    assert stats["levels"]["low"]["overdue"] == 3 and stats["levels"]["normal"]["overdue"] == 0
    assert stats["levels"]["low"]["oldest_age_ms"] >= 400_000
    assert stats["levels"]["low"]["age_pct"] == 100.0
    assert any("waited longer than the 5m 00s bound" in w for w in stats["warnings"])
    rows = {row["job_id"]: row for row in stats["order"]["jobs"]}
    assert all(rows[job.job_id]["overdue"] for job in old)
    assert not any(rows[job.job_id]["overdue"] for job in fresh)
    # Overdue jobs keep their flow's turns (docs/design.md, "The wait bound"): nothing to move.
    assert stats["order"]["drift_count"] == 0
    assert (
        sorted(r["decision"] for r in stats["order"]["jobs"])
        == ["aged"] * 3 + ["weighted_fair"] * 4
    )


def test_backlog__large_backlog_is_scanned_in_the_background_and_says_so(fq_prefix):
    enqueue_jobs("email", [{"i": i} for i in range(12)], tenant_id="t")
    first = queue_stats("email", sync_scan_limit=5)
    assert first["backlog"]["exact"] is False and first["backlog"]["pending"] is True
    assert first["levels"]["normal"]["waiting"] is None and first["overdue_total"] is None
    assert first["order"]["jobs"]  # the live order does not wait for the scan
    assert wait_until(
        lambda: queue_stats("email", sync_scan_limit=5)["levels"]["normal"]["waiting"] == 12
    )
    later = queue_stats("email", sync_scan_limit=5)
    assert later["backlog"]["pending"] is False and "background scan" in later["backlog"]["note"]
    assert later["counts"]["prioritized"] == 12  # live, never cached


def test_order__a_foreign_priority_0_job_in_the_wait_list_is_shown_first(fq_prefix):
    import asyncio

    from bullmq import Queue

    enqueue_jobs("email", [{"i": i} for i in range(3)], tenant_id="t")

    async def add_foreign():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": fq_prefix})
        job = await queue.add("foreign", {"from": "node"})
        await queue.close()
        return job.id

    foreign_id = asyncio.run(add_foreign())
    stats = queue_stats("email")
    rows = stats["order"]["jobs"]
    assert stats["counts"]["wait"] == 1 and rows[0]["job_id"] == foreign_id
    # A job without a tenant is not shown as a tenant called "default".
    assert (rows[0]["name"], rows[0]["level"], rows[0]["tenant"]) == ("foreign", "normal", None)
    assert rows[0]["tenant_display"] == "(no tenant)"
    assert stats["levels"]["normal"]["top_tenants"][-1]["display"] == "(no tenant)"
    assert stats["levels"]["normal"]["waiting"] == 4
    shown = [row["job_id"] for row in rows]
    assert [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 4)] == shown


def test_page_renders_counts_levels_order_chart_and_bound(viewer, fq_prefix, redis_client):
    jobs = seed_mixed()
    age_jobs(redis_client, fq_prefix, "email", [jobs[0].job_id], by_ms=301_000)
    response = viewer.get(reverse(QUEUE, args=["email"]), {"per_page": 50})
    assert response.status_code == 200
    html = response.content.decode()
    for job in jobs:
        assert f'data-job-id="{job.job_id}"' in html
    assert "fq-badge fq-overdue" in html
    assert 'data-fq="overdue_total" class="fq-overdue-total">1<' in html
    assert "max wait bound" in html and "5m 00s" in html
    assert "<svg" in html and "data-fq-width" in html
    assert "cdn" not in html.lower() and "https://" not in html
    assert "Run one pass now" not in html  # no run_rebalance permission


def test_page__user_text_is_escaped(viewer, fq_prefix):
    enqueue_job("email", {}, tenant_id="<script>alert(1)</script>")
    html = viewer.get(reverse(DASHBOARD)).content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_bad_input__unknown_queue_404_and_bad_page_numbers_clamped(viewer, fq_prefix):
    assert viewer.get(reverse(QUEUE, args=["nope"])).status_code == 404
    assert viewer.get(reverse(STATS), {"queue": "nope"}).status_code == 404
    body = viewer.get(reverse(STATS), {"queue": "email", "page": "x", "per_page": "9999"}).json()
    assert (body["queues"][0]["order"]["page"], body["queues"][0]["order"]["per_page"]) == (
        1,
        200,
    )


# -- job detail --------------------------------------------------------------------------


def test_job_detail__metadata_without_payload_unless_permitted(client, fq_prefix):
    job = enqueue_job("email", {"secret": "s3cr3t-value"}, tenant_id="acme", attempts=3)
    url = reverse(JOB, args=["email", job.job_id])
    client.force_login(staff("viewer", "view_dashboard"))
    response = client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "s3cr3t-value" not in html
    assert "acme" in html and "normal" in html and "prioritized" in html
    assert "0 made of 3 allowed" in html
    assert str(job.bullmq_priority) in html
    assert "fairqueue.view_job_payload" in html
    client.force_login(staff("reader", "view_dashboard", "view_job_payload"))
    assert "s3cr3t-value" in client.get(url).content.decode()


def test_job_detail__unknown_ids_and_queue_keys_are_404(viewer, fq_prefix):
    enqueue_job("email", {}, tenant_id="t")
    for job_id in ("999", "wait", "meta", "prioritized", "events", "id", "a:b"):
        assert viewer.get(reverse(JOB, args=["email", job_id])).status_code == 404, job_id


# -- the rebalance action ----------------------------------------------------------------


def test_rebalance__get_confirms_post_runs_and_logs(client, fq_prefix):
    enqueue_jobs("email", [{"i": i} for i in range(5)], tenant_id="flood")
    add_foreign(fq_prefix, ({"tenantId": "sparse"}, {}))
    user = staff("ops", "view_dashboard", "run_rebalance")
    client.force_login(user)
    url = reverse(REBALANCE, args=["email"])
    assert b"Run one pass now" in client.get(reverse(DASHBOARD)).content
    confirm = client.get(url)
    assert confirm.status_code == 200 and b"Yes, run one pass" in confirm.content
    assert queue_stats("email")["last_pass"] is None  # GET changed nothing
    done = client.post(url, follow=True)
    assert done.redirect_chain[-1][0] == reverse(QUEUE, args=["email"])
    assert b"Ran one pass" in done.content
    stats = queue_stats("email")
    assert stats["last_pass"]["by"] == "admin:ops"
    assert stats["last_pass"]["wrote"]["adopted"] == 1
    assert stats["order"]["drift_count"] == 0
    assert stats["lock"]["holder"] is None  # released after the pass
    entry = LogEntry.objects.get()
    assert (entry.user_id, entry.object_id) == (user.pk, "email")
    assert "rebalance pass" in entry.change_message and "sparse" not in entry.change_message
    # The admin index lists the entry (without a link: the model has no change page).
    index = client.get(reverse("admin:index"))
    assert index.status_code == 200 and b"email queue" in index.content


def test_rebalance__a_loop_holding_the_lock_keeps_it_and_the_page_says_so(client, fq_prefix):
    enqueue_job("email", {}, tenant_id="t")
    loop = LeaderLock("email", "host:1:loop", 60_000)
    assert loop.acquire()
    client.force_login(staff("ops", "view_dashboard", "run_rebalance"))
    url = reverse(REBALANCE, args=["email"])
    assert b"host:1:loop holds the leader lock" in client.get(url).content
    done = client.post(url, follow=True)
    assert b"1:loop holds the leader lock and runs this queue" in done.content
    assert queue_stats("email")["lock"]["holder"] == "host:1:loop"  # not taken, not freed
    loop.release()


def test_rebalance__needs_its_own_permission_and_csrf(fq_prefix):
    from django.test import Client

    viewer = Client(enforce_csrf_checks=True)
    viewer.force_login(staff("viewer", "view_dashboard"))
    assert viewer.post(reverse(REBALANCE, args=["email"])).status_code == 403
    ops = Client(enforce_csrf_checks=True)
    ops.force_login(staff("ops", "view_dashboard", "run_rebalance"))
    assert ops.post(reverse(REBALANCE, args=["email"])).status_code == 403  # no CSRF token
    assert not LogEntry.objects.exists()


# -- Redis down --------------------------------------------------------------------------


@pytest.fixture
def redis_down(settings):
    """Point fairqueue at a port where nothing listens."""
    settings.FAIRQUEUE = {
        "QUEUES": dict(TEST_QUEUES),
        "REDIS_URL": "redis://:pw-secret@127.0.0.1:1/0",
    }
    conf.reload_settings()
    yield
    close_brokers()
    conf.reload_settings()


def test_redis_down__page_shows_banner_not_500(viewer, redis_down):
    started = time.monotonic()
    response = viewer.get(reverse(DASHBOARD))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Redis unreachable" in html and "BrokerUnavailableError" in html
    # Where Redis was looked for and which setting said so (what an operator fixes),
    # never the password.
    assert "Traceback" not in html and "pw-secret" not in html
    assert "127.0.0.1:1/0 (from FAIRQUEUE[&#x27;REDIS_URL&#x27;])" in html
    assert time.monotonic() - started < 10
    assert viewer.get(reverse(QUEUE, args=["email"])).status_code == 200


def test_redis_down__json_says_unreachable_with_503(viewer, redis_down):
    response = viewer.get(reverse(STATS))
    assert response.status_code == 503
    assert response.json()["redis"] == "unreachable"
    assert response.json()["error"] == "BrokerUnavailableError"


def test_redis_down__job_detail_and_action_degrade(client, redis_down):
    client.force_login(staff("ops", "view_dashboard", "run_rebalance"))
    detail = client.get(reverse(JOB, args=["email", "1"]))
    assert detail.status_code == 200 and b"Redis unreachable" in detail.content
    assert client.get(reverse(REBALANCE, args=["email"])).status_code == 200
    done = client.post(reverse(REBALANCE, args=["email"]), follow=True)
    assert done.status_code == 200 and b"the pass did not run" in done.content
    assert "failed" in LogEntry.objects.get().change_message


def test_format_duration():
    assert [format_duration(ms) for ms in (None, 0, 45_000, 185_000, 7_380_000, 90_000_000)] == [
        "—",
        "0s",
        "45s",
        "3m 05s",
        "2h 03m",
        "1d 01h",
    ]


def test_redis_url_is_never_shown(viewer, fq_prefix):
    assert REDIS_URL.encode() not in viewer.get(reverse(DASHBOARD)).content


# -- hardening: anything already in Redis renders; Redis error replies ----------------


def test_bad_text_in_redis__pages_and_json_render_not_500(client, fq_prefix):
    raw = redis_lib.Redis.from_url(REDIS_URL)
    escaped = enqueue_job("email", {"a": 1}, tenant_id="t1")
    binary = enqueue_job("email", {"a": 2}, tenant_id="t2")
    # As an older fairqueue or another producer could have written them: a lone
    # surrogate escape (valid JSON) and bytes that are not UTF-8 at all.
    raw.hset(
        f"{fq_prefix}:email:{escaped.job_id}",
        "data",
        '{"a":"\\ud800","tenantId":"\\udfffx","priorityLevel":"normal"}',
    )
    raw.hset(
        f"{fq_prefix}:email:{binary.job_id}",
        "data",
        b'{"a":"\xff\xfe","tenantId":"\xc3(","priorityLevel":"low"}',
    )
    raw.close()
    client.force_login(staff("reader", "view_dashboard", "view_job_payload"))
    assert client.get(reverse(DASHBOARD)).status_code == 200
    assert client.get(reverse(QUEUE, args=["email"])).status_code == 200
    assert client.get(reverse(STATS)).status_code == 200
    for job in (escaped, binary):
        response = client.get(reverse(JOB, args=["email", job.job_id]))
        assert response.status_code == 200
        response.content.decode("utf-8")  # strict: what was sent is valid UTF-8


def test_redis_error_reply__banner_and_503_not_500(viewer, fq_prefix, redis_client):
    enqueue_job("email", {}, tenant_id="t1")
    redis_client.delete(f"{fq_prefix}:email:prioritized")
    redis_client.set(f"{fq_prefix}:email:prioritized", "not a sorted set")
    response = viewer.get(reverse(DASHBOARD))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Redis refused the request (BrokerRejectedError)" in html
    assert REDIS_URL not in html and "Traceback" not in html
    stats = viewer.get(reverse(STATS))
    assert stats.status_code == 503
    assert stats.json()["redis"] == "error" and stats.json()["error"] == "BrokerRejectedError"


def test_stats_json__history_of_what_a_worker_started(viewer, fq_prefix):
    rebalance_queue("email", rebalancer="t")  # history starts at this pass
    seed_mixed()
    drain_with_stock_worker(fq_prefix, "email", 8)
    rebalance_queue("email", rebalancer="t")
    body = viewer.get(reverse(STATS), {"queue": "email", "history_minutes": "5"}).json()
    history = body["queues"][0]["history"]
    assert history["window_s"] == 300 and history["served_total"] == 8
    assert sum(level["served"] for level in history["levels"].values()) == 8
    assert set(history["charts"]) == {"shares", "waits", "series"}
    assert history["levels"]["critical"]["weight_share"] == 0.4
    # Bad input gets the default window; too large is clamped to the hour kept.
    assert (
        viewer.get(reverse(STATS), {"history_minutes": "x"}).json()["queues"][0]["history"][
            "window_s"
        ]
        == 15 * 60
    )
    clamped = viewer.get(reverse(STATS), {"queue": "email", "history_minutes": "999"}).json()
    assert clamped["queues"][0]["history"]["window_s"] == 3_600
