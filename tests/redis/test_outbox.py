"""The transactional outbox: durable enqueue, the relay, its commands, gauge and dashboard
figures, against the real Redis through the real bullmq package."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.urls import reverse

from fairqueue import conf
from fairqueue.broker import TAG_FLOOR, close_brokers
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs, enqueue_on_commit
from fairqueue.enqueue.outbox import outbox_stats, relay_outbox
from fairqueue.exceptions import BrokerUnavailableError
from fairqueue.models import OutboxJob, PriorityOverrideAudit
from tests.helpers import drain_with_stock_worker, free_port, metric
from tests.helpers.keys import REDIS_URL

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_ids(redis_client, prefix: str, queue: str = "email") -> list[str]:
    return redis_client.zrange(f"{prefix}:{queue}:prioritized", 0, -1)


def use_redis(settings, url: str) -> None:
    close_brokers()
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "REDIS_URL": url}
    conf.reload_settings()


@pytest.fixture
def dead_redis_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


@contextmanager
def redis_unreachable(settings):
    """Durable enqueues in here leave their rows: the relay after commit finds no Redis."""
    use_redis(settings, f"redis://127.0.0.1:{free_port()}/0")
    try:
        yield
    finally:
        use_redis(settings, REDIS_URL)


def test_durable_enqueue__row_then_relay_adds_it_with_the_fair_placement(
    fq_prefix, redis_client, settings
):
    with redis_unreachable(settings):
        low = enqueue_job("email", {"n": "low"}, tenant_id="t", priority_level="low", durable=True)
        critical = enqueue_job(
            "email", {"n": "crit"}, tenant_id="t", priority_override="critical", durable=True
        )
    # In the outbox, not in Redis; the override's audit row is written with the outbox
    # row (an explicit level is not audited).
    assert low.durable and not low.created
    assert waiting_ids(redis_client, fq_prefix) == []
    rows = list(OutboxJob.objects.order_by("id"))
    assert [row.bullmq_job_id for row in rows] == [low.job_id, critical.job_id]
    assert critical.job_id == rows[1].job_id and critical.job_id.startswith("fq-outbox-")
    assert list(PriorityOverrideAudit.objects.values_list("job_id", flat=True)) == [critical.job_id]

    result = relay_outbox()
    assert (result.sent, result.existing, result.refused) == (2, 0, 0)
    assert OutboxJob.objects.count() == 0
    stored = redis_client.hgetall(f"{fq_prefix}:email:{critical.job_id}")
    assert json.loads(stored["data"]) == {
        "n": "crit",
        "tenantId": "t",
        "priorityLevel": "critical",
    }
    assert int(stored["priority"]) >= TAG_FLOOR
    # The add script placed them: a stock worker takes the critical job first.
    processed = drain_with_stock_worker(fq_prefix, "email", 2)
    assert [job_id for job_id, _ in processed] == [critical.job_id, low.job_id]


def test_durable_batch__one_row_per_job_and_the_relay_sends_all(fq_prefix, redis_client, settings):
    with redis_unreachable(settings):
        jobs = enqueue_jobs("email", [{"i": i} for i in range(600)], tenant_id="t", durable=True)
    assert OutboxJob.objects.count() == 600
    assert relay_outbox(batch_size=250).sent == 600
    assert sorted(waiting_ids(redis_client, fq_prefix)) == sorted(job.job_id for job in jobs)


def test_enqueue_on_commit__rollback_leaves_no_row_no_audit_no_job(fq_prefix, redis_client):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_on_commit("email", {"a": 1}, tenant_id="t1", priority_override="critical")
        raise RuntimeError("view failed")
    assert OutboxJob.objects.count() == 0
    assert PriorityOverrideAudit.objects.count() == 0
    assert waiting_ids(redis_client, fq_prefix) == []


def test_enqueue_on_commit__relays_right_after_commit(fq_prefix, redis_client):
    with transaction.atomic():
        job = enqueue_on_commit("email", {"a": 1}, tenant_id="t1", priority_override="high")
        assert waiting_ids(redis_client, fq_prefix) == []
    assert waiting_ids(redis_client, fq_prefix) == [job.job_id]
    assert OutboxJob.objects.count() == 0
    assert PriorityOverrideAudit.objects.get().job_id == job.job_id


def test_enqueue_on_commit__redis_down_at_commit_leaves_the_row_and_other_hooks_run(
    fq_prefix, redis_client, settings, dead_redis_url
):
    use_redis(settings, dead_redis_url)
    ran = []
    with transaction.atomic():
        job = enqueue_on_commit("email", {"a": 1}, tenant_id="t1", priority_override="high")
        transaction.on_commit(lambda: ran.append("after"))
    assert ran == ["after"]  # the commit raised nothing; the next hook ran
    row = OutboxJob.objects.get()
    assert row.bullmq_job_id == job.job_id
    assert PriorityOverrideAudit.objects.get().job_id == job.job_id
    with pytest.raises(BrokerUnavailableError):
        relay_outbox()
    assert OutboxJob.objects.count() == 1

    use_redis(settings, REDIS_URL)
    assert relay_outbox().sent == 1
    assert waiting_ids(redis_client, fq_prefix) == [job.job_id]


def test_relay_retry_after_a_crash_between_add_and_delete_adds_nothing_twice(
    fq_prefix, redis_client, monkeypatch, settings
):
    with redis_unreachable(settings):
        jobs = enqueue_jobs("email", [{"i": i} for i in range(5)], tenant_id="t", durable=True)
    from django.db.models import QuerySet

    real_delete = QuerySet.delete

    def crash(self):
        if self.model is OutboxJob:
            raise RuntimeError("relay died after the add")
        return real_delete(self)

    monkeypatch.setattr(QuerySet, "delete", crash)
    with pytest.raises(RuntimeError):
        relay_outbox()
    monkeypatch.setattr(QuerySet, "delete", real_delete)
    assert OutboxJob.objects.count() == 5  # the delete rolled back: the rows stay
    assert len(waiting_ids(redis_client, fq_prefix)) == 5  # the jobs were added

    result = relay_outbox()
    assert (result.sent, result.existing) == (5, 5)
    assert sorted(waiting_ids(redis_client, fq_prefix)) == sorted(job.job_id for job in jobs)
    assert OutboxJob.objects.count() == 0


def test_relay__a_row_redis_refuses_stays_behind_and_the_others_go(
    fq_prefix, redis_client, settings
):
    with redis_unreachable(settings):
        good = enqueue_jobs("email", [{"i": i} for i in range(3)], durable=True)
    OutboxJob.objects.filter(pk=OutboxJob.objects.order_by("id")[1].pk).update(data="{not json")
    result = relay_outbox()
    assert (result.sent, result.refused) == (2, 1)
    bad = OutboxJob.objects.get()
    assert (bad.tries, bad.last_error) == (1, "JSONDecodeError")
    assert sorted(waiting_ids(redis_client, fq_prefix)) == sorted([good[0].job_id, good[2].job_id])


def test_relay__caller_job_id_is_the_bullmq_id_and_an_existing_one_adds_nothing(
    fq_prefix, redis_client, settings
):
    enqueue_job("email", {"v": 1}, job_id="welcome-1")
    with redis_unreachable(settings):
        enqueue_job("email", {"v": 2}, job_id="welcome-1", durable=True)
    result = relay_outbox()
    assert (result.sent, result.existing) == (1, 1)
    data = json.loads(redis_client.hget(f"{fq_prefix}:email:welcome-1", "data"))
    assert data["v"] == 1


def test_relay__job_types_filter_and_a_delayed_job(fq_prefix, redis_client, settings):
    with redis_unreachable(settings):
        report = enqueue_job("report", {}, durable=True)
        email = enqueue_job("email", {}, delay_ms=60_000, durable=True)
    assert relay_outbox(job_types=["report"]).sent == 1
    assert OutboxJob.objects.get().bullmq_job_id == email.job_id
    assert waiting_ids(redis_client, fq_prefix, "report") == [report.job_id]
    relay_outbox()
    assert redis_client.zscore(f"{fq_prefix}:email:delayed", email.job_id) is not None


def test_outbox_gauge_and_dashboard_figures(fq_prefix, dead_redis_url, settings):
    use_redis(settings, dead_redis_url)
    enqueue_jobs("email", [{}, {}], durable=True)
    enqueue_job("report", {}, durable=True)
    figures = outbox_stats("email")
    assert figures["pending"] == 2 and figures["oldest_age_ms"] >= 0
    assert outbox_stats()["pending"] == 3
    with pytest.raises(BrokerUnavailableError):
        relay_outbox()
    assert metric("queue_fair_outbox_pending", job_type="email") == 2
    assert metric("queue_fair_outbox_pending", job_type="report") == 1
    assert outbox_stats("cleanup") == {"pending": 0, "oldest_age_ms": None}


def test_dashboard_shows_the_outbox(fq_prefix, admin_client):
    from fairqueue.dashboard.stats import queue_stats

    enqueue_job("email", {}, durable=True)  # relayed at once
    enqueue_job("email", {}, durable=True)
    OutboxJob.objects.create(
        job_type="email", queue="email", data="{}", level="normal", tenant="default"
    )
    stats = queue_stats("email")
    assert stats["outbox"]["pending"] == 1
    assert stats["outbox"]["oldest_age"].endswith("s")
    response = admin_client.get(reverse("admin:fairqueue_dashboard_changelist"))
    assert b"Outbox (durable jobs not in Redis yet)" in response.content


def test_fairqueue_relay_command__once_and_bad_queue(fq_prefix, redis_client, settings):
    with redis_unreachable(settings):
        enqueue_job("email", {}, durable=True)
        with pytest.raises(CommandError, match="Redis is unreachable"):
            call_command("fairqueue_relay", once=True)
    use_redis(settings, REDIS_URL)
    from io import StringIO

    out = StringIO()
    call_command("fairqueue_relay", once=True, stdout=out)
    assert "sent=1" in out.getvalue()
    assert len(waiting_ids(redis_client, fq_prefix)) == 1
    with pytest.raises(CommandError, match="--queue 'nope' is not allowed"):
        call_command("fairqueue_relay", once=True, job_types=["nope"])
    with pytest.raises(CommandError, match="--interval-ms"):
        call_command("fairqueue_relay", once=True, interval_ms=0)


def test_rebalance_fair_leader_relays_each_round(fq_prefix, redis_client, settings):
    with redis_unreachable(settings):
        job = enqueue_job("email", {}, durable=True)
    call_command("rebalance_fair", once=True)
    assert OutboxJob.objects.count() == 0
    assert waiting_ids(redis_client, fq_prefix) == [job.job_id]


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SKIP LOCKED needs PostgreSQL (one relay on SQLite)"
)
def test_concurrent_relays_never_send_a_row_twice(fq_prefix, redis_client, settings):
    with redis_unreachable(settings):
        enqueue_jobs("email", [{"i": i} for i in range(1_000)], durable=True)
    results = []

    def relay():
        from django.db import connections

        try:
            results.append(relay_outbox(batch_size=50))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=relay) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(r.sent for r in results) == 1_000
    assert sum(r.existing for r in results) == 0  # no row was sent by two relays
    assert len(waiting_ids(redis_client, fq_prefix)) == 1_000
    assert OutboxJob.objects.count() == 0


def test_admin_lists_outbox_rows_read_only_without_the_payload(fq_prefix, admin_client, settings):
    with redis_unreachable(settings):
        job = enqueue_job("email", {"secret": "s3cr3t"}, tenant_id="t", durable=True)
    row = OutboxJob.objects.get()
    listing = admin_client.get(reverse("admin:fairqueue_outboxjob_changelist"))
    assert listing.status_code == 200 and job.job_id.encode() in listing.content
    detail = admin_client.get(reverse("admin:fairqueue_outboxjob_change", args=[row.pk]))
    assert detail.status_code == 200 and b"s3cr3t" not in detail.content
    assert admin_client.get(reverse("admin:fairqueue_outboxjob_add")).status_code == 403
    delete = admin_client.post(
        reverse("admin:fairqueue_outboxjob_delete", args=[row.pk]), {"post": "yes"}
    )
    assert delete.status_code == 403
    assert OutboxJob.objects.count() == 1
