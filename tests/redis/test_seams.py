"""The seams between fairqueue and the rest of a deployment: database
sequences that restart, QUEUES that change, BullMQ's own operations, Redis limits and
ACLs, bad task input. Real Redis (the shared one, or a private redis-server where a test
needs maxmemory or an ACL user), the real bullmq package."""

from __future__ import annotations

import json
import logging

import pytest
import redis
from django.core.management import call_command

from fairqueue import conf
from fairqueue.broker import close_brokers
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.enqueue.outbox import JOB_ID_COLLISION, relay_outbox
from fairqueue.exceptions import BrokerRejectedError
from fairqueue.models import OUTBOX_JOB_ID_PREFIX, OutboxJob
from tests.helpers import PrivateRedis, drain_with_stock_worker, free_port
from tests.helpers.keys import REDIS_URL, TEST_QUEUES


def use_redis(settings, url: str, **extra) -> None:
    close_brokers()
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "REDIS_URL": url, **extra}
    conf.reload_settings()


def rows_while_redis_is_down(settings, job_type: str, count: int, **options) -> list:
    use_redis(settings, f"redis://127.0.0.1:{free_port()}/0")
    try:
        return enqueue_jobs(job_type, [{"i": i} for i in range(count)], durable=True, **options)
    finally:
        use_redis(settings, REDIS_URL)


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path, aof=False).start()
    yield server
    close_brokers()
    server.stop()


def out_of_memory(port: int) -> None:
    """Make a private server refuse every write (what ``maxmemory`` + ``noeviction``
    does once the data reaches the limit), the shared Redis untouched."""
    client = redis.Redis(port=port)
    try:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
    finally:
        client.close()


def rows_then_out_of_memory(settings, server: PrivateRedis, count: int) -> None:
    """``count`` outbox rows of tenant ``t`` (written while Redis was down), then
    fairqueue on ``server``, which refuses every write."""
    rows_while_redis_is_down(settings, "email", count, tenant_id="t")
    use_redis(settings, server.url)
    out_of_memory(server.port)


def count_add_jobs(monkeypatch) -> list[int]:
    """The size of every ``SyncBroker.add_jobs`` call from now on (each runs as before)."""
    from fairqueue.broker.brokers import SyncBroker

    calls: list[int] = []
    real_add_jobs = SyncBroker.add_jobs

    def counting(self, queue, jobs):
        calls.append(len(jobs))
        return real_add_jobs(self, queue, jobs)

    monkeypatch.setattr(SyncBroker, "add_jobs", counting)
    return calls


# -- 1. an outbox id never collides with an earlier job -------------------------------


@pytest.mark.django_db(transaction=True)
def test_flush_then_durable_enqueue__the_second_job_runs(fq_prefix, redis_client):
    first = enqueue_job("email", {"n": 1}, tenant_id="t", durable=True)
    assert drain_with_stock_worker(fq_prefix, "email", 1) == [
        (first.job_id, {"n": 1, "tenantId": "t", "priorityLevel": "normal"})
    ]
    # The first job is kept (completed); flush resets the outbox's sequence.
    call_command("flush", interactive=False, verbosity=0)
    second = enqueue_job("email", {"n": 2}, tenant_id="t", durable=True)
    assert second.job_id != first.job_id
    assert second.job_id.startswith(OUTBOX_JOB_ID_PREFIX)
    assert OutboxJob.objects.count() == 0
    ran = drain_with_stock_worker(fq_prefix, "email", 1, timeout_s=10)
    assert [(job_id, data["n"]) for job_id, data in ran] == [(second.job_id, 2)]


