"""The demo project's ``manage.py fairqueue_demo``: the whole system runs, every level is
served, and everything the demo started is gone when it returns.

The demo is an application of fairqueue (project/demo.py), so it is tested as a user
meets it: through its command and what it prints and leaves behind, never through its
internals. The end-to-end tests run it as ``manage.py`` would, in a subprocess, under a
private prefix (``--prefix``) in the demo's database of the shared Redis (or a private
Redis) and a throwaway SQLite database: its children (worker, rebalancer, load
generator) are separate processes and cannot see pytest's test database.
"""

from __future__ import annotations

import io
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.core.management import CommandError, call_command
from prometheus_client.parser import text_string_to_metric_families

from fairqueue import conf
from tests.helpers import PrivateRedis, free_port, hang_up_server, wait_until
from tests.helpers.keys import REDIS_URL, delete_prefix

ROOT = Path(__file__).resolve().parents[2]
LEVELS = ("critical", "high", "normal", "low")
#: What the demo promises (its --help, the README): its database on a Redis it did not
#: start, the admin account it prints, and its five tenants.
DEMO_REDIS_DB = 15
DEMO_ADMIN = ("demo", "demo")
DEMO_PLANS = {
    "acme": "enterprise",
    "initech": "pro",
    "hooli": "pro",
    "umbrella": "free",
    "globex": "enterprise",  # no tier: a classifier rule decides from its subscription
}


def _with_db(url: str, db: int) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


DEMO_DB_URL = _with_db(REDIS_URL, DEMO_REDIS_DB)


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


def _read_until(process: subprocess.Popen, pattern: str) -> list[str]:
    """The demo's lines up to the first one matching ``pattern`` (or all, if it ended)."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if re.search(pattern, line):
            break
    return lines


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


def _keys(url: str, prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match=f"{prefix}:*", count=1000))
    finally:
        client.close()


def _answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    try:
        return client.ping()
    except redis.ConnectionError:
        return False
    finally:
        client.close()


@pytest.fixture
def demo_prefix():
    prefix = f"fqtest-demo-{uuid.uuid4().hex[:12]}"
    yield prefix
    for url in (REDIS_URL, DEMO_DB_URL):
        delete_prefix(prefix, url)


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


# -- the summary lines --------------------------------------------------------------------

_SHARE = r"(\d+%|-)"
_WAIT = r"(?:\d+\.\ds|-)"
#: A summary, line by line: each under 100 columns, each number labelled.
SUMMARY = re.compile(
    r"^\[\s*\d+s\] email: (?P<done>\d+) jobs run in the last \d+\.\ds \(\d+ jobs/s\); "
    r"\d+ since the start\n"
    + r"  run / entitled share: "
    + "  ".join(rf"{level} {_SHARE}/{_SHARE}" for level in LEVELS)
    + r"\n  waiting: (?P<waiting>\d+); the oldest job waited: "
    + "  ".join(f"{level} {_WAIT}" for level in LEVELS)
    + rf"\n  normal's tenants, the oldest job waited: initech {_WAIT}  hooli {_WAIT}"
    + r"\n  over the 3\.0s bound: (?:none|(?P<late>.+))"
    + r"(?P<why>(?:\n  -> .+ sends more than its share of \w+: its own jobs wait, no one "
    + r"else's)*)$",
    re.MULTILINE,
)


def _summaries(output: str) -> list[tuple[int, dict[str, tuple[int | None, int | None]]]]:
    """Every summary: jobs run, and each level's served and entitled percent."""
    headers = [line for line in output.splitlines() if line.startswith("[")]
    parsed = []
    for match in SUMMARY.finditer(output):
        values = [None if v == "-" else int(v.rstrip("%")) for v in match.groups()[1:9]]
        shares = {level: (values[2 * i], values[2 * i + 1]) for i, level in enumerate(LEVELS)}
        parsed.append((int(match["done"]), shares))
    assert len(parsed) == len(headers), f"not every summary parsed: {output}"
    return parsed


def _weights_split_the_rest(shares: dict[str, tuple[int | None, int | None]]) -> bool:
    """Low, a trickle, is entitled to what it got (not to 10%), and the three flooded
    levels to 4:3:2 of the rest."""
    low_served, low_entitled = shares["low"]
    if low_served is None or low_served != low_entitled or low_entitled >= 10:
        return False
    rest = 100 - low_entitled
    expected = {"critical": rest * 4 / 9, "high": rest * 3 / 9, "normal": rest * 2 / 9}
    return all(abs(shares[level][1] - share) <= 1.5 for level, share in expected.items())


