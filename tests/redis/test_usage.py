"""The usage ledger: per tenant, job type and UTC day, counted by the history step and
written by the loop into ``TenantUsage`` idempotently (docs/usage.md)."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.scheduling.attempt_events import Event, Run, Start
from fairqueue.scheduling.usage import UsageValues, day_of, page_usage, split_member, total
from fairqueue.usage.ledger import write_all_usage
from tests.helpers.usage import work_jobs

DAY_MS = 1_780_000_000_000  # 2026-05-28, UTC


def _start(tenant="acme", first=True, ready=DAY_MS - 500):
    return Start(level="normal", tenant=tenant, ready_ms=ready, first_attempt=first)


# -- the page's counts, plain data ---------------------------------------------------------


def test_page_usage__pairs_each_attempt_once_and_counts_outcomes_waits_and_time():
    events = [
        Event("start", "1", DAY_MS),
        Event("start", "2", DAY_MS + 10),
        Event("end", "1", DAY_MS + 100, ok=True),
        Event("end", "1", DAY_MS + 150, ok=True),  # a second end of one run: ignored
        Event("retry", "2", DAY_MS + 310),  # failed with attempts left
        Event("start", "2", DAY_MS + 400),
        Event("end", "2", DAY_MS + 450, ok=False),
        Event("end", "9", DAY_MS + 500, ok=True),  # its start was on an earlier page
        Event("end", "8", DAY_MS + 500, ok=True),  # start never seen: not counted
    ]
    starts = {"1": _start(), "2": _start(tenant="beta")}
    runs = {"9": Run("normal", "acme", DAY_MS - 1_000, 1.0)}
    out = page_usage(events, starts, runs, lambda job_id: "email")
    day = day_of(DAY_MS)
    got = {name: n for (d, name), n in out.increments.items() if d == day}
    assert got == {
        "a:acme\nemail": 1,
        "c:acme\nemail": 2,
        "t:acme\nemail": 100 + 1_500,
        "w:acme\nemail": 500,
        "a:beta\nemail": 2,  # the retry starts again: two attempts
        "w:beta\nemail": 510,  # first attempt only
        "f:beta\nemail": 2,
        "r:beta\nemail": 1,  # of which one had attempts left
        "t:beta\nemail": 300 + 50,
    }
    assert out.maxima == {(day, "m:acme\nemail"): 500, (day, "m:beta\nemail"): 510}


def test_page_usage__an_attempt_whose_worker_died_counts_as_started_and_lost():
    events = [
        Event("start", "1", DAY_MS),
        Event("lost", "1", DAY_MS + 30_000),  # the stalled check put it back
        Event("start", "1", DAY_MS + 30_100),
        Event("end", "1", DAY_MS + 30_300, ok=True),
        Event("lost", "9", DAY_MS + 31_000),  # started on an earlier page
        Event("end", "9", DAY_MS + 31_100, ok=True),  # no second start: not counted
    ]
    starts = {"1": _start()}
    runs = {"9": Run("normal", "acme", DAY_MS - 1_000, 1.0)}
    out = page_usage(events, starts, runs, lambda job_id: "email")
    got = {name: n for (_, name), n in out.increments.items()}
    assert got == {
        "a:acme\nemail": 2,
        "w:acme\nemail": 500,
        "c:acme\nemail": 1,
        "t:acme\nemail": 200,
        "l:acme\nemail": 2,  # lost, no worker time (the breaker counts them as failed)
    }


def test_page_usage__unknown_levels_are_not_counted_and_ends_count_on_their_own_day():
    midnight = (DAY_MS // 86_400_000 + 1) * 86_400_000
    events = [
        Event("start", "1", midnight - 100),
        Event("start", "2", midnight - 50),
        Event("end", "1", midnight + 100, ok=True),
    ]
    starts = {"1": _start(ready=midnight - 100), "2": None}
    out = page_usage(events, starts, {}, lambda job_id: "email")
    assert out.increments == {
        (day_of(midnight - 1), "a:acme\nemail"): 1,
        (day_of(midnight - 1), "w:acme\nemail"): 0,
        (day_of(midnight), "c:acme\nemail"): 1,
        (day_of(midnight), "t:acme\nemail"): 200,
    }


def test_usage_values__merge_is_idempotent_and_totals_sum_epochs():
    a = UsageValues(3, 2, 1, 500, 40, 30)
    b = UsageValues(4, 2, 2, 450, 40, 35)
    assert a.merged(b) == UsageValues(4, 2, 2, 500, 40, 35)
    assert a.merged(b).merged(b) == a.merged(b)
    assert total({"x": a.as_list(), "y": b.as_list()}) == UsageValues(7, 4, 3, 950, 80, 35)
    assert split_member("20260528\nacme\nemail") == ("20260528", "acme", "email")
    assert split_member("2026\nacme") is None
    assert UsageValues.from_list([b"3", None, "x", -4]) == UsageValues(3, 0, 0, 0, 0, 0)


# -- live: a stock worker, the history step, the database ------------------------------------


def _rows():
    from fairqueue.models import TenantUsage

    return {
        row.tenant_id: (row.attempts, row.completed, row.failed, row.worker_ms)
        for row in TenantUsage.objects.filter(job_type="email")
    }


def _record_and_write():
    for _ in range(5):
        result = rebalance_queue("email", rebalancer="usage-test")
        if result.recorded == 0:
            break
    return write_all_usage("email")


@pytest.mark.django_db
def test_live__ledger_matches_a_stock_worker_and_writing_again_changes_nothing(
    fq_prefix, redis_client
):
    from fairqueue.models import TenantUsage

    rebalance_queue("email", rebalancer="usage-test")  # the history's cursor starts here
    enqueue_jobs("email", [{"i": i} for i in range(12)], tenant_id="acme")
    enqueue_jobs("email", [{"i": i} for i in range(5)], tenant_id="poison", attempts=2)
    seen: list = []
    asyncio.run(work_jobs(fq_prefix, "email", 12 + 10, seen, fail_tenants={"poison"}, job_s=0.02))
    written = _record_and_write()
    assert written.rows == 2
    rows = _rows()
    assert rows["acme"][:3] == (12, 12, 0)
    assert rows["poison"][:3] == (10, 0, 10)  # 5 jobs, 2 attempts each, all failed
    measured = sum(ms for *_, ms in seen if True)
    assert sum(r[3] for r in rows.values()) >= 0.9 * measured
    row = TenantUsage.objects.get(tenant_id="acme")
    assert row.day == dt.datetime.now(dt.UTC).date() and row.wait_ms_max >= 0
    # The same Redis rows written again (a loop killed after the database write and
    # before taking them off the dirty set): nothing changes.
    day = row.day.strftime("%Y%m%d")
    redis_client.zadd(f"{fq_prefix}:email:fq:use:dirty", {f"{day}\nacme\nemail": 1})
    assert write_all_usage("email").rows == 1
    assert _rows() == rows
    assert redis_client.zcard(f"{fq_prefix}:email:fq:use:dirty") == 0
    assert 0 < redis_client.ttl(f"{fq_prefix}:email:fq:use:{day}") <= 3 * 86_400


@pytest.mark.django_db
def test_live__a_redis_loss_starts_a_new_epoch_and_keeps_what_the_database_had(
    fq_prefix, redis_client
):
    from fairqueue.models import TenantUsage

    rebalance_queue("email", rebalancer="usage-test")
    enqueue_jobs("email", [{"i": i} for i in range(6)], tenant_id="acme")
    asyncio.run(work_jobs(fq_prefix, "email", 6, []))
    _record_and_write()
    assert _rows()["acme"][:2] == (6, 6)
    day = dt.datetime.now(dt.UTC).strftime("%Y%m%d")
    redis_client.delete(f"{fq_prefix}:email:fq:use:{day}")  # the day's counters lost
    enqueue_jobs("email", [{"i": i} for i in range(4)], tenant_id="acme")
    asyncio.run(work_jobs(fq_prefix, "email", 4, []))
    _record_and_write()
    row = TenantUsage.objects.get(tenant_id="acme")
    assert (row.attempts, row.completed) == (10, 10)
    assert len(row.segments) == 2


@pytest.mark.django_db
def test_live__the_ledger_can_be_switched_off(fq_prefix, redis_client, settings):
    from fairqueue import conf

    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "USAGE_LEDGER": False}
    conf.reload_settings()
    rebalance_queue("email", rebalancer="usage-test")
    enqueue_jobs("email", [{"i": 1}], tenant_id="acme")
    asyncio.run(work_jobs(fq_prefix, "email", 1, []))
    assert _record_and_write().rows == 0
    assert redis_client.keys(f"{fq_prefix}:email:fq:use:*") == []


@pytest.mark.django_db
def test_admin__usage_list_totals_drill_down_and_csv_export(admin_client):
    from fairqueue.models import TenantUsage

    today = dt.date(2019, 5, 28)  # a year no other test's loop writes rows for
    TenantUsage.objects.create(
        tenant_id="acme", job_type="email", day=today, attempts=3, completed=2, failed=1,
        worker_ms=1_500,
    )  # fmt: skip
    TenantUsage.objects.create(tenant_id="beta", job_type="email", day=today, attempts=4)
    page = admin_client.get("/admin/fairqueue/tenantusage/?day__year=2019")
    assert page.status_code == 200
    assert b"7 attempts, 2 completed, 1 failed, 1.5 worker seconds" in page.content
    ids = list(TenantUsage.objects.values_list("pk", flat=True))
    export = admin_client.post(
        "/admin/fairqueue/tenantusage/",
        {"action": "export_csv", "_selected_action": ids},
    )
    lines = export.content.decode().splitlines()
    assert lines[0].startswith("day,tenant_id,job_type,attempts")
    assert "2019-05-28,acme,email,3,2,1,1500,0,0" in lines