@pytest.mark.django_db(transaction=True)
def test_a_row_whose_id_holds_another_job_is_kept_and_reported(
    fq_prefix, redis_client, settings, caplog
):
    """A row written before migration 0005 (no id stored: fq-outbox-<pk>) whose pk came
    back while Redis still holds the earlier job of that id."""
    (job,) = rows_while_redis_is_down(settings, "email", 1, tenant_id="secret-tenant")
    row = OutboxJob.objects.get()
    OutboxJob.objects.filter(pk=row.pk).update(job_id="")
    legacy_id = f"{OUTBOX_JOB_ID_PREFIX}{row.pk}"
    enqueue_job("email", {"earlier": True}, tenant_id="t", job_id=legacy_id)

    with caplog.at_level(logging.WARNING, logger="fairqueue.outbox"):
        result = relay_outbox()
    assert (result.sent, result.existing, result.refused, result.collisions) == (0, 0, 1, 1)
    kept = OutboxJob.objects.get()
    assert (kept.tries, kept.last_error) == (1, JOB_ID_COLLISION)
    assert json.loads(redis_client.hget(f"{fq_prefix}:email:{legacy_id}", "data"))["earlier"]
    [line] = [r.getMessage() for r in caplog.records if legacy_id in r.getMessage()]
    assert JOB_ID_COLLISION in line
    assert "secret-tenant" not in line and '"i"' not in line


@pytest.mark.django_db(transaction=True)
def test_a_retry_after_a_crash_still_counts_its_own_job_as_existing(fq_prefix, redis_client):
    """The collision check does not mistake the row's own job (added, row not deleted)."""
    row = {
        "job_type": "email",
        "queue": "email",
        "job_id": f"{OUTBOX_JOB_ID_PREFIX}abc",
        "data": json.dumps({"n": 1, "tenantId": "t", "priorityLevel": "normal"}),
        "level": "normal",
        "tenant": "t",
    }
    OutboxJob.objects.create(**row)
    assert relay_outbox().sent == 1
    assert redis_client.exists(f"{fq_prefix}:email:{OUTBOX_JOB_ID_PREFIX}abc")
    # The same row again, as if the delete after the add had been lost.
    OutboxJob(**row).save()
    result = relay_outbox()
    assert (result.sent, result.existing, result.collisions) == (1, 1, 0)
    assert OutboxJob.objects.count() == 0


# -- 2. a job type whose queue changed ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_rows_follow_their_job_types_current_queue(fq_prefix, redis_client, settings):
    jobs = rows_while_redis_is_down(settings, "email", 3, tenant_id="t")
    assert set(OutboxJob.objects.values_list("queue", flat=True)) == {"email"}
    use_redis(settings, REDIS_URL, QUEUES={**TEST_QUEUES, "email": "email-v2"})

    assert relay_outbox().sent == 3
    assert redis_client.zcard(f"{fq_prefix}:email:prioritized") == 0
    assert sorted(redis_client.zrange(f"{fq_prefix}:email-v2:prioritized", 0, -1)) == sorted(
        job.job_id for job in jobs
    )


@pytest.mark.django_db(transaction=True)
def test_a_row_added_to_the_old_queue_before_the_change_is_not_added_twice(
    fq_prefix, redis_client, settings
):
    (job,) = rows_while_redis_is_down(settings, "email", 1, tenant_id="t")
    row = OutboxJob.objects.get()
    # A relay added it to "email", then died before deleting the row; then QUEUES moved.
    from fairqueue.broker import NewJob, get_sync_broker
    from fairqueue.scheduling.levels import PriorityLevel

    get_sync_broker().add_jobs(
        "email",
        [
            NewJob(
                name="email",
                data=json.loads(row.data),
                level=PriorityLevel.NORMAL,
                job_id=row.bullmq_job_id,
                tenant="t",
                tenant_weight=1,
            )
        ],
    )
    use_redis(settings, REDIS_URL, QUEUES={**TEST_QUEUES, "email": "email-v2"})
    result = relay_outbox()
    assert (result.sent, result.existing) == (1, 1)
    assert not redis_client.exists(f"{fq_prefix}:email-v2:{job.job_id}")


