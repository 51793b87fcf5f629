"""The rebalance loop as operators run it: real processes, real Redis, failures."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import redis as redis_lib

from fairqueue import conf
from fairqueue.broker import close_brokers
from fairqueue.contrib.celery import rebalance_fair
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.rebalance.rebalancer import Rebalancer
from tests.helpers import free_port, wait_until
from tests.helpers.keys import REDIS_URL
from tests.helpers.processes import spawn, start_private_redis, stop

ROOT = Path(__file__).resolve().parents[2]
# Timing-sensitive (live workers, loops): `make test` runs them after the parallel part.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.serial]


def holder(redis_client, prefix):
    return redis_client.get(f"{prefix}:email:fq:leader")


def next_passes(redis_client, prefix, count, timeout_s=30.0):
    """The status records of the next ``count`` passes over ``email`` (each pass writes
    one, stamped with its time), polled until they came or the deadline passed."""
    key = f"{prefix}:email:fq:last_pass"
    current = redis_client.get(key)
    seen = {json.loads(current)["at_ms"]} if current else set()
    records = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        raw = redis_client.get(key)
        if raw and (record := json.loads(raw))["at_ms"] not in seen:
            seen.add(record["at_ms"])
            records.append(record)
        time.sleep(0.01)
    assert len(records) >= count, f"{len(records)} of {count} passes in {timeout_s} s"
    return records


@pytest.mark.slow
def test_leader_lock__one_writer_and_takeover_within_two_intervals(fq_prefix, redis_client):
    interval_ms = 400
    enqueue_jobs("email", [{} for _ in range(50)], priority_level="normal")
    args = ["rebalance_fair", "--queue", "email", "--interval-ms", str(interval_ms)]
    first, second = spawn(args, fq_prefix), spawn(args, fq_prefix)
    try:
        assert wait_until(lambda: holder(redis_client, fq_prefix) is not None, 20)
        leader = holder(redis_client, fq_prefix)
        leader_pid = int(leader.split(":")[1])
        assert leader_pid in (first.pid, second.pid)
        assert wait_until(lambda: redis_client.get(f"{fq_prefix}:email:fq:last_pass"), 10)
        # Only the leader's passes are recorded.
        assert [p["by"] for p in next_passes(redis_client, fq_prefix, 3)] == [leader] * 3
        dead, survivor = (first, second) if leader_pid == first.pid else (second, first)
        dead.kill()
        dead.wait()
        killed_at = time.monotonic()
        assert wait_until(
            lambda: (h := holder(redis_client, fq_prefix)) and f":{survivor.pid}:" in h, 10
        )
        # The lock expires after two intervals; the survivor's next pass takes it.
        assert time.monotonic() - killed_at <= 3 * interval_ms / 1000 + 1.0
        assert stop(survivor) == 0
        assert holder(redis_client, fq_prefix) is None  # released on shutdown
    finally:
        stop(first, signal.SIGKILL)
        stop(second, signal.SIGKILL)


WORKER_SCRIPT = """
import asyncio, sys
import redis.asyncio as redis
from bullmq import Worker

async def main(url, prefix):
    client = redis.from_url(url)
    async def process(job, token):
        await client.rpush(prefix + ':processed', job.id)
    worker = Worker('email', process, {'connection': url, 'prefix': prefix, 'concurrency': 1})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await worker.close()
    await client.aclose()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.slow
def test_no_job_lost_or_duplicated__10000_jobs_two_rebalancers_four_workers(
    fq_prefix, redis_client
):
    rebalancers = [
        spawn(["rebalance_fair", "--queue", "email", "--interval-ms", "100"], fq_prefix)
        for _ in range(2)
    ]
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, REDIS_URL, fq_prefix], cwd=ROOT)
        for _ in range(4)
    ]
    try:
        expected = []
        levels = ["critical", "high", "normal", "low"]
        for batch in range(100):
            jobs = enqueue_jobs(
                "email",
                [{"b": batch, "i": i} for i in range(100)],
                tenant_id=f"t{batch % 7}",
                priority_level=levels[batch % 4],
            )
            expected += [job.job_id for job in jobs]
            time.sleep(0.01)
        assert wait_until(lambda: redis_client.llen(f"{fq_prefix}:processed") >= 10_000, 120)
        # Nothing left to run (a job leaves ``active`` after its processor recorded it),
        # so no duplicate can still arrive.
        assert wait_until(lambda: unfinished(redis_client, fq_prefix) == 0, 30)
        processed = redis_client.lrange(f"{fq_prefix}:processed", 0, -1)
        assert len(processed) == 10_000
        assert sorted(processed) == sorted(expected)
    finally:
        for process in workers + rebalancers:
            stop(process)


def unfinished(redis_client, prefix):
    base = f"{prefix}:email"
    return (
        redis_client.llen(f"{base}:wait")
        + redis_client.zcard(f"{base}:prioritized")
        + redis_client.llen(f"{base}:active")
        + redis_client.zcard(f"{base}:delayed")
    )