# -- end to end ---------------------------------------------------------------------------


@pytest.mark.serial  # a subprocess or a live loop against a deadline
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
    try:
        lines = _read_until(process, r"^Metrics:")  # the children are running
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
    # The floods' targets: a second of the worker's capacity (4 x 1000 / (20 + 5) ms = 160
    # jobs) times each flood's share.
    assert "floods keep jobs waiting (critical flood 107, system mail 80, tenant flood 213)" in (
        output
    )

    processed = _processed(output)
    assert all(processed[level] > 0 for level in LEVELS), processed
    # The critical flood outranks the low trickle, which is still served.
    assert processed["critical"] > processed["low"]
    summaries = _summaries(output)
    assert len(summaries) >= 3, output
    for done, shares in summaries:
        if done:  # shares of what was served, served and entitled alike
            assert abs(sum(served or 0 for served, _ in shares.values()) - 100) <= 2, shares
            assert abs(sum(entitled or 0 for _, entitled in shares.values()) - 100) <= 2, shares
    assert any(_weights_split_the_rest(shares) for _, shares in summaries), output
    # The tenant flood goes past the bound, and the summary says whose jobs wait.
    assert re.search(r"over the 3\.0s bound: .*normal \d+ \(tenant initech \d+", output), output
    assert (
        "  -> tenant initech sends more than its share of normal: its own jobs wait, "
        "no one else's" in output
    )
    # Every line fits 100 columns (a log path outside the working directory aside).
    wide = [line for line in output.splitlines() if len(line) >= 100 and str(tmp_path) not in line]
    assert wide == [], wide
    assert "globex (enterprise)" in output  # no tier: the classifier rule made it enterprise
    audited = re.search(r"priority overrides audited while the demo ran: (\d+)", output)
    assert audited and int(audited.group(1)) > 0, output

    pids = _started_pids(output)
    assert set(pids) == {"worker", "rebalancer", "load"}, output
    assert not [name for name, pid in pids.items() if _alive(pid)]
    for name in pids:  # each ended on the demo's SIGTERM: "stopped", not an exit code
        assert f"  {name} (pid {pids[name]}) stopped" in output, output
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
    try:
        # Wait for a job done, not the first summary: under load that can come before
        # the load generator wrote anything.
        lines = _read_until(process, r"\] email: [1-9]\d* jobs run")
        assert re.search(r"\] email: \d+ jobs run", lines[-1]), "".join(lines)
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
    dead_port = free_port()
    process = _start_demo(
        tmp_path,
        "--duration",
        "6",
        "--no-web",
        env={"FAIRQUEUE_REDIS_URL": f"redis://127.0.0.1:{dead_port}/0"},
    )
    try:
        lines = _read_until(process, r"^Metrics:")
        output = "".join(lines)
        embedded = re.search(r"embedded server on 127\.0\.0\.1:(\d+) \(pid (\d+)\)", output)
        assert embedded, output
        port, pid = int(embedded.group(1)), int(embedded.group(2))
        # It is a real Redis, on the port the demo printed, on a port the OS chose.
        client = redis.Redis(port=port)
        try:
            assert client.ping() is True
            assert client.info("server")["tcp_port"] == port
        finally:
            client.close()
        rest, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output += rest
    assert process.returncode == 0, output
    # A bare PING found nothing where the URL points, so the demo embedded its own.
    assert f"nothing answers at 127.0.0.1:{dead_port}/0; starting the embedded Redis" in output
    processed = _processed(output)
    assert all(processed[level] > 0 for level in LEVELS), processed

    pids = _started_pids(output)
    assert set(pids) == {"redis", "worker", "rebalancer", "load"}, output
    assert pids["redis"] == pid
    assert not [name for name, pid in pids.items() if _alive(pid)]
    assert not _answers(f"redis://127.0.0.1:{port}/0")
    assert "deleted the demo's" in output and "exit code" not in output
    # Stopped last, cleanly on SIGTERM (exit code 0), its log where the demo keeps state.
    assert output.index("deleted the demo's") < output.index(f"  redis (pid {pid}) stopped")
    log = tmp_path / "state" / "redis" / "redis.log"
    assert "ready to exit, bye bye" in log.read_text(), log.read_text()


def _rows(database: Path, query: str) -> list[tuple]:
    connection = sqlite3.connect(database)
    try:
        return connection.execute(query).fetchall()
    finally:
        connection.close()


def _plans(output: str) -> dict[str, str]:
    line = re.search(r"^Tenants: (.*)$", output, re.MULTILINE)
    assert line, output
    return dict(re.findall(r"(\w+) \((\w+)\)", line.group(1)))


