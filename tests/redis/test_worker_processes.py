"""``fairqueue_worker --processes``: a supervisor and its worker processes, in real
processes against a real Redis (each test under its own key prefix, removed afterwards).

Every job's handler records in Redis each run's start (job id and pid) and end, so a
test counts lost jobs (never done) and jobs run twice (done twice, or started again
while the first run went on). Timings on this machine are noisy: the tests wait for
what they check to happen, with wide margins, and assert the mechanism (which log line,
which pid, which exit status), not a latency.
"""

# The prefix and registry fixtures come from test_worker (imported, so shadowed by name).
# ruff: noqa: F811

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis
from django.core.management import CommandError, call_command

from fairqueue.broker import Broker
from fairqueue.management.commands.fairqueue_worker import processes
from fairqueue.worker.recycling import GRACE_EXPIRED_EXIT
from fairqueue.worker.supervisor import available_cores
from tests.helpers import free_port, spawner, wait_until
from tests.helpers.keys import REDIS_URL
from tests.helpers.worker_jobs import QUEUES, add, counts, run

# Worker processes started against deadlines: beside other test processes they starve.
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]
JOB_TYPE = "t_slow"

JOBS_MODULE = """
import os
import time

import redis

import fairqueue

_clients = {{}}


def _redis():
    # One client per process: a forked child must not share its parent's socket.
    client = _clients.get(os.getpid())
    if client is None:
        client = _clients[os.getpid()] = redis.Redis.from_url({url!r})
    return client


_leaks = []


@fairqueue.handler("t_slow")
def work(payload, job):
    r = _redis()
    rerun = not r.sadd("{prefix}:test:seen", job.job_id)
    r.rpush("{prefix}:test:started", f"{{job.job_id}} {{os.getpid()}}")
    if payload.get("leak_mb"):
        _leaks.append(b"x" * (payload["leak_mb"] * 1024 * 1024))
    time.sleep((payload.get("rerun_ms", 50) if rerun else payload.get("work_ms", 50)) / 1000)
    r.rpush("{prefix}:test:done", f"{{job.job_id}} {{os.getpid()}}")


@fairqueue.handler("t_async")
async def work_async(payload, job):
    import asyncio

    r = _redis()
    r.rpush("{prefix}:test:started", f"{{job.job_id}} {{os.getpid()}}")
    await asyncio.sleep(payload.get("work_ms", 50) / 1000)
    # Which loop ran it: one per process, the same for every job of the process.
    loop = id(asyncio.get_running_loop())
    r.rpush("{prefix}:test:done", f"{{job.job_id}} {{os.getpid()}} {{loop}}")
"""


class Output:
    """A process's output lines, read on a thread as they come."""

    def __init__(self, process) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process) -> None:
        try:
            for line in process.stdout:
                self.lines.append(line)
        except ValueError:  # the spawner closed the pipe on the way out
            pass

    def text(self) -> str:
        return "".join(self.lines)

    def count(self, fragment: str) -> int:
        return sum(fragment in line for line in self.lines)

    def wait_for(self, fragment: str, times: int = 1, timeout_s: float = 60.0) -> None:
        assert wait_until(lambda: self.count(fragment) >= times, timeout_s), self.text()


@pytest.fixture
def broker(prefix):
    return Broker(REDIS_URL, prefix)