def test_redis_killed_mid_loop__loop_survives_and_next_pass_is_correct(settings, caplog):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    directory = tempfile.mkdtemp()
    server = start_private_redis(port, directory)
    settings.FAIRQUEUE = {"PREFIX": "fqloop", "QUEUES": {"email": "email"}, "REDIS_URL": url}
    old_env = os.environ.pop("FAIRQUEUE_REDIS_URL", None)
    conf.reload_settings()
    rebalancer = Rebalancer(["email"], interval_ms=100)
    thread = threading.Thread(target=rebalancer.run, daemon=True)
    client = redis_lib.Redis.from_url(url, decode_responses=True)
    try:
        enqueue_jobs("email", [{} for _ in range(5)], priority_level="low")
        thread.start()
        assert wait_until(lambda: client.get("fqloop:email:fq:last_pass"), 10)
        server.kill()
        server.wait()
        assert wait_until(lambda: rebalancer.backoff.failures >= 3, 15)  # failed rounds
        assert thread.is_alive()
        server = start_private_redis(port, directory)  # empty: the old data is gone
        enqueue_jobs("email", [{} for _ in range(8)], priority_level="critical")
        enqueue_jobs("email", [{} for _ in range(2)], priority_level="low")
        assert wait_until(lambda: client.get("fqloop:email:fq:last_pass"), 15)
        assert thread.is_alive()
        order = [j for j in client.zrange("fqloop:email:prioritized", 0, -1)]
        assert [int(j) for j in order[:5]] == [1, 2, 3, 4, 9]
        client.lpush("fqloop:email:wait", "legacy")  # a foreign job's place: the loop adopts it
        client.hset("fqloop:email:legacy", mapping={"name": "x", "data": "{}", "timestamp": 1})
        assert wait_until(lambda: client.llen("fqloop:email:wait") == 0, 10)
        assert rebalance_queue("email", dry_run=True).adopted == 0
        warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(warnings) == 1  # logged once, not once per failed pass
    finally:
        rebalancer.request_stop()
        thread.join(10)
        client.close()
        close_brokers()
        server.kill()
        server.wait()
        if old_env is not None:
            os.environ["FAIRQUEUE_REDIS_URL"] = old_env
        conf.reload_settings()
        shutil.rmtree(directory, ignore_errors=True)
    assert not thread.is_alive()


def test_celery_task_shares_the_leader_lock(fq_prefix, redis_client):
    for n in range(4):  # foreign jobs in the wait list: the pass adopts them
        redis_client.hset(f"{fq_prefix}:email:f{n}", mapping={"data": "{}", "timestamp": 1})
        redis_client.lpush(f"{fq_prefix}:email:wait", f"f{n}")
    redis_client.set(f"{fq_prefix}:email:fq:leader", "someone-else", px=5_000)
    assert rebalance_fair.apply(args=[["email"]]).get() == {}
    redis_client.delete(f"{fq_prefix}:email:fq:leader")
    assert rebalance_fair.apply(args=[["email"]]).get() == {"email": 4}
    assert holder(redis_client, fq_prefix) is not None


def test_celery_children_forked_after_import_get_their_own_lock_tokens():
    from fairqueue.contrib.celery import process_token

    parent = process_token()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports its token and exits at once
        os.write(write, process_token().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    assert child and child != parent and f":{pid}:" in child
    assert process_token() == parent


def test_sigterm_finishes_and_exits_zero(fq_prefix, redis_client):
    process = spawn(["rebalance_fair", "--interval-ms", "100"], fq_prefix)
    # The start line is logged after the signal handlers are installed: wait for it
    # (however slow a loaded machine starts Django), then for a pass to have run.
    first_line = process.stdout.readline()
    assert "rebalance_fair starting" in first_line, first_line
    next_passes(redis_client, fq_prefix, 1)
    assert stop(process) == 0, process.stdout.read()


def test_once_with_redis_down__one_honest_message_naming_the_host_and_exit_1(fq_prefix):
    port = free_port()
    process = spawn(
        ["rebalance_fair", "--once"],
        fq_prefix,
        FAIRQUEUE_REDIS_URL=f"redis://:hunter2@127.0.0.1:{port}/3",
    )
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output
    assert (
        f"Redis at 127.0.0.1:{port}/3 (from FAIRQUEUE_REDIS_URL) is unreachable "
        "(ConnectionError): no pass ran"
    ) in output
    assert output.count("unreachable") == 1, output  # said once, not wrapped twice
    assert "retrying" not in output
    assert "hunter2" not in output


def test_dry_run_verbose__prints_each_summary_once(fq_prefix, caplog):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("rebalance_fair", once=True, dry_run=True, verbosity=2, stdout=out)
    lines = out.getvalue().splitlines()
    assert sorted(line.split(":")[0] for line in lines) == ["cleanup", "email", "report"]
    assert all(line.endswith("(dry run)") for line in lines)
    assert not [r for r in caplog.records if "(dry run)" in r.getMessage()]  # not logged too


def test_default_verbosity__a_start_line_and_a_compact_line_per_pass(fq_prefix, redis_client):
    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="secret-tenant")
    now_ms = int(time.time() * 1000)
    for n in range(4):  # foreign jobs: the first pass adopts them
        job = {"data": "{}", "timestamp": now_ms}
        redis_client.hset(f"{fq_prefix}:email:f{n}", mapping=job)
        redis_client.lpush(f"{fq_prefix}:email:wait", f"f{n}")
    process = spawn(
        ["rebalance_fair", "--queue", "email", "--interval-ms", "100"],
        fq_prefix,
        FAIRQUEUE_REDIS_URL="redis://:hunter2@" + REDIS_URL.split("://", 1)[1],
    )
    try:
        assert wait_until(lambda: redis_client.llen(f"{fq_prefix}:email:wait") == 0, 20)
        next_passes(redis_client, fq_prefix, 12)  # a dozen quiet passes
    finally:
        assert stop(process) == 0
    output = process.stdout.read()
    lines = output.splitlines()
    start = [line for line in lines if "rebalance_fair starting: email; every 100 ms" in line]
    assert len(start) == 1, output
    assert f"prefix {fq_prefix!r}" in start[0] and "hunter2" not in output
    first_pass = "email: adopted 4, aged 0, overdue 0, rebased 0 in"
    assert any(first_pass in line for line in lines), output
    # Quiet passes are summarised, not logged one by one (~15 passes ran).
    assert sum("email: adopted" in line for line in lines) <= 2, output
    assert re.search(r"\d+ quiet passes in \d+ s", output), output
    assert "secret-tenant" not in output


