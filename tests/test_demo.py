"""``manage.py fairqueue_demo``: the whole system runs, every level is served, and
everything the demo started is gone when it returns.

The end-to-end tests run the demo as ``manage.py`` would, in a subprocess, under a
private prefix (``--prefix``) in the demo's database of the shared Redis and a throwaway
SQLite database: its children (worker, rebalancer, load generator) are separate
processes and cannot see pytest's test database.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from prometheus_client.parser import text_string_to_metric_families

from fairqueue.demo import (
    DEMO_ADMIN_PASSWORD,
    DEMO_ADMIN_USERNAME,
    DEMO_REDIS_DB,
    DEMO_TENANTS,
    FairnessSample,
    Supervisor,
    ensure_demo_superuser,
    entitled_shares,
    free_port,
    redis_answers,
    seed_classifier,
    seed_tenants,
    start_embedded_redis,
    target_backlog,
    with_db,
)
from fairqueue.management.commands.fairqueue_demo import how_stopped
from fairqueue.models import TenantPlan
from fairqueue.scheduling.levels import PriorityLevel
from tests.conftest import REDIS_URL

ROOT = Path(__file__).resolve().parent.parent
LEVELS = ("critical", "high", "normal", "low")


def _demo_env(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        **env,
    }


def _demo_argv(tmp_path: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "manage.py",
        "fairqueue_demo",
        "--state-dir",
        str(tmp_path / "state"),
        *args,
    ]


def _run_demo(tmp_path: Path, *args: str, env: dict[str, str], timeout_s: float = 120):
    return subprocess.run(
        _demo_argv(tmp_path, *args),
        cwd=ROOT,
        env=_demo_env(tmp_path, env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _start_demo(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        _demo_argv(tmp_path, *args),
        cwd=ROOT,
        env=_demo_env(tmp_path, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
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


DEMO_DB_URL = with_db(REDIS_URL, DEMO_REDIS_DB)


def _keys(url: str, prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match=f"{prefix}:*", count=1000))
    finally:
        client.close()


@pytest.fixture
def demo_prefix():
    prefix = f"fqtest-demo-{uuid.uuid4().hex[:12]}"
    yield prefix
    for url in (REDIS_URL, DEMO_DB_URL):
        client = redis.Redis.from_url(url)
        try:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


def _metric(url: str, name: str, **labels: str) -> float:
    """A sample's value from a Prometheus text page (0 if absent)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost
    try:
        with opener.open(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:  # the child is still starting its server
        return 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def _metric_reaches(url, name, minimum=1, timeout_s=30, **labels):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _metric(url, name, **labels) >= minimum:
            return True
        time.sleep(0.3)
    return False


# -- end to end ---------------------------------------------------------------------------


@pytest.mark.slow
def test_demo__every_part_shown_on_its_own_keys_then_everything_cleaned_up(tmp_path, demo_prefix):
    process = _start_demo(
        tmp_path,
        "--duration",
        "10",
        "--no-web",
        "--summary-every",
        "2",
        "--prefix",
        demo_prefix,
        env={"FAIRQUEUE_REDIS_URL": REDIS_URL},
    )
    lines = []
    try:
        for line in process.stdout:  # up to the metrics line: the children are running
            lines.append(line)
            if line.startswith("Metrics:"):
                break
        assert lines and lines[-1].startswith("Metrics:"), "".join(lines)
        enqueues, passes = re.findall(r"(http://127\.0\.0\.1:\d+/metrics)", lines[-1])
        # Metrics are served where the jobs are enqueued and where the passes run.
        assert _metric_reaches(
            enqueues, "queue_jobs_enqueued_total", queue="email", priority="critical"
        )
        assert _metric_reaches(
            enqueues, "queue_fair_priority_assigned_total", job_type="email", priority_level="low"
        )
        # The tenant flood goes past the short bound: the rebalancer's gauge says so.
        assert _metric_reaches(passes, "queue_fair_overdue_waiting", job_type="email")
        # While it runs, its jobs are in its own database under its own prefix.
        assert _keys(DEMO_DB_URL, demo_prefix)
        rest, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = "".join(lines) + rest
    assert process.returncode == 0, output
    assert f"using the server at 127.0.0.1:6379/{DEMO_REDIS_DB}" in output  # nothing embedded

    processed = _processed(output)
    assert all(processed[level] > 0 for level in LEVELS), processed
    # The critical flood outranks the low trickle, which is still served.
    assert processed["critical"] > processed["low"]
    assert re.search(r"\] email: \d+ done .* \| \d+ waiting", output), output
    assert re.search(r"over the 3\.0s bound: .*normal \d+", output), output  # the tenant flood
    assert "globex (enterprise)" in output  # no tier: the classifier rule made it enterprise
    audited = re.search(r"priority overrides audited while the demo ran: (\d+)", output)
    assert audited and int(audited.group(1)) > 0, output

    pids = _started_pids(output)
    assert set(pids) == {"worker", "rebalancer", "load"}, output
    assert not [name for name, pid in pids.items() if _alive(pid)]
    assert "exit code" not in output and "demo stopped" in output

    # Nothing left behind: not in its database, not in db 0.
    assert re.search(rf"deleted the demo's \d+ keys under {demo_prefix}:\*", output), output
    assert _keys(DEMO_DB_URL, demo_prefix) == []
    assert _keys(REDIS_URL, demo_prefix) == []


@pytest.mark.slow
def test_demo__ctrl_c_stops_it_and_deletes_its_keys(tmp_path, demo_prefix):
    process = _start_demo(
        tmp_path,
        "--no-web",
        "--summary-every",
        "1",
        "--prefix",
        demo_prefix,
        env={"FAIRQUEUE_REDIS_URL": REDIS_URL},
    )
    lines = []
    try:
        # Wait for a job done, not the first summary: under load that can come before
        # the load generator wrote anything.
        for line in process.stdout:
            lines.append(line)
            if re.search(r"\] email: [1-9]\d* done", line):
                break
        assert re.search(r"\] email: \d+ done", lines[-1]), "".join(lines)
        assert _keys(DEMO_DB_URL, demo_prefix), "".join(lines)
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = "".join(lines) + rest
    assert process.returncode == 0, output
    assert "SIGINT: stopping" in output
    assert not [name for name, pid in _started_pids(output).items() if _alive(pid)]
    assert _keys(DEMO_DB_URL, demo_prefix) == []


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
    assert "deleted the demo's" in output and "exit code" not in output


def test_demo__refuses_bullmqs_default_prefix_it_would_delete():
    with pytest.raises(CommandError, match=r"--prefix: 'bull' is not allowed: .*deletes its keys"):
        call_command("fairqueue_demo", prefix="bull")
    with pytest.raises(CommandError, match=r"--redis-db: '16' is not allowed"):
        call_command("fairqueue_demo", redis_db=16)


def test_with_db__same_server_and_credentials_other_database():
    assert with_db("redis://:pw@10.0.0.5:6380/0", 15) == "redis://:pw@10.0.0.5:6380/15"
    assert with_db("rediss://cache.internal", 3) == "rediss://cache.internal/3"
    assert with_db("unix:///run/redis.sock?db=0", 15) == "unix:///run/redis.sock?db=15"


def test_readme_snippet_in_manage_py_shell__an_enterprise_tenant_gets_critical(tmp_path, fq_prefix):
    """The demo project wires the plan lookup (project/apps.py): the README's enqueue line
    in ``manage.py shell`` gives an enterprise tenant's job the critical level."""
    env = _demo_env(tmp_path, {"FAIRQUEUE_PREFIX": fq_prefix, "FAIRQUEUE_REDIS_URL": REDIS_URL})
    code = (
        "from fairqueue.models import TenantPlan\n"
        "from fairqueue.enqueue.api import enqueue_job\n"
        "TenantPlan.objects.create(tenant_id='big-co', plan_tier='enterprise')\n"
        "TenantPlan.objects.create(tenant_id='small-co', plan_tier='free')\n"
        "for tenant in ('big-co', 'small-co'):\n"
        "    job = enqueue_job('email', {'template': 'invoice', 'invoice_id': 42}, "
        "tenant_id=tenant)\n"
        "    print(tenant, job.level.value)\n"
    )
    for argv in (["migrate", "--noinput", "-v", "0"], ["shell", "-c", code]):
        result = subprocess.run(
            [sys.executable, "manage.py", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    printed = result.stdout.splitlines()
    assert "big-co critical" in printed and "small-co low" in printed, result.stdout


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
    # A child that ends on the demo's SIGTERM (runserver does) is reported as stopped,
    # not as "exit code -15".
    assert how_stopped(polite, killed) == "stopped"
    assert how_stopped(stubborn, killed) == "killed after a timeout"


def test_how_stopped__names_only_an_unexpected_exit(tmp_path):
    supervisor = Supervisor(log_dir=tmp_path, env=dict(os.environ))
    failing = supervisor.start("failing", [sys.executable, "-c", "raise SystemExit(3)"])
    failing.process.wait(10)
    assert how_stopped(failing, []) == "exited with code 3"


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
def test_seed_classifier__a_rule_makes_the_tierless_tenant_enterprise_once():
    assert seed_classifier() == "prod_enterprise_annual -> enterprise"
    assert seed_classifier() == "prod_enterprise_annual -> enterprise"  # idempotent
    plans = dict(seed_tenants())
    assert TenantPlan.objects.get(tenant_id="globex").plan_tier == ""
    assert plans["globex"] == "enterprise"  # decided by the classifier rule


@pytest.mark.django_db
def test_seed_tenants__creates_one_per_plan_and_keeps_plans_changed_in_the_admin():
    plans = dict(seed_tenants())
    assert set(plans.values()) == {"enterprise", "pro", "free"}
    TenantPlan.objects.filter(tenant_id="acme").update(plan_tier="free")

    again = dict(seed_tenants())

    assert again["acme"] == "free"
    assert TenantPlan.objects.count() == len(DEMO_TENANTS)


# -- the summary --------------------------------------------------------------------------


C, H, N, L = PriorityLevel.CRITICAL, PriorityLevel.HIGH, PriorityLevel.NORMAL, PriorityLevel.LOW


def test_entitled_shares__a_trickle_is_entitled_to_its_demand_floods_split_the_rest():
    # Three flooded levels and a low trickle that got every job it had (4 of 200).
    shares = entitled_shares({C: 90, H: 64, N: 42, L: 4}, backlogged=[C, H, N])
    assert shares[L] == pytest.approx(4 / 200)  # not 10%: it asked for 2%
    assert shares[C] == pytest.approx(196 / 200 * 4 / 9)
    assert shares[H] == pytest.approx(196 / 200 * 3 / 9)
    assert shares[N] == pytest.approx(196 / 200 * 2 / 9)


def test_entitled_shares__all_backlogged_is_the_weights():
    shares = entitled_shares({C: 40, H: 30, N: 20, L: 10}, backlogged=[C, H, N, L])
    assert [round(shares[level], 3) for level in (C, H, N, L)] == [0.4, 0.3, 0.2, 0.1]


def test_entitled_shares__a_level_served_beyond_its_share_while_others_idle_is_capped():
    # Only critical asked, then left; low backlogged: low is entitled to what remains.
    shares = entitled_shares({C: 10, L: 90}, backlogged=[L])
    assert shares == {C: pytest.approx(0.1), H: 0.0, N: 0.0, L: pytest.approx(0.9)}
    assert entitled_shares({}, backlogged=[C]) == {}


def test_fairness_sample__served_against_entitled_oldest_waits_and_the_bound():
    sample = FairnessSample(
        elapsed_s=12,
        interval_s=3,
        done={C: 88, H: 66, N: 44, L: 2},
        oldest_wait_ms={C: 1500, H: 1200, N: 6500, L: None},
        tenant_wait_ms={"initech": 6500, "hooli": 300},
        waiting=812,
        waiting_by_level={C: 300, H: 220, N: 290},
        overdue_by_level={N: 120},
        max_wait_ms=3000,
    )
    line = sample.line()
    assert "\n" not in line
    assert "200 done (67/s)" in line
    # Low got its 1% trickle, and 1% is all it was entitled to: not "10%" as if failing.
    assert "served/entitled critical 44%/44% high 33%/33% normal 22%/22% low 1%/1%" in line
    assert "weights" not in line
    assert "critical 1.5s high 1.2s normal 6.5s low -" in line
    assert "initech 6.5s vs hooli 0.3s" in line
    assert "over the 3.0s bound: normal 120" in line
    assert line.endswith("| 812 waiting")


def test_target_backlog__a_second_of_the_workers_capacity():
    assert target_backlog(concurrency=4, work_ms=20) == 160
    assert target_backlog(concurrency=1, work_ms=60_000) == 20  # never below 20


def test_web__static_files_served_with_debug_off(tmp_path):
    # The demo's web child is `runserver --noreload --insecure`; DEBUG is off by default.
    port = free_port()
    env = {k: v for k, v in _demo_env(tmp_path, {}).items() if k != "DJANGO_DEBUG"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "runserver",
            "--noreload",
            "--insecure",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/static/fairqueue/dashboard.css"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
                    assert response.status == 200 and b"fq-" in response.read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with urllib.request.urlopen(  # noqa: S310
            f"http://127.0.0.1:{port}/static/admin/css/base.css", timeout=5
        ) as response:
            assert response.status == 200
    finally:
        server.terminate()
        server.wait(10)
