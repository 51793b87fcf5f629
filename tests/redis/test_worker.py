"""The worker: handlers registered with @fairqueue.handler run jobs taken by stock BullMQ
workers, against a real Redis (each test under its own key prefix, removed afterwards)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, ManagementUtility, call_command
from prometheus_client import REGISTRY

import fairqueue
from fairqueue import conf
from fairqueue.broker import Broker
from fairqueue.exceptions import BrokerUnavailableError, UnknownJobTypeError
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.worker import handlers
from fairqueue.worker.handlers import JobContext, NoHandlerError
from fairqueue.worker.process_metrics import record_job
from fairqueue.worker.queue_plans import QueuePlan
from fairqueue.worker.runner import Worker, split_payload
from tests.helpers import PrivateRedis, free_port, read_until, spawner, wait_until
from tests.helpers.keys import REDIS_URL
from tests.helpers.worker_jobs import QUEUES, add, counts

# Workers run against deadlines (a burst within seconds, a stop within its grace):
# beside other test processes they starve.
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def broker(prefix):
    return Broker(REDIS_URL, prefix)


def run_burst(broker: Broker, *job_types: str, concurrency: int = 1) -> float:
    started = time.monotonic()
    Worker(list(job_types), concurrency=concurrency, burst=True, broker=broker).run()
    return time.monotonic() - started


# -- the handler registry ---------------------------------------------------------------


def test_handler__is_exported_and_registers_the_function(registry):
    @fairqueue.handler("t_sync")
    def fn(payload, job):
        pass

    assert handlers.get_handler("t_sync") is fn
    assert "t_sync" in handlers.registered_job_types()


def test_handler__same_function_twice_is_fine_another_function_raises(registry):
    def first(payload, job):
        pass

    def second(payload, job):
        pass

    fairqueue.handler("t_sync")(first)
    fairqueue.handler("t_sync")(first)
    with pytest.raises(ValueError, match=r"job type 't_sync' already has the handler .*first"):
        fairqueue.handler("t_sync")(second)
    assert handlers.get_handler("t_sync") is first


def test_handler__rejects_empty_job_type_and_wrong_signature(registry):
    with pytest.raises(ValueError, match="job_type=''"):
        fairqueue.handler("")
    with pytest.raises(TypeError, match="two positional arguments"):

        @fairqueue.handler("t_sync")
        def no_context(payload):
            pass


def test_get_handler__unknown_job_type_names_the_registered_ones(registry):
    fairqueue.handler("t_sync")(lambda payload, job: None)
    with pytest.raises(NoHandlerError, match=r"'nope' has no handler.*'t_sync'"):
        handlers.get_handler("nope")


def test_autodiscover__imports_the_demo_projects_jobs_module(registry):
    handlers.autodiscover()
    assert {"email", "report", "cleanup"} <= set(handlers.registered_job_types())


def test_split_payload__removes_fairqueue_keys_and_keeps_the_rest():
    payload, tenant, level = split_payload({"a": 1, "tenantId": "acme", "priorityLevel": "high"})
    assert (payload, tenant, level) == ({"a": 1}, "acme", PriorityLevel.HIGH)
    assert split_payload({"tenantId": None, "priorityLevel": "critical"}) == (
        {},
        None,
        PriorityLevel.CRITICAL,
    )
    assert split_payload({"a": 1}) == ({"a": 1}, None, None)
    assert split_payload([1, 2]) == ([1, 2], None, None)


def test_split_payload__other_level_values_follow_parse_levels_rules():
    # The wire names are looked up; anything else is parsed (or dropped) as before.
    assert split_payload({"priorityLevel": " High "})[2] is PriorityLevel.HIGH
    assert split_payload({"priorityLevel": PriorityLevel.LOW})[2] is PriorityLevel.LOW
    for value in ("urgent", "", 2, None, ["high"], {"high": 1}):
        assert split_payload({"a": 1, "priorityLevel": value}) == ({"a": 1}, None, None)


def test_queue_plan__job_type_of_one_type_takes_every_name_a_shared_queue_by_name():
    def run(payload, job):
        return None

    one = QueuePlan(queue="q", handlers={"email": run})
    assert one.job_type_of("email") == one.job_type_of("anything") == "email"
    shared = QueuePlan(queue="q", handlers={"report": run}, task_types=frozenset({"email"}))
    assert shared.job_types == ["email", "report"]
    assert shared.job_type_of("report") == "report"
    assert shared.job_type_of("email") == "email"
    assert shared.job_type_of("cleanup") is None
    # replace() works the job types out again: one type left, it takes every name.
    assert replace(shared, task_types=frozenset()).job_type_of("email") == "report"


def test_record_job__counts_every_call_by_its_labels():
    def count(outcome):
        value = REGISTRY.get_sample_value(
            "queue_fair_worker_jobs_total",
            {"queue": "q-record", "job_type": "email", "outcome": outcome},
        )
        return value or 0.0

    done, failed = count("done"), count("failed")
    for _ in range(3):
        record_job("q-record", "email", "done")
    record_job("q-record", "email", "failed")
    assert (count("done") - done, count("failed") - failed) == (3.0, 1.0)


def test_job_context__repr_leaves_out_the_tenant():
    context = JobContext("7", "email", "secret-tenant", PriorityLevel.LOW, 0)
    assert "secret-tenant" not in repr(context)


# -- processing jobs --------------------------------------------------------------------


def test_sync_handler__gets_payload_without_fairqueue_keys_and_a_context(broker):
    seen = []

    @fairqueue.handler("t_sync")
    def record(payload, job):
        seen.append((payload, job, threading.current_thread().name))

    tenant_job, internal_job = add(
        broker,
        "t_sync",
        {"to": "a@example.com", "tenantId": "acme", "priorityLevel": "high"},
        {"days": 30, "tenantId": None, "priorityLevel": "critical"},
    )

    assert run_burst(broker, "t_sync") < 5
    for _, job, _ in seen:  # BullMQ's timestamp and processedOn, ms since the epoch
        assert isinstance(job.enqueued_ms, int) and isinstance(job.started_ms, int), job
        assert job.enqueued_ms <= job.started_ms <= time.time() * 1000 + 1_000
    by_id = {
        job.job_id: (payload, replace(job, enqueued_ms=None, started_ms=None), thread)
        for payload, job, thread in seen
    }
    assert by_id[tenant_job][:2] == (
        {"to": "a@example.com"},
        JobContext(tenant_job, "t_sync", "acme", PriorityLevel.HIGH, 0),
    )
    assert by_id[internal_job][:2] == (
        {"days": 30},
        JobContext(internal_job, "t_sync", None, PriorityLevel.CRITICAL, 0),
    )
    assert all(thread.startswith("fairqueue-job") for _, _, thread in seen)
    assert counts(broker, "t_sync")["completed"] == 2


def test_async_handler__is_awaited_on_the_workers_loop(broker):
    seen = []

    @fairqueue.handler("t_async")
    async def record(payload, job):
        await asyncio.sleep(0.001)
        seen.append((payload, job.job_type, threading.current_thread() is threading.main_thread()))

    add(broker, "t_async", *({"n": n, "tenantId": "t", "priorityLevel": "low"} for n in range(5)))

    run_burst(broker, "t_async", concurrency=3)
    assert sorted(p["n"] for p, _, _ in seen) == [0, 1, 2, 3, 4]
    assert all(job_type == "t_async" and on_main for _, job_type, on_main in seen)
    assert counts(broker, "t_async")["completed"] == 5


@pytest.mark.django_db(transaction=True)
def test_sync_handler__can_use_the_django_orm(broker):
    @fairqueue.handler("t_orm")
    def create_user(payload, job):
        User.objects.create_user(username=payload["username"])

    add(broker, "t_orm", {"username": "ada", "tenantId": "acme", "priorityLevel": "normal"})

    run_burst(broker, "t_orm")
    assert User.objects.filter(username="ada").exists()
    assert counts(broker, "t_orm")["completed"] == 1


def test_failing_handler__is_retried_then_failed_and_logs_no_payload(broker, caplog):
    attempts = []

    @fairqueue.handler("t_fail")
    def fail(payload, job):
        attempts.append(job.attempts_made)
        raise RuntimeError(f"cannot send to {payload['to']}")

    add(
        broker,
        "t_fail",
        {"to": "secret@example.com", "tenantId": "tenant-secret", "priorityLevel": "low"},
        attempts=2,
    )

    with caplog.at_level(logging.INFO, logger="fairqueue.worker"):
        run_burst(broker, "t_fail")
    assert attempts == [0, 1]
    state = counts(broker, "t_fail")
    assert (state["failed"], state["completed"], state["prioritized"]) == (1, 0, 0)
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 2 and all("RuntimeError" in message for message in failures)
    assert "secret" not in caplog.text


def test_shared_queue__dispatches_on_the_job_name(broker):
    seen = []
    fairqueue.handler("t_shared_a")(lambda payload, job: seen.append(("a", job.job_type)))
    fairqueue.handler("t_shared_b")(lambda payload, job: seen.append(("b", job.job_type)))
    add(broker, "t_shared_a", {"n": 1})
    add(broker, "t_shared_b", {"n": 2})

    run_burst(broker, "t_shared_a", "t_shared_b")
    assert sorted(seen) == [("a", "t_shared_a"), ("b", "t_shared_b")]
    with pytest.raises(ValueError, match=r"queue 't_shared' also holds job types 't_shared_b'"):
        Worker(["t_shared_a"], broker=broker)


def test_worker__job_type_outside_fairqueue_queues_is_refused(broker):
    fairqueue.handler("t_unconfigured")(lambda payload, job: None)
    with pytest.raises(UnknownJobTypeError, match=r"'t_unconfigured' is not configured"):
        Worker(["t_unconfigured"], broker=broker)


def test_burst__returns_at_once_when_every_queue_is_empty(broker):
    fairqueue.handler("t_sync")(lambda payload, job: None)
    assert run_burst(broker, "t_sync") < 2


def test_sigterm__finishes_the_active_job_takes_no_new_one_and_returns(broker):
    started = []
    finished = []

    @fairqueue.handler("t_slow")
    def slow(payload, job):
        started.append(job.job_id)
        if len(started) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # from a pool thread, as the kernel may
        time.sleep(0.3)
        finished.append(job.job_id)

    first, *_ = add(broker, "t_slow", {"n": 1}, {"n": 2}, {"n": 3})
    before = signal.getsignal(signal.SIGTERM)

    Worker(["t_slow"], broker=broker).run()  # not burst: only the signal ends it
    assert started == finished == [first]
    state = counts(broker, "t_slow")
    assert (state["completed"], state["prioritized"] + state["wait"], state["active"]) == (1, 2, 0)
    assert signal.getsignal(signal.SIGTERM) is before


# -- the management command -------------------------------------------------------------


def test_command__redis_down_names_host_port_db_and_the_setting(settings, monkeypatch, prefix):
    """The message alone says what to fix: where Redis was looked for and which setting
    (or variable) said so; never the password."""
    port = free_port()
    monkeypatch.setenv("FAIRQUEUE_REDIS_URL", f"redis://:hunter2@127.0.0.1:{port}/5")
    conf.reload_settings()
    try:
        with pytest.raises(CommandError) as info:
            call_command("fairqueue_worker", "email", burst=True, verbosity=0)
    finally:
        monkeypatch.delenv("FAIRQUEUE_REDIS_URL")
        conf.reload_settings()
    assert str(info.value) == (
        f"Redis is unavailable at 127.0.0.1:{port}/5 (from FAIRQUEUE_REDIS_URL): ConnectionError"
    )


def test_command__burst_processes_every_job_with_the_demo_handler_and_returns(broker):
    add(
        broker,
        "email",
        *({"work_ms": 5, "tenantId": "t", "priorityLevel": "low"} for _ in range(6)),
    )

    call_command("fairqueue_worker", "email", burst=True, concurrency=2, verbosity=0)
    state = counts(broker, "email")
    assert (state["completed"], state["prioritized"], state["wait"], state["failed"]) == (
        6,
        0,
        0,
        0,
    )


@pytest.mark.parametrize("value", ["0", "1001", "-3", "many"])
def test_command__bad_concurrency_names_argument_value_and_range(prefix, value):
    with pytest.raises(CommandError) as info:
        call_command("fairqueue_worker", "email", "--burst", "--concurrency", value)
    message = str(info.value)
    assert "--concurrency" in message and repr(value) in message and "1..1000" in message


def test_command__bad_concurrency_keyword_is_checked_too(prefix):
    with pytest.raises(CommandError, match=r"--concurrency: 0 is not allowed.*1\.\.1000"):
        call_command("fairqueue_worker", "email", burst=True, concurrency=0)


def test_command__bad_concurrency_on_the_command_line_exits_with_usage(prefix, capsys):
    utility = ManagementUtility(["manage.py", "fairqueue_worker", "--concurrency", "0"])
    with pytest.raises(SystemExit) as info:
        utility.execute()
    assert info.value.code == 2
    assert "argument --concurrency: '0' is not allowed" in capsys.readouterr().err


def test_command__unknown_job_type_names_it_and_the_registered_ones(prefix):
    with pytest.raises(CommandError) as info:
        call_command("fairqueue_worker", "emial", burst=True)
    message = str(info.value)
    assert "'emial'" in message and "'email'" in message and "'report'" in message


def test_command__handler_without_a_configured_queue_is_a_command_error(prefix):
    fairqueue.handler("t_unconfigured")(lambda payload, job: None)
    with pytest.raises(CommandError, match=r"'t_unconfigured' is not configured"):
        call_command("fairqueue_worker", "t_unconfigured", burst=True)


# -- signals, in a real process ---------------------------------------------------------


@pytest.fixture
def worker_process(prefix, tmp_path):
    """Start ``manage.py fairqueue_worker`` under settings using this test's prefix."""
    module = f"fq_worker_settings_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            from tests.settings import *  # noqa: F403
            FAIRQUEUE = {{"PREFIX": {prefix!r}, "QUEUES": {QUEUES!r}, "REDIS_URL": {REDIS_URL!r}}}
            """
        )
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": module,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    with spawner() as spawn:
        yield lambda *args: spawn(
            [sys.executable, "manage.py", "fairqueue_worker", *args], cwd=ROOT, env=env
        )


def _wait_for_active(broker: Broker, job_type: str, timeout_s: float = 30.0) -> None:
    """A loaded machine can take over 10 s to start a worker process."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if counts(broker, job_type)["active"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {job_type} job became active in {timeout_s}s")