def test_quiet_passes__one_line_per_summary_period(fq_prefix, caplog, monkeypatch):
    import logging

    from fairqueue.rebalance import rebalancer as loop

    monkeypatch.setattr(loop, "QUIET_SUMMARY_S", 0.5)
    caplog.set_level(logging.INFO, logger="fairqueue.rebalance")

    def quiet_records():
        return [r for r in list(caplog.records) if "quiet passes" in r.getMessage()]

    rebalancer = loop.Rebalancer(["email"], interval_ms=20)
    thread = threading.Thread(target=rebalancer.run, daemon=True)
    thread.start()
    try:  # three summary periods, however long a loaded machine takes for them
        assert wait_until(lambda: len(quiet_records()) >= 3, 30), caplog.text
    finally:
        rebalancer.request_stop()
        thread.join(10)
    messages = [r.getMessage() for r in caplog.records if r.name == "fairqueue.rebalance"]
    quiet = [m for m in messages if "quiet passes" in m]
    passes = sum(int(m.split()[0]) for m in quiet)
    assert passes >= 10, messages  # dozens of passes ran...
    assert len(quiet) >= 3 and passes > len(quiet), messages  # ...summarised...
    periodic = [r.created for r in quiet_records()[:3]]  # ...every 0.5 s, not sooner
    assert all(b - a >= 0.45 for a, b in zip(periodic, periodic[1:], strict=False)), messages
    assert sum(m.startswith("email: adopted") for m in messages) == 1  # the first pass


def test_a_failing_outbox_relay_is_logged_once_and_the_loop_goes_on(fq_prefix, monkeypatch, caplog):
    from django.db import OperationalError

    from fairqueue.rebalance import rebalancer as loop

    def broken(**kwargs):
        raise OperationalError("no such table: fairqueue_outboxjob")

    rebalancer = loop.Rebalancer(["email"], interval_ms=100)
    monkeypatch.setattr(loop, "relay_outbox", broken)
    with caplog.at_level("INFO", logger="fairqueue.rebalance"):
        for _ in range(3):
            assert [r.job_type for r in rebalancer.run_once()] == ["email"]
    errors = [r for r in caplog.records if "outbox relay failed" in r.getMessage()]
    assert len(errors) == 1 and "OperationalError" in errors[0].getMessage()
    assert "no such table" not in caplog.text  # the class name only
    monkeypatch.undo()
    with caplog.at_level("INFO", logger="fairqueue.rebalance"):
        rebalancer.run_once()
    assert "outbox relay works again" in caplog.text
    rebalancer.release_locks()


def test_redis_error_reply__loop_survives_and_passes_resume(fq_prefix, redis_client, caplog):
    lock = f"{fq_prefix}:email:fq:leader"
    redis_client.hset(lock, "not", "a string")  # the lock script now fails: WRONGTYPE
    enqueue_jobs("email", [{} for _ in range(3)], priority_level="low")
    rebalancer = Rebalancer(["email"], interval_ms=100)
    thread = threading.Thread(target=rebalancer.run, daemon=True)
    with caplog.at_level("WARNING", logger="fairqueue"):
        thread.start()
        try:
            assert wait_until(lambda: "Redis refused a command" in caplog.text, 10)
            assert wait_until(lambda: rebalancer.backoff.failures >= 3, 15)  # failed rounds
            assert thread.is_alive()
            assert redis_client.get(f"{fq_prefix}:email:fq:last_pass") is None
            redis_client.delete(lock)
            assert wait_until(lambda: redis_client.get(f"{fq_prefix}:email:fq:last_pass"), 15)
        finally:
            rebalancer.request_stop()
            thread.join(10)
    assert "ResponseError" in caplog.text and "Traceback" not in caplog.text