@pytest.mark.slow
def test_demo__seeds_once_restores_its_admin_and_keeps_what_was_changed_in_the_admin(
    tmp_path, demo_prefix
):
    """Two runs on one database, against a Redis that wants a password, over a unix
    socket: the demo's database (15) replaces the URL's, the password is kept (the runs
    work) and never printed."""
    server = PrivateRedis(
        tmp_path, aof=False, password="s3cret-pw", unix_socket=str(tmp_path / "redis.sock")
    ).start()
    database = tmp_path / "demo.sqlite3"
    env = {"FAIRQUEUE_REDIS_URL": server.url}
    argv = ("--duration", "0.5", "--no-web", "--prefix", demo_prefix)
    try:
        first = _run_demo(tmp_path, *argv, env=env)
        output = first.stdout + first.stderr
        assert first.returncode == 0, output
        assert f"using the server at unix:{tmp_path / 'redis.sock'}/{DEMO_REDIS_DB}" in output
        assert re.search(rf"deleted the demo's [1-9]\d* keys under {demo_prefix}:\*", output)
        assert "Admin: log in as 'demo' / 'demo' (created)" in output
        assert _plans(output) == DEMO_PLANS
        assert set(_plans(output).values()) == {"enterprise", "pro", "free"}
        assert "Classifier rule: prod_enterprise_annual -> enterprise" in output
        globex = "SELECT plan_tier FROM fairqueue_tenantplan WHERE tenant_id = 'globex'"
        assert _rows(database, globex) == [("",)]  # no tier: the rule decides

        # Someone changes the admin's password and flags, and a plan, in the admin.
        connection = sqlite3.connect(database)
        with connection:
            connection.execute(
                "UPDATE auth_user SET password = '!', is_staff = 0 WHERE username = 'demo'"
            )
            connection.execute(
                "UPDATE fairqueue_tenantplan SET plan_tier = 'free' WHERE tenant_id = 'acme'"
            )
        connection.close()

        second = _run_demo(tmp_path, *argv, env=env)
        again = second.stdout + second.stderr
        assert second.returncode == 0, again
        assert "Admin: log in as 'demo' / 'demo' (already there)" in again
        assert _plans(again) == {**DEMO_PLANS, "acme": "free"}  # the admin's change stays
        # ... and the run says so.
        assert "kept from an earlier run (edited in the admin): acme: plan free (demo: " in again
        assert "kept from an earlier run" not in output
        assert "Classifier rule: prod_enterprise_annual -> enterprise" in again
        assert "s3cret-pw" not in output + again
        # The demo's keys were in its database only, and are gone.
        client = redis.Redis.from_url(server.url)
        try:
            assert client.info("keyspace") == {}
        finally:
            client.close()
    finally:
        server.stop()

    users = _rows(database, "SELECT password, is_active, is_staff, is_superuser FROM auth_user")
    assert len(users) == 1
    password, *flags = users[0]
    assert flags == [1, 1, 1]
    assert PBKDF2PasswordHasher().verify(DEMO_ADMIN[1], password)  # the printed password
    assert _rows(database, "SELECT COUNT(*) FROM fairqueue_tenantplan") == [(len(DEMO_PLANS),)]
    assert _rows(database, "SELECT COUNT(*) FROM fairqueue_subscriptionclassifier") == [(1,)]
    assert _rows(database, "SELECT COUNT(*) FROM fairqueue_classifierrule") == [(1,)]