@pytest.mark.django_db(transaction=True)
def test_rows_of_a_removed_job_type_wait_and_check_warns(fq_prefix, redis_client, settings):
    rows_while_redis_is_down(settings, "report", 2)
    rows_while_redis_is_down(settings, "email", 1)
    queues = {name: queue for name, queue in TEST_QUEUES.items() if name != "report"}
    use_redis(settings, REDIS_URL, QUEUES=queues)

    assert relay_outbox().sent == 1  # the email row; the report rows are not claimed
    assert relay_outbox(job_types=["report"]).sent == 0
    assert sorted(OutboxJob.objects.values_list("job_type", flat=True)) == ["report", "report"]
    assert not redis_client.exists(f"{fq_prefix}:report:prioritized")

    from fairqueue.checks import check_outbox_job_types

    [warning] = check_outbox_job_types(None)
    assert warning.id == "fairqueue.W020"
    assert "2 outbox row(s)" in warning.msg and "'report'" in warning.msg


# -- 4. a server-wide refusal stops the relay run ---------------------------------------


@pytest.mark.django_db(transaction=True)
def test_out_of_memory__one_add_per_run_one_log_line_and_the_redis_error(
    fq_prefix, private_redis, settings, caplog, monkeypatch
):
    rows_then_out_of_memory(settings, private_redis, 350)
    calls = count_add_jobs(monkeypatch)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fairqueue.outbox"):
        with pytest.raises(BrokerRejectedError) as raised:
            relay_outbox()
    assert raised.value.redis_error == "OutOfMemoryError"
    assert len(calls) == 1
    assert [r for r in caplog.records if r.name == "fairqueue.outbox"] == []
    assert set(OutboxJob.objects.values_list("tries", flat=True)) == {0}
    assert set(OutboxJob.objects.values_list("last_error", flat=True)) <= {
        "",
        "OutOfMemoryError",
    }
    assert OutboxJob.objects.filter(last_error="OutOfMemoryError").count() == 250

    # The standalone relay: one warning for the whole refusal, backoff between runs.
    from fairqueue.enqueue.relay import Relay

    relay = Relay(["email"], interval_ms=100, install_signal_handlers=False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fairqueue.outbox"):
        pauses = [relay.pause_ms(relay.run_once()) for _ in range(3)]
    assert len(calls) == 4
    assert pauses == [200, 400, 800]
    lines = [r.getMessage() for r in caplog.records if r.name == "fairqueue.outbox"]
    assert len(lines) == 1 and "OutOfMemoryError" in lines[0]

    client = redis.Redis(port=private_redis.port)
    client.config_set("maxmemory", 0)
    client.close()
    with caplog.at_level(logging.INFO, logger="fairqueue.outbox"):
        result = relay.run_once()
    assert result.sent == 350 and OutboxJob.objects.count() == 0
    assert "accepts writes again" in caplog.records[-1].getMessage()


@pytest.mark.django_db(transaction=True)
def test_out_of_memory__the_rebalance_loop_relays_once_per_round_and_logs_once(
    fq_prefix, private_redis, settings, caplog, monkeypatch
):
    from fairqueue.rebalance.rebalancer import Rebalancer

    rows_then_out_of_memory(settings, private_redis, 30)
    calls = count_add_jobs(monkeypatch)
    loop = Rebalancer(["email"], interval_ms=100, install_signal_handlers=False)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            loop._relay()
    assert calls == [30, 30, 30]
    relay_lines = [r for r in caplog.records if "outbox relay" in r.getMessage()]
    assert len(relay_lines) == 1
    assert set(OutboxJob.objects.values_list("last_error", flat=True)) == {"OutOfMemoryError"}


# -- 3. a queue BullMQ obliterated is cleaned by the next pass -------------------------


def fair_key_names(redis_client, prefix: str, queue: str) -> set[str]:
    base = f"{prefix}:{queue}:fq:"
    return {key[len(base) :] for key in redis_client.scan_iter(match=f"{base}*", count=1000)}


def bullmq_queue_call(prefix: str, queue: str, method: str, **kwargs) -> None:
    """``method`` of the bullmq package's ``Queue`` ``queue`` under ``prefix``."""
    import asyncio

    from bullmq import Queue

    async def run() -> None:
        bull = Queue(queue, {"connection": REDIS_URL, "prefix": prefix})
        try:
            await getattr(bull, method)(**kwargs)
        finally:
            await bull.close()

    asyncio.run(run())


def obliterate(prefix: str, queue: str, side: str = "python") -> None:
    if side == "node":
        node_run(
            "await q.pause(); await q.obliterate({force: true}); await q.close();",
            prefix,
            queue,
        )
        return
    bullmq_queue_call(prefix, queue, "obliterate", force=True)


@pytest.mark.parametrize("side", ["python", "node"])
def test_an_obliterated_queue_loses_its_fairqueue_keys_at_the_next_pass(
    fq_prefix, redis_client, side
):
    from fairqueue.rebalance.passes import rebalance_queue

    enqueue_jobs("email", [{"i": i} for i in range(40)], tenant_id="a")
    for i in range(5):
        enqueue_job("email", {"i": i}, tenant_id="b", delay_ms=60_000)
    enqueue_job("email", {}, priority_level="high")  # an internal job: no audit row
    rebalance_queue("email")
    before = fair_key_names(redis_client, fq_prefix, "email")
    assert {"state", "flows", "ready", "last_pass"} <= before
    assert any(name.startswith("ready:") for name in before)

    obliterate(fq_prefix, "email", side)
    assert not redis_client.exists(f"{fq_prefix}:email:id")
    assert fair_key_names(redis_client, fq_prefix, "email") == before  # BullMQ left them

    rebalance_queue("email")
    # What the pass just wrote about itself (its record, the history cursor) and the
    # history buckets that expire on their own; nothing of the obliterated jobs.
    # (the pass may open a new 10 s bucket, so any bucket may be left).
    left = fair_key_names(redis_client, fq_prefix, "email")
    assert {name for name in left if not name.startswith("hist:")} <= {"last_pass", "hist"}
    assert not {"state", "flows", "fweights", "ready", "jobs"} & left
    assert not any(name.startswith("ready:") for name in left)
    # A queue in use is left alone, and works after the clean-up.
    job = enqueue_job("email", {"n": 1}, tenant_id="a")
    rebalance_queue("email")
    assert {"state", "ready"} <= fair_key_names(redis_client, fq_prefix, "email")
    assert redis_client.zscore(f"{fq_prefix}:email:prioritized", job.job_id) is not None


# -- 5. an ACL that forbids a command -------------------------------------------------


def test_an_acl_refusal_names_the_command_and_what_to_grant():
    from redis.exceptions import NoPermissionError, ResponseError

    from fairqueue.broker.common import broker_error

    error = broker_error(
        NoPermissionError("this user has no permissions to run the 'evalsha' command")
    )
    assert isinstance(error, BrokerRejectedError) and error.redis_error == "NoPermissionError"
    assert "EVALSHA" in str(error) and "+evalsha" in str(error)
    keys = broker_error(
        NoPermissionError(
            "this user has no permissions to access one of the keys used as arguments"
        )
    )
    assert "'~<PREFIX>:*'" in str(keys)
    in_script = broker_error(
        ResponseError(
            "The user executing the script can't run this command or subcommand script: "
            "3c4f30, on @user_script:1."
        )
    )
    assert in_script.redis_error == "NoPermissionError" and "ACL LOG" in str(in_script)
    assert "3c4f30" not in str(in_script)


@pytest.fixture
def acl_redis(tmp_path):
    """A private server with a user that may do everything but EVALSHA."""
    server = PrivateRedis(tmp_path, aof=False).start()
    client = redis.Redis(port=server.port)
    client.acl_setuser(
        "noeval",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-evalsha"],
    )
    client.close()
    yield server
    close_brokers()
    server.stop()


@pytest.mark.django_db
def test_burst_worker_exits_non_zero_on_a_permission_error(fq_prefix, acl_redis, settings):
    from django.core.management import CommandError

    use_redis(settings, acl_redis.url)
    enqueue_jobs("email", [{"work_ms": 1} for _ in range(3)], tenant_id="t")
    use_redis(settings, f"redis://noeval:pw@127.0.0.1:{acl_redis.port}/0")
    with pytest.raises(CommandError, match="EVALSHA") as raised:
        call_command("fairqueue_worker", "email", burst=True, verbosity=0)
    assert "+evalsha" in str(raised.value)


@pytest.mark.django_db
def test_a_once_command_exits_non_zero_on_a_permission_error(fq_prefix, acl_redis, settings):
    from django.core.management import CommandError

    use_redis(settings, acl_redis.url)
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="t")
    use_redis(settings, f"redis://noeval:pw@127.0.0.1:{acl_redis.port}/0")
    with pytest.raises(CommandError, match="EVALSHA"):
        call_command("rebalance_fair", once=True, verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_relay_once_exits_non_zero_on_a_permission_error(fq_prefix, acl_redis, settings):
    from django.core.management import CommandError

    rows_while_redis_is_down(settings, "email", 2, tenant_id="t")
    use_redis(settings, f"redis://noeval:pw@127.0.0.1:{acl_redis.port}/0")
    with pytest.raises(CommandError, match="EVALSHA"):
        call_command("fairqueue_relay", once=True)
    assert set(OutboxJob.objects.values_list("last_error", flat=True)) == {"NoPermissionError"}
    assert set(OutboxJob.objects.values_list("tries", flat=True)) == {0}


# -- 6. reads under maxmemory + noeviction; 8. a paused queue --------------------------


@pytest.fixture
def _fresh_backlog_cache():
    from fairqueue.dashboard import stats

    stats.clear_backlog_cache()
    yield
    stats.clear_backlog_cache()


@pytest.mark.django_db
@pytest.mark.usefixtures("_fresh_backlog_cache")
def test_the_dashboard_renders_what_redis_holds_when_it_is_out_of_memory(
    fq_prefix, private_redis, settings, viewer
):
    from django.urls import reverse

    use_redis(settings, private_redis.url)
    jobs = enqueue_jobs("email", [{"i": i} for i in range(12)], tenant_id="t")
    out_of_memory(private_redis.port)
    with pytest.raises(BrokerRejectedError):  # writes are refused...
        enqueue_job("email", {}, tenant_id="t")

    response = viewer.get(reverse("admin:fairqueue_dashboard_stats"), {"queue": "email"})
    assert response.status_code == 200  # ...reads are not
    (stats,) = response.json()["queues"]
    assert stats["waiting_total"] == 12
    assert stats["redis_memory"]["refuses_writes"] is True
    assert stats["warnings"][0].startswith("Redis is out of memory")
    assert [row["job_id"] for row in stats["order"]["jobs"]] == [job.job_id for job in jobs]
    assert stats["levels"]["normal"]["waiting"] == 12

    page = viewer.get(reverse("admin:fairqueue_dashboard_changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Redis is out of memory" in html and jobs[0].job_id in html


@pytest.mark.django_db
@pytest.mark.usefixtures("_fresh_backlog_cache")
@pytest.mark.parametrize("side", ["python", "node"])
def test_a_paused_queue_is_shown_paused_and_the_pass_still_places_its_jobs(
    fq_prefix, redis_client, viewer, side
):
    from django.urls import reverse

    from fairqueue.rebalance.passes import rebalance_queue
    from tests.helpers.jobs import add_foreign

    enqueue_jobs("email", [{"i": i} for i in range(3)], tenant_id="t")
    pause(fq_prefix, "email", side)
    add_foreign(fq_prefix, ({"tenantId": "t"}, {}))  # a job without a place (the wait list)

    (stats,) = viewer.get(reverse("admin:fairqueue_dashboard_stats"), {"queue": "email"}).json()[
        "queues"
    ]
    assert stats["paused"] is True
    assert any(warning.startswith("The queue is paused") for warning in stats["warnings"])
    html = viewer.get(reverse("admin:fairqueue_dashboard_changelist")).content.decode()
    assert "data-fq-paused>paused</span>" in html

    assert rebalance_queue("email").adopted == 1
    assert redis_client.zcard(f"{fq_prefix}:email:prioritized") == 4
    resume(fq_prefix, "email")
    (stats,) = viewer.get(reverse("admin:fairqueue_dashboard_stats"), {"queue": "email"}).json()[
        "queues"
    ]
    assert stats["paused"] is False


def pause(prefix: str, queue: str, side: str) -> None:
    if side == "node":
        node_pause(prefix, queue)
        return
    bullmq_queue_call(prefix, queue, "pause")


def node_pause(prefix: str, queue: str) -> None:
    node_run("await q.pause(); await q.close();", prefix, queue)


def node_run(body: str, prefix: str, queue: str) -> None:
    """Run ``body`` against BullMQ's Node ``Queue`` ``q`` (tests/node's pinned package)."""
    import shutil
    import subprocess
    from pathlib import Path

    node_dir = Path(__file__).resolve().parents[1] / "node"
    node = shutil.which("node")
    if node is None or not (node_dir / "node_modules" / "bullmq").is_dir():
        pytest.skip("node or tests/node/node_modules missing")
    script = (
        "import { Queue } from 'bullmq';"
        "const [url, prefix, name] = process.argv.slice(1);"
        "const u = new URL(url);"
        "const db = Number(u.pathname.slice(1) || 0);"
        "const q = new Queue(name, {prefix, connection: {host: u.hostname, port: +u.port, db}});"
        + body
    )
    subprocess.run(
        [node, "--input-type=module", "-e", script, REDIS_URL, prefix, queue],
        cwd=node_dir,
        check=True,
        timeout=60,
        capture_output=True,
    )


def resume(prefix: str, queue: str) -> None:
    bullmq_queue_call(prefix, queue, "resume")


# -- 7. exact per-level counts with ties across page boundaries -------------------------


def level_sum(stats) -> int:
    return (
        sum(level["waiting"] for level in stats["levels"].values()) + stats["unparsed"]["waiting"]
    )


def backlog(count: int, tenants: int = 5) -> None:
    per_tenant = count // tenants
    for tenant in range(tenants):
        for level, share in (("normal", 0.6), ("low", 0.25), ("high", 0.15)):
            n = int(per_tenant * share)
            if n:
                enqueue_jobs(
                    "email", [{} for _ in range(n)], tenant_id=f"t{tenant}", priority_level=level
                )


def tie_every_boundary(redis_client, prefix: str, group: int) -> None:
    """Give every run of ``group`` jobs of the pop order one score (their order kept),
    so scan pages of fewer than ``group`` jobs all end inside a tie."""
    key = f"{prefix}:email:prioritized"
    entries = redis_client.zrange(key, 0, -1, withscores=True)
    with redis_client.pipeline(transaction=False) as pipe:
        for start in range(0, len(entries), group):
            run = entries[start : start + group]
            score = run[0][1]
            pipe.zadd(key, {job_id: score for job_id, _ in run})
        pipe.execute()


@pytest.mark.django_db
@pytest.mark.usefixtures("_fresh_backlog_cache")
@pytest.mark.parametrize("count", [1_000, 10_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_level_counts_equal_the_waiting_total_with_ties_at_every_page_boundary(
    fq_prefix, redis_client, count
):
    from fairqueue.dashboard import stats as dashboard
    from fairqueue.dashboard.stats import queue_stats

    backlog(count)
    total = redis_client.zcard(f"{fq_prefix}:email:prioritized")
    # As added: the tenants of a level share tags, five jobs a score.
    stats = queue_stats("email", sync_scan_limit=10**6)
    assert stats["waiting_total"] == total == level_sum(stats)
    # Ties longer than a scan page, across every boundary.
    tie_every_boundary(redis_client, fq_prefix, dashboard.SCAN_PAGE_SIZE + 7)
    dashboard.clear_backlog_cache()
    stats = queue_stats("email", sync_scan_limit=10**6)
    assert stats["waiting_total"] == total == level_sum(stats)
    by_level = {name: level["waiting"] for name, level in stats["levels"].items()}
    per_tenant = count // 5
    assert by_level == {
        "critical": 0,
        "high": 5 * int(per_tenant * 0.15),
        "normal": 5 * int(per_tenant * 0.6),
        "low": 5 * int(per_tenant * 0.25),
    }