@pytest.fixture
def runs(prefix):
    """Reads the handler's records: (started, done) as lists of (job id, pid)."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)

    def read() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        parsed = []
        for kind in ("started", "done"):
            items = client.lrange(f"{prefix}:test:{kind}", 0, -1)
            parsed.append([(item.split()[0], int(item.split()[1])) for item in items])
        return parsed[0], parsed[1]

    read.prefix = prefix
    yield read
    client.delete(*(f"{prefix}:test:{kind}" for kind in ("started", "done", "seen")))
    client.close()


@pytest.fixture
def supervised(prefix, tmp_path):
    """Start ``manage.py fairqueue_worker t_slow ARGS`` with the recording handler."""
    app = f"fq_proc_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / app).mkdir()
    (tmp_path / app / "__init__.py").write_text("")
    (tmp_path / app / "jobs.py").write_text(JOBS_MODULE.format(url=REDIS_URL, prefix=prefix))
    module = f"fq_proc_settings_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            from tests.settings import *  # noqa: F403
            INSTALLED_APPS = [*INSTALLED_APPS, {app!r}]  # noqa: F405
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

        def start(*args: str, extra_env: dict[str, str] | None = None, job_type=JOB_TYPE):
            process = spawn(
                [sys.executable, "manage.py", "fairqueue_worker", job_type, "-v", "1", *args],
                cwd=ROOT,
                env={**env, **(extra_env or {})},
            )
            return process, Output(process)

        yield start


def jobs(broker, count: int, **payload) -> list[str]:
    return add(broker, JOB_TYPE, *({"tenantId": f"t{i % 3}", **payload} for i in range(count)))


def child_pids(broker) -> list[int]:
    return [p.pid for p in run(broker, broker.workers.processes, QUEUES[JOB_TYPE])]


# -- arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("processes", "0", r"--processes: '0' is not allowed: expected an integer in 1..256 or"),
        ("processes", "many", r"--processes: 'many' is not allowed: expected an integer in 1"),
        ("processes", "257", r"--processes: '257' is not allowed"),
        ("grace_s", "-1", r"--grace-s: '-1' is not allowed: expected a number of seconds in 0"),
        ("max_jobs_per_child", "0", r"--max-jobs-per-child: '0' is not allowed: expected an"),
        ("max_memory_mb", "0", r"--max-memory-mb: '0' is not allowed: expected an integer \(MiB"),
        ("metrics_port", "70000", r"--metrics-port: '70000' is not allowed: expected a TCP port"),
    ],
)
def test_command__bad_process_options_name_argument_value_and_range(prefix, option, value, message):
    with pytest.raises(CommandError, match=message):
        call_command("fairqueue_worker", JOB_TYPE, burst=True, **{option: value})


def test_command__metrics_port_with_processes_needs_multiprocess_mode(prefix, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(CommandError, match=r"--metrics-port: 9999 .*PROMETHEUS_MULTIPROC_DIR"):
        call_command("fairqueue_worker", JOB_TYPE, burst=True, processes=2, metrics_port=9999)


def test_processes__auto_is_the_cores_this_process_may_use():
    assert processes("auto") == processes("AUTO") == available_cores()
    assert available_cores() == len(os.sched_getaffinity(0))
    assert processes("3") == 3


# -- recycling ------------------------------------------------------------------------------


def test_max_jobs_per_child__recycles_and_every_job_runs_once(broker, runs, supervised):
    ids = jobs(broker, 7, work_ms=10)
    process, output = supervised("--processes", "1", "--max-jobs-per-child", "3", "--burst")
    assert process.wait(timeout=120) == 0, output.text()
    started, done = runs()
    assert sorted(job for job, _ in done) == sorted(ids)  # none lost, none twice
    assert len(started) == 7
    pids = list(dict.fromkeys(pid for _, pid in done))
    assert [sum(pid == child for _, pid in done) for child in pids] == [3, 3, 1]
    assert output.count("recycled; restarting it now") == 2, output.text()
    assert output.count("[worker 0] recycling this process: 3 jobs done") == 2


@pytest.mark.slow
def test_max_memory_mb__a_leaking_child_is_recycled_without_losing_a_job(broker, runs, supervised):
    # Each job keeps 40 MiB alive: a child passes 200 MiB within a few jobs.
    ids = jobs(broker, 8, work_ms=10, leak_mb=40)
    process, output = supervised("--processes", "1", "--max-memory-mb", "200", "--burst")
    assert process.wait(timeout=180) == 0, output.text()
    started, done = runs()
    assert sorted(job for job, _ in done) == sorted(ids)
    assert len(started) == 8
    assert output.count("(--max-memory-mb 200)") >= 1, output.text()
    assert len({pid for _, pid in done}) >= 2
    assert counts(broker, JOB_TYPE)["completed"] == 8


def test_async_handler__each_process_awaits_on_its_own_loop(broker, runs, supervised, redis_client):
    ids = add(broker, "t_async", *({"tenantId": "t", "work_ms": 200} for _ in range(16)))
    process, output = supervised(
        "--processes", "2", "--concurrency", "4", "--burst", job_type="t_async"
    )
    assert process.wait(timeout=120) == 0, output.text()
    started, done = runs()
    assert sorted(job for job, _ in done) == sorted(ids)
    raw = redis_client.lrange(f"{runs.prefix}:test:done", 0, -1)
    loops = {}
    for item in raw:
        _, pid, loop = item.split()
        loops.setdefault(pid, set()).add(loop)
    assert all(len(ids_) == 1 for ids_ in loops.values()), loops  # one loop per process
    assert output.count("worker process 0 started") == output.count("worker process 1 started") == 1
    assert len(loops) == 2


# -- stopping --------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm__16_jobs_running_finish_none_lost_none_twice(broker, runs, supervised):
    ids = jobs(broker, 24, work_ms=8_000)
    process, output = supervised("--processes", "2", "--concurrency", "8", "--grace-s", "60")
    assert wait_until(lambda: len(runs()[0]) >= 16, 90), output.text()
    assert len(runs()[0]) == 16  # 2 processes x 8 slots: the rest wait

    process.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    assert process.wait(timeout=90) == 0, output.text()
    assert time.monotonic() - stopped < 60  # within the grace period
    started, done = runs()
    assert len(started) == 16 and Counter(job for job, _ in done) == Counter(
        job for job, _ in started
    )
    assert output.count("exited: stopped") == 2, output.text()
    assert counts(broker, JOB_TYPE)["active"] == 0

    # The 8 never taken are still there for the next worker.
    process, output = supervised("--burst", "--concurrency", "8")
    assert process.wait(timeout=120) == 0, output.text()
    started, done = runs()
    assert sorted(job for job, _ in done) == sorted(ids)
    assert len(started) == 24


@pytest.mark.slow
def test_sigterm__grace_over_exits_and_the_stalled_check_reruns_once(broker, runs, supervised):
    # First runs take 10 minutes; a rerun (after the stalled check) is quick.
    ids = jobs(broker, 4, work_ms=600_000, rerun_ms=10)
    process, output = supervised("--processes", "2", "--concurrency", "2", "--grace-s", "1")
    assert wait_until(lambda: len(runs()[0]) == 4, 90), output.text()
    first_pids = {pid for _, pid in runs()[0]}

    process.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    assert process.wait(timeout=60) == 0, output.text()
    assert time.monotonic() - stopped < 1 + 5 + 20  # grace, the kill margin, a loaded box
    assert output.count("grace period over") == 2, output.text()
    assert not any(_alive(pid) for pid in first_pids)  # the first runs ended with them
    assert runs()[1] == []

    # A new worker: BullMQ's stalled check hands the 4 back once their locks expire.
    process, output = supervised("--processes", "1", "--concurrency", "4")
    assert wait_until(lambda: len(runs()[1]) == 4, 150), output.text()
    started, done = runs()
    assert sorted(job for job, _ in done) == sorted(ids)  # each done once, none lost
    assert Counter(job for job, _ in started) == {job: 2 for job in ids}
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, output.text()


def test_second_signal__kills_the_children_and_exits_at_once(broker, runs, supervised):
    jobs(broker, 2, work_ms=600_000)
    process, output = supervised("--processes", "2")
    assert wait_until(lambda: len(runs()[0]) == 2, 90), output.text()
    pids = {pid for _, pid in runs()[0]}
    process.send_signal(signal.SIGTERM)
    output.wait_for("SIGTERM: stopping the worker processes")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 128 + signal.SIGINT, output.text()
    assert wait_until(lambda: not any(_alive(pid) for pid in pids), 10)
    assert runs()[1] == []


def test_single_process__grace_over_exits_with_its_status(broker, runs, supervised):
    jobs(broker, 1, work_ms=600_000)
    process, output = supervised("--grace-s", "0.5")
    assert wait_until(lambda: len(runs()[0]) == 1, 60), output.text()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == GRACE_EXPIRED_EXIT, output.text()
    assert "grace period of 0.5 s over with jobs still running" in output.text()
    assert runs()[1] == []


# -- a child killed ----------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_of_a_child__restarted_and_its_jobs_recovered(broker, runs, supervised, tmp_path):
    ids = jobs(broker, 8, work_ms=1_500, rerun_ms=10)
    metrics_dir = tmp_path / "prom"
    metrics_dir.mkdir()
    port = free_port()
    process, output = supervised(
        "--processes",
        "2",
        "--concurrency",
        "2",
        "--metrics-port",
        str(port),
        extra_env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
    )
    # The console's worker list: one liveness record per process.
    assert wait_until(lambda: len(child_pids(broker)) == 2, 60), output.text()
    assert wait_until(lambda: len(runs()[0]) >= 2, 60), output.text()
    victim = runs()[0][0][1]
    assert victim in child_pids(broker)
    (slot,) = [p.slot for p in run(broker, broker.workers.processes, "t_slow") if p.pid == victim]
    its_jobs = {job for job, pid in runs()[0] if pid == victim}

    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    output.wait_for("killed by SIGKILL", timeout_s=30)
    output.wait_for(f"worker process {slot} started (pid", times=2, timeout_s=30)
    # Restarted at once (it is the mechanism that is asserted; the delay is a loaded box's).
    assert "killed by SIGKILL; restarting it now" in output.text() or (
        "killed by SIGKILL; restarting it in 0.5 s" in output.text()
    )
    assert time.monotonic() - killed < 15, output.text()

    # Its jobs come back through BullMQ's stalled check (lock 30 s + check every 30 s).
    assert wait_until(lambda: len(runs()[1]) >= 8, 180), output.text()
    started, done = runs()
    assert sorted(job for job, _ in done) == sorted(ids)  # none lost, each done once
    assert its_jobs <= {job for job, count in Counter(j for j, _ in started).items() if count == 2}
    assert victim not in child_pids(broker)  # its record went with it (ages out on read)
    assert wait_until(lambda: len(child_pids(broker)) == 2, 30)

    # Metrics: the sum over every process, the supervisor's gauge and restart included.
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    text = scraped.decode()
    done = {"queue": "t_slow", "job_type": "t_slow", "outcome": "done"}
    assert _sample(text, "queue_fair_worker_jobs_total", done) == 8, text  # each job once
    assert _sample(text, "queue_fair_worker_processes", {}) == 2, text
    assert _sample(text, "queue_fair_worker_restarts_total", {"reason": "signal"}) == 1, text

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, output.text()


def _sample(text: str, name: str, labels: dict[str, str]) -> float:
    """The value of ``name``'s series with exactly ``labels`` in a scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no {name}{labels} in the scrape")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/status").read_text().count("State:\tZ")