@pytest.mark.slow
def test_demo__a_child_that_dies_fails_it_and_a_child_that_does_not_stop_is_killed(
    tmp_path, demo_prefix
):
    """Jobs of 30 s keep the worker busy past the demo's stop timeout (10 s); the
    rebalancer is killed under it. The demo fails naming the dead child, still stops the
    others in order, kills the worker that would not stop in time, and cleans up."""
    process = _start_demo(
        tmp_path,
        "--no-web",
        "--work-ms",
        "30000",
        "--concurrency",
        "1",
        "--summary-every",
        "1",
        "--prefix",
        demo_prefix,
        env={"FAIRQUEUE_REDIS_URL": REDIS_URL},
    )
    client = redis.Redis.from_url(DEMO_DB_URL)
    try:
        lines = _read_until(process, r"^Metrics:")
        pids = _started_pids("".join(lines))
        assert set(pids) == {"worker", "rebalancer", "load"}, "".join(lines)
        # Keep reading (the pipe must not fill up) until the worker holds an email job
        # and a summary was printed.
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()

        def busy_and_summarised() -> bool:
            active = client.llen(f"{demo_prefix}:email:active")
            return bool(active) and any(line.startswith("[") for line in lines)

        assert wait_until(busy_and_summarised, timeout_s=60), "".join(lines)
        os.kill(pids["rebalancer"], signal.SIGKILL)
        process.wait(90)
        reader.join(10)
    finally:
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    output = "".join(lines)
    assert process.returncode == 1, output
    assert f"rebalancer (pid {pids['rebalancer']}) exited with code -9; the end of " in output
    # Floods of 30 s jobs: a second of one job at a time is below the floor of 20 jobs.
    assert "floods keep jobs waiting (critical flood 13, system mail 10, tenant flood 27)" in (
        output
    )
    # No job finished: nothing served, so nobody is entitled to anything.
    assert re.search(r"email: 0 jobs run in the last \d+\.\ds \(0 jobs/s\)", output), output
    assert "run / entitled share: critical -/-  high -/-  normal -/-  low -/-" in output
    assert f"  load (pid {pids['load']}) stopped" in output
    assert f"  worker (pid {pids['worker']}) killed after a timeout" in output
    # Only an unexpected end is worth its exit code.
    assert f"  rebalancer (pid {pids['rebalancer']}) exited with code -9" in output
    assert not [name for name, pid in pids.items() if _alive(pid)]
    assert "deleted the demo's" in output and "demo stopped" in output
    assert _keys(DEMO_DB_URL, demo_prefix) == []


# -- refusals before anything starts ------------------------------------------------------


def test_demo__refuses_bullmqs_default_prefix_it_would_delete():
    with pytest.raises(CommandError, match=r"--prefix: 'bull' is not allowed: .*deletes its keys"):
        call_command("fairqueue_demo", prefix="bull")
    with pytest.raises(CommandError, match=r"--redis-db: '16' is not allowed"):
        call_command("fairqueue_demo", redis_db=16)


def test_demo__a_bad_duration_is_refused_before_anything_starts():
    with pytest.raises(CommandError, match=r"--duration: '0' is not allowed"):
        call_command("fairqueue_demo", duration=0)


def test_demo__a_server_that_answers_but_refuses_its_connection_stops_it_before_anything(
    tmp_path, monkeypatch
):
    """Something answers at the URL (a port probe works) but the demo's client cannot
    talk to it (here: TLS to a server that hangs up): the demo names where, on its own
    database of the same server, and fails before it migrates or starts a child."""
    with hang_up_server() as port:
        monkeypatch.setenv("FAIRQUEUE_REDIS_URL", f"rediss://:hunter2@127.0.0.1:{port}")
        conf.reload_settings()
        out = io.StringIO()
        try:
            with pytest.raises(CommandError) as refused:
                call_command(
                    "fairqueue_demo", redis_db=3, no_web=True, state_dir=tmp_path, stdout=out
                )
        finally:
            monkeypatch.delenv("FAIRQUEUE_REDIS_URL")
            conf.reload_settings()
    output = out.getvalue()
    assert f"Redis: using the server at 127.0.0.1:{port}/3 (FAIRQUEUE_REDIS_URL, database 3)" in (
        output
    )
    assert str(refused.value).startswith(
        f"Redis at 127.0.0.1:{port}/3 answers but refused the demo's connection ("
    )
    assert "hunter2" not in output + str(refused.value)
    assert "Admin:" not in output and "started" not in output
    assert not (tmp_path / "logs").exists()


# -- the demo project ---------------------------------------------------------------------


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


def test_demo_redis_line__names_the_setting_that_chose_the_server(settings, monkeypatch):
    """ "(FAIRQUEUE_REDIS_URL, database 15)" only when that variable is set; otherwise the
    line says which setting (or the default) chose the server."""
    from types import SimpleNamespace

    from project.management.commands.fairqueue_demo import Demo

    def source() -> str:
        conf.reload_settings()
        return Demo._redis_source(SimpleNamespace(settings=conf.load_settings()))

    monkeypatch.delenv("FAIRQUEUE_REDIS_URL", raising=False)
    settings.FAIRQUEUE = {"QUEUES": {"email": "email"}}
    assert source() == "the default URL; FAIRQUEUE_REDIS_URL is not set"
    settings.FAIRQUEUE = {"QUEUES": {"email": "email"}, "REDIS_URL": REDIS_URL}
    assert source() == "FAIRQUEUE['REDIS_URL']"
    monkeypatch.setenv("FAIRQUEUE_REDIS_URL", REDIS_URL)
    assert source() == "FAIRQUEUE_REDIS_URL"
    monkeypatch.delenv("FAIRQUEUE_REDIS_URL")
    conf.reload_settings()