def test_process__sigterm_lets_the_active_job_finish_then_exits_0(broker, worker_process):
    add(broker, "report", {"work_ms": 700, "tenantId": "t", "priorityLevel": "low"})
    process = worker_process("report", "-v", "1")
    _wait_for_active(broker, "report")

    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=10)
    assert process.returncode == 0, output
    assert counts(broker, "report")["completed"] == 1
    assert "SIGTERM: stopping" in output and "worker stopped" in output


def test_process__second_signal_exits_at_once(broker, worker_process):
    add(broker, "email", {"work_ms": 30_000, "tenantId": "t", "priorityLevel": "low"})
    process = worker_process("email")
    _wait_for_active(broker, "email")

    process.send_signal(signal.SIGINT)
    before = read_until(process, "SIGINT: stopping", timeout_s=10.0)  # the first one was taken
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    output, _ = process.communicate(timeout=5)
    output = "".join(before) + output
    assert process.returncode == 128 + signal.SIGINT, output
    assert time.monotonic() - started < 3
    assert counts(broker, "email")["completed"] == 0


# -- Redis unreachable at start -----------------------------------------------------------


def test_redis_down_at_start__the_worker_waits_with_backoff_then_serves(prefix, tmp_path, caplog):
    server = PrivateRedis(tmp_path, aof=False)  # its port is free: nothing answers yet
    ran = []
    fairqueue.handler("t_sync")(lambda payload, job: ran.append(job.job_id))
    worker = Worker(["t_sync"], broker=Broker(server.url, prefix), install_signal_handlers=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    with caplog.at_level(logging.INFO, logger="fairqueue.worker"):
        thread.start()
        try:
            assert wait_until(lambda: "unreachable" in caplog.text, 10), caplog.text
            assert thread.is_alive()
            server.start()
            job_ids = add(Broker(server.url, prefix), "t_sync", {"n": 1})
            assert wait_until(lambda: ran == job_ids, 30), caplog.text
        finally:
            worker.request_stop()
            thread.join(15)
            server.stop()
    assert not thread.is_alive()
    lines = [r.getMessage() for r in caplog.records if r.name == "fairqueue.worker"]
    down = [line for line in lines if "unreachable" in line]
    assert len(down) == 1, lines  # once, not once per try
    assert down[0].endswith("is unreachable (ConnectionError); retrying with backoff up to 30 s")
    assert lines.count("Redis is reachable again; worker starting") == 1, lines


def test_redis_down_at_start__a_stop_ends_the_wait(prefix, caplog):
    fairqueue.handler("t_sync")(lambda payload, job: None)
    dead = Broker(f"redis://127.0.0.1:{free_port()}/0", prefix)
    worker = Worker(["t_sync"], broker=dead, install_signal_handlers=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    with caplog.at_level(logging.INFO, logger="fairqueue.worker"):
        thread.start()
        assert wait_until(lambda: "unreachable" in caplog.text, 10), caplog.text
        worker.request_stop()
        thread.join(5)
    assert not thread.is_alive()
    assert "worker stopped" in caplog.text and "worker started" not in caplog.text


def test_burst_with_redis_down__fails_at_once_like_once(prefix):
    fairqueue.handler("t_sync")(lambda payload, job: None)
    dead = Broker(f"redis://127.0.0.1:{free_port()}/0", prefix)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError):
        Worker(["t_sync"], burst=True, broker=dead, install_signal_handlers=False).run()
    assert time.monotonic() - started < 5


def test_stop_with_redis_gone__the_worker_still_returns(prefix, tmp_path, caplog):
    # A stop while Redis is gone still returns (with no job running nothing waits for it).
    server = PrivateRedis(tmp_path, aof=False).start()
    fairqueue.handler("t_sync")(lambda payload, job: None)
    worker = Worker(["t_sync"], broker=Broker(server.url, prefix), install_signal_handlers=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    with caplog.at_level(logging.INFO, logger="fairqueue.worker"):
        thread.start()
        try:
            assert wait_until(lambda: "worker started" in caplog.text, 30), caplog.text
            time.sleep(0.5)
            server.stop()
            worker.request_stop()
            thread.join(60)
        finally:
            server.stop()
    assert not thread.is_alive(), caplog.text
