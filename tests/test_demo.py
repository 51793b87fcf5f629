"""``manage.py fairqueue_demo``: the whole system runs, every level is served, and
everything the demo started is gone when it returns.

The end-to-end tests run the demo as ``manage.py`` would, in a subprocess, under a
private BullMQ prefix (``FAIRQUEUE_PREFIX``) on the shared Redis and a throwaway SQLite
database: its children (worker, rebalancer, load generator) are separate processes and
cannot see pytest's test database.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from fairqueue.demo import (
    DEMO_ADMIN_PASSWORD,
    DEMO_ADMIN_USERNAME,
    DEMO_TENANTS,
    FairnessSample,
    Supervisor,
    ensure_demo_superuser,
    free_port,
    redis_answers,
    seed_tenants,
    start_embedded_redis,
    target_backlog,
)
from fairqueue.levels import PriorityLevel
from fairqueue.models import TenantPlan
from tests.conftest import REDIS_URL, delete_prefix

ROOT = Path(__file__).resolve().parent.parent
LEVELS = ("critical", "high", "normal", "low")


def _run_demo(tmp_path: Path, *args: str, env: dict[str, str], timeout_s: float = 120):
    return subprocess.run(
        [
            sys.executable,
            "manage.py",
            "fairqueue_demo",
            "--state-dir",
            str(tmp_path / "state"),
            *args,
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _processed(output: str) -> dict[str, int]:
    match = re.search(r"while the demo ran: (.*)", output)
    assert match, output
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


def _started_pids(output: str) -> dict[str, int]:
    pids = {name: int(pid) for name, pid in re.findall(r"started (\w+) \(pid (\d+)\)", output)}
    embedded = re.search(r"embedded server on \S+ \(pid (\d+)\)", output)
    if embedded:
        pids["redis"] = int(embedded.group(1))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def demo_prefix():
    prefix = f"fqtest-demo-{uuid.uuid4().hex[:12]}"
    yield prefix
    delete_prefix(prefix)


# -- end to end ---------------------------------------------------------------------------


@pytest.mark.slow
def test_demo__serves_every_level_then_stops_everything_it_started(tmp_path, demo_prefix):
    result = _run_demo(
        tmp_path,
        "--duration",
        "8",
        "--no-web",
        "--summary-every",
        "2",
        env={"FAIRQUEUE_PREFIX": demo_prefix, "FAIRQUEUE_REDIS_URL": REDIS_URL},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "using the server at" in output  # the shared Redis answered: nothing embedded

    processed = _processed(output)
    assert all(processed[level] > 0 for level in LEVELS), processed
    # The critical flood outranks the low trickle, which is still served.
    assert processed["critical"] > processed["low"]
    assert re.search(r"\] email: \d+ done .* \| \d+ waiting", output), output

    pids = _started_pids(output)
    assert set(pids) == {"worker", "rebalancer", "load"}, output
    assert not [name for name, pid in pids.items() if _alive(pid)]
    assert "demo stopped" in output

    # It really used the private prefix on the shared Redis.
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert client.exists(f"{demo_prefix}:email:meta")
    finally:
        client.close()


@pytest.mark.slow
def test_demo__without_redis_runs_an_embedded_one_and_stops_it(tmp_path):
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    result = _run_demo(
        tmp_path, "--duration", "6", "--no-web", env={"FAIRQUEUE_REDIS_URL": dead_url}
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "starting the embedded Redis" in output
    processed = _processed(output)
    assert all(processed[level] > 0 for level in LEVELS), processed

    pids = _started_pids(output)
    assert set(pids) == {"redis", "worker", "rebalancer", "load"}, output
    assert not [name for name, pid in pids.items() if _alive(pid)]
    embedded_port = re.search(r"embedded server on [\d.]+:(\d+)", output).group(1)
    assert not redis_answers(f"redis://127.0.0.1:{embedded_port}/0")


def test_demo__a_bad_duration_is_refused_before_anything_starts():
    with pytest.raises(CommandError, match=r"--duration: '0' is not allowed"):
        call_command("fairqueue_demo", duration=0)


# -- the embedded Redis -------------------------------------------------------------------


def test_embedded_redis__starts_on_a_free_port_answers_ping_and_stops(tmp_path):
    embedded = start_embedded_redis(tmp_path / "redis")
    try:
        client = redis.Redis.from_url(embedded.url)
        try:
            assert client.ping() is True
            assert client.info("server")["tcp_port"] == embedded.port
        finally:
            client.close()
        assert redis_answers(embedded.url)
    finally:
        code = embedded.stop()
    assert code == 0
    assert not _alive(embedded.pid)
    assert not redis_answers(embedded.url)
    assert (tmp_path / "redis" / "redis.log").exists()


def test_redis_answers__false_where_nothing_listens():
    assert not redis_answers(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    assert redis_answers(REDIS_URL)


# -- process supervision ------------------------------------------------------------------


def test_supervisor__sigkills_a_child_that_ignores_sigterm(tmp_path):
    supervisor = Supervisor(log_dir=tmp_path, env=dict(os.environ))
    stubborn = supervisor.start(
        "stubborn",
        [
            sys.executable,
            "-c",
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n",
        ],
    )
    polite = supervisor.start("polite", [sys.executable, "-c", "import time; time.sleep(60)"])
    deadline = time.monotonic() + 10
    while "ready" not in stubborn.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)

    killed = supervisor.stop(timeout_s=0.5)

    assert killed == [stubborn]
    assert stubborn.process.returncode == -signal.SIGKILL
    assert polite.process.returncode == -signal.SIGTERM
    assert not supervisor.children[0].running and not supervisor.children[1].running


# -- demo data ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_ensure_demo_superuser__is_idempotent_and_restores_the_printed_password():
    assert ensure_demo_superuser() is True
    user = get_user_model().objects.get(username=DEMO_ADMIN_USERNAME)
    user.set_password("changed")
    user.is_staff = False
    user.save()

    assert ensure_demo_superuser() is False

    user.refresh_from_db()
    assert user.is_staff and user.is_superuser
    assert user.check_password(DEMO_ADMIN_PASSWORD)
    assert get_user_model().objects.filter(username=DEMO_ADMIN_USERNAME).count() == 1


@pytest.mark.django_db
def test_seed_tenants__creates_one_per_plan_and_keeps_plans_changed_in_the_admin():
    plans = dict(seed_tenants())
    assert set(plans.values()) == {"enterprise", "pro", "free"}
    TenantPlan.objects.filter(tenant_id="acme").update(plan_tier="free")

    again = dict(seed_tenants())

    assert again["acme"] == "free"
    assert TenantPlan.objects.count() == len(DEMO_TENANTS)


# -- the summary --------------------------------------------------------------------------


def test_fairness_sample__one_line_with_shares_weights_and_oldest_waits():
    sample = FairnessSample(
        elapsed_s=12,
        interval_s=3,
        done={PriorityLevel.CRITICAL: 40, PriorityLevel.HIGH: 30, PriorityLevel.NORMAL: 20},
        oldest_wait_ms={
            PriorityLevel.CRITICAL: 1500,
            PriorityLevel.HIGH: 1200,
            PriorityLevel.NORMAL: 2500,
            PriorityLevel.LOW: None,
        },
        tenant_wait_ms={"initech": 2500, "hooli": 300},
        waiting=812,
    )
    line = sample.line()
    assert "\n" not in line
    assert "90 done (30/s)" in line
    assert "critical 44% high 33% normal 22% low 0%" in line
    assert "(weights 40/30/20/10%)" in line
    assert "critical 1.5s high 1.2s normal 2.5s low -" in line
    assert "initech 2.5s vs hooli 0.3s" in line
    assert line.endswith("| 812 waiting")


def test_target_backlog__about_four_seconds_of_the_workers_capacity():
    assert target_backlog(concurrency=4, work_ms=20) == 640
    assert target_backlog(concurrency=1, work_ms=60_000) == 20  # never below 20
