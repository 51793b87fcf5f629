"""The fault suite: kill -9 Redis (AOF on) and the leader under real processes, and count.

Every scenario runs real OS processes against a private ``redis-server`` with
``appendonly yes`` / ``appendfsync always`` on its own port, and a scratch database of
its own (a PostgreSQL database created for the suite when ``DATABASE_URL`` is
PostgreSQL, else an SQLite file), migrated by ``manage.py migrate``:
``manage.py rebalance_fair`` and ``manage.py fairqueue_relay`` as they are deployed, the
enqueuer and stock ``bullmq.Worker`` processes from ``tests/helpers/fault_agent.py``.

What is counted, per scenario (printed as ``faults[...]: enqueued=... processed=...
duplicated=... lost=... audit_mismatches=...``):

* enqueued: job ids the enqueuer committed (outbox ids, or caller ids it enqueued);
* processed: of those, jobs BullMQ holds as completed;
* duplicated: completions confirmed twice for one id (two ``completed`` events, each
  emitted by a worker after BullMQ's ``moveToCompleted`` returned), plus jobs in Redis
  under ids nobody enqueued (a second copy of a job under a new id). A processor that
  ran again because Redis died while its job was active, and whose first completion
  never reached Redis, is at-least-once delivery, not a duplicate: it is reported as
  ``reruns``;
* lost: enqueued ids that never completed, plus outbox rows left behind;
* audit mismatches: audit rows whose job is not in Redis, audited jobs without exactly
  one audit row, and audit rows of jobs that were not audited.

All but the first two must be 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis

from tests.helpers import PrivateRedis, free_port, wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "email"


# -- the scratch database ---------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch_db(tmp_path_factory):
    """A database URL the suite's processes share, migrated; dropped afterwards."""
    url = os.environ.get("DATABASE_URL", "")
    name = None
    if url.startswith(("postgres://", "postgresql://")):
        import psycopg

        name = f"fq_faults_{uuid.uuid4().hex[:10]}"
        base, _, _ = url.rpartition("/")
        admin_url = url.replace("postgres://", "postgresql://", 1)
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        db_url = f"{base}/{name}"
    else:
        db_url = f"sqlite:///{tmp_path_factory.mktemp('faults-db') / 'db.sqlite3'}"
    env = {**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
    )
    yield db_url
    if name is not None:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


# -- the processes ------------------------------------------------------------------------


class Cluster:
    """The processes of one scenario, sharing one Redis, prefix and database."""

    def __init__(self, tmp_path: Path, db_url: str, server: PrivateRedis) -> None:
        self.tmp_path = tmp_path
        self.server = server
        self.prefix = f"fqfault-{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "FAIRQUEUE_REDIS_URL": server.url,
            "FAIRQUEUE_PREFIX": self.prefix,
            "PYTHONPATH": str(ROOT),
            # Keep every finished job (retention's largest values): the suite counts
            # completions from BullMQ's completed set.
            "FAIRQUEUE_KEEP_COMPLETED_COUNT": "100000000",
            "FAIRQUEUE_KEEP_COMPLETED_AGE_S": "315360000",
            "FAIRQUEUE_KEEP_FAILED_COUNT": "100000000",
            "FAIRQUEUE_KEEP_FAILED_AGE_S": "315360000",
        }
        self.env.pop("FAIRQUEUE_TEST_DB_NAME", None)
        self.processes: list[subprocess.Popen] = []
        self.worker_files: list[Path] = []
        self.logs: list[Path] = []
        self.agent("reset", wait=True)

    def _start(self, args: list[str], name: str) -> subprocess.Popen:
        log = self.tmp_path / f"{name}-{len(self.logs)}.log"
        self.logs.append(log)
        process = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=self.env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        self.processes.append(process)
        return process

    def agent(self, *args: str, wait: bool = False) -> subprocess.Popen:
        process = self._start(["-m", "tests.helpers.fault_agent", *args], f"agent-{args[0]}")
        if wait:
            assert process.wait(120) == 0, self.log_tail()
        return process

    def manage(self, *args: str) -> subprocess.Popen:
        return self._start(["manage.py", *args], args[0])

    def rebalancer(self) -> subprocess.Popen:
        return self.manage("rebalance_fair", "--queue", QUEUE, "--interval-ms", "100")

    def relay(self, batch_size: int = 250) -> subprocess.Popen:
        return self.manage(
            "fairqueue_relay", "--interval-ms", "100", "--batch-size", str(batch_size)
        )

    def node_worker(self, node: str, script: str, out: Path, *args: str) -> subprocess.Popen:
        """A stock Node BullMQ worker (tests/node/``script``) on ``QUEUE``; what it
        prints goes to ``out``."""
        from tests.helpers.node import NODE_DIR

        process = subprocess.Popen(  # noqa: S603
            [node, str(NODE_DIR / script), self.server.url, self.prefix, QUEUE, *args],
            stdout=out.open("w"),
            stderr=subprocess.STDOUT,
        )
        self.processes.append(process)
        return process

    def workers(self, count: int) -> None:
        for _ in range(count):
            path = self.tmp_path / f"worker-{len(self.worker_files)}.txt"
            self.worker_files.append(path)
            self.agent("worker", str(path))

    def enqueue(self, count: int, mode: str) -> tuple[subprocess.Popen, Path]:
        path = self.tmp_path / f"enqueued-{uuid.uuid4().hex[:6]}.jsonl"
        return self.agent("enqueue", str(path), str(count), mode), path

    def agent_report(self, command: str):
        """What the fault agent's ``command`` (``check``, ``usage``) prints, as JSON."""
        process = subprocess.run(
            [sys.executable, "-m", "tests.helpers.fault_agent", command],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return json.loads(process.stdout)

    def database(self) -> dict:
        return self.agent_report("check")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)

    def log_tail(self, lines: int = 30) -> str:
        text = []
        for log in self.logs:
            content = log.read_text(errors="replace").splitlines()[-lines:]
            if content:
                text.append(f"--- {log.name}\n" + "\n".join(content))
        return "\n".join(text)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.server.port, decode_responses=True, socket_timeout=5)

    def completed_count(self) -> int:
        try:
            client = self.client()
            try:
                return client.zcard(f"{self.prefix}:{QUEUE}:completed")
            finally:
                client.close()
        except redis.RedisError:
            return -1


@pytest.fixture
def server(tmp_path):
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()
    server = PrivateRedis(redis_dir, port=free_port(), aof=True)
    yield server
    server.stop()


@pytest.fixture
def cluster(tmp_path, scratch_db, server):
    server.start()
    cluster = Cluster(tmp_path, scratch_db, server)
    yield cluster
    cluster.stop()


# -- counting -----------------------------------------------------------------------------


def read_enqueued(path: Path) -> tuple[list[str], list[str]]:
    ids: list[str] = []
    audited: list[str] = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        ids += record["ids"]
        audited += record["audited"]
    return ids, audited


def redis_job_ids(client: redis.Redis, prefix: str) -> set[str]:
    """Every job id of the queue in Redis, whatever its state."""
    base = f"{prefix}:{QUEUE}:"
    ids = set()
    for key in client.scan_iter(match=f"{base}*", count=1000):
        rest = key[len(base) :]
        if ":" not in rest and client.type(key) == "hash" and client.hexists(key, "data"):
            ids.add(rest)
    return ids


def tally(name: str, cluster: Cluster, ids: list[str], audited: list[str], capsys) -> dict:
    """Count, print and return the suite's figures for one scenario."""
    client = cluster.client()
    try:
        completed = set(client.zrange(f"{cluster.prefix}:{QUEUE}:completed", 0, -1))
        in_redis = redis_job_ids(client, cluster.prefix)
    finally:
        client.close()
    confirmations: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    for path in cluster.worker_files:
        for line in path.read_text().splitlines():
            kind, _, job_id = line.partition(" ")
            if kind == "C":
                confirmations[job_id] += 1
            elif kind == "R":
                runs[job_id] += 1
    database = cluster.database()
    expected = set(ids)
    audit_rows = Counter(database["audits"])
    audited_set = set(audited)
    counts = {
        "enqueued": len(ids),
        "processed": len(expected & completed),
        "duplicated": (len(ids) - len(expected))
        + sum(1 for n in confirmations.values() if n > 1)
        + len(in_redis - expected),
        "lost": len(expected - completed) + database["outbox"],
        "audit_mismatches": sum(1 for job_id in audit_rows if job_id not in in_redis)
        + sum(1 for job_id in audited_set if audit_rows[job_id] != 1)
        + sum(1 for job_id in audit_rows if job_id not in audited_set),
        "reruns": sum(1 for n in runs.values() if n > 1),
    }
    with capsys.disabled():
        print(
            f"\nfaults[{name}]: enqueued={counts['enqueued']} processed={counts['processed']} "
            f"duplicated={counts['duplicated']} lost={counts['lost']} "
            f"audit_mismatches={counts['audit_mismatches']} "
            f"(processor re-runs after a crash, not duplicates: {counts['reruns']}; "
            f"audit rows {sum(audit_rows.values())}, outbox left {database['outbox']})"
        )
    return counts


def assert_exact(counts: dict, cluster: Cluster) -> None:
    assert counts["enqueued"] > 0
    assert counts["processed"] == counts["enqueued"], cluster.log_tail()
    assert (counts["duplicated"], counts["lost"], counts["audit_mismatches"]) == (0, 0, 0), (
        cluster.log_tail()
    )


def drain(cluster: Cluster, total: int, workers: int = 2, timeout_s: float = 90) -> None:
    cluster.workers(workers)
    assert wait_until(lambda: cluster.completed_count() >= total, timeout_s, 0.2), (
        f"completed {cluster.completed_count()} of {total}\n{cluster.log_tail()}"
    )


def kill_when(cluster: Cluster, probe, low: int, high: int, timeout_s: float = 60) -> int:
    """Poll ``probe`` (a count from Redis) and kill -9 Redis as soon as it is in
    ``low..high``: the killed work was under way. The count seen."""
    deadline = time.monotonic() + timeout_s
    client = cluster.client()
    try:
        while time.monotonic() < deadline:
            seen = probe(client)
            if low <= seen <= high:
                cluster.server.kill9()
                return seen
            time.sleep(0.002)
    finally:
        client.close()
    raise AssertionError(f"never saw {low}..{high}\n{cluster.log_tail()}")


def relayed_exactly_once(cluster: Cluster, path: Path, total: int, what: str, capsys) -> None:
    """Once the outbox is empty, workers drain the queue: every job the enqueuer wrote to
    ``path`` ran exactly once (tallied as ``what``)."""
    assert wait_until(lambda: cluster.database()["outbox"] == 0, 60, 0.5), cluster.log_tail()
    drain(cluster, total)
    ids, audited = read_enqueued(path)
    assert_exact(tally(what, cluster, ids, audited, capsys), cluster)


# -- scenarios ----------------------------------------------------------------------------


def test_kill9_redis_mid_relay__every_job_once(tmp_path, scratch_db, server, capsys):
    """Rows written while Redis is down; Redis killed while the relay moves them."""
    cluster = Cluster(tmp_path, scratch_db, server)  # Redis not started: rows wait
    try:
        total = 2_000
        enqueuer, path = cluster.enqueue(total, "durable")
        assert enqueuer.wait(120) == 0, cluster.log_tail()
        assert cluster.database()["outbox"] == total
        server.start()
        cluster.relay(batch_size=50)
        prioritized = f"{cluster.prefix}:{QUEUE}:prioritized"
        seen = kill_when(cluster, lambda c: c.zcard(prioritized), total // 10, total - 250)
        time.sleep(1.0)
        server.start()  # same port, same AOF
        relayed_exactly_once(
            cluster, path, total, f"kill -9 Redis mid-relay at {seen}/{total}", capsys
        )
    finally:
        cluster.stop()


def test_kill9_redis_mid_pass__adoption_loses_and_duplicates_nothing(cluster, capsys):
    """Other producers' jobs (plain BullMQ adds) adopted by the pass; Redis killed while
    the pass writes."""
    total = 5_000
    ids = asyncio.run(_plain_bullmq_adds(cluster.server.url, cluster.prefix, total))
    cluster.rebalancer()
    wait_list = f"{cluster.prefix}:{QUEUE}:wait"
    seen = kill_when(cluster, lambda c: total - c.llen(wait_list), 1, total - 500)
    time.sleep(1.0)
    cluster.server.start()
    client = cluster.client()
    try:
        assert wait_until(lambda: client.llen(wait_list) == 0, 60, 0.2), cluster.log_tail()
    finally:
        client.close()
    drain(cluster, total, workers=4)
    counts = tally(f"kill -9 Redis mid-pass at {seen}/{total} adopted", cluster, ids, [], capsys)
    assert_exact(counts, cluster)


async def _plain_bullmq_adds(url: str, prefix: str, total: int) -> list[str]:
    from bullmq import Queue

    queue = Queue(QUEUE, {"connection": url, "prefix": prefix})
    try:
        ids = []
        for start in range(0, total, 1_000):
            jobs = await queue.addBulk(
                [
                    {"name": "plain", "data": {"n": n}, "opts": {"jobId": f"plain-{n}"}}
                    for n in range(start, min(start + 1_000, total))
                ]
            )
            ids += [job.id for job in jobs]
        return ids
    finally:
        await queue.close()


def test_kill9_leader_mid_write__the_next_leader_finishes(tmp_path, scratch_db, server, capsys):
    """The rebalance_fair leader relays outbox rows; it is killed -9 mid-way and a second
    rebalancer takes over once the lock expires."""
    cluster = Cluster(tmp_path, scratch_db, server)  # Redis not started: rows wait
    try:
        total = 3_000
        enqueuer, path = cluster.enqueue(total, "durable")
        assert enqueuer.wait(120) == 0, cluster.log_tail()
        server.start()
        leader = cluster.rebalancer()
        prioritized = f"{cluster.prefix}:{QUEUE}:prioritized"
        client = cluster.client()
        try:
            assert wait_until(lambda: client.zcard(prioritized) >= 1, 30, 0.002)
            leader.kill()
            leader.wait(10)
            seen = client.zcard(prioritized)
        finally:
            client.close()
        assert seen < total, "the leader finished before it could be killed"
        cluster.rebalancer()
        relayed_exactly_once(
            cluster, path, total, f"kill -9 leader at {seen}/{total} relayed", capsys
        )
    finally:
        cluster.stop()


def test_everything_at_once__10000_jobs_two_redis_restarts(cluster, capsys):
    """3 rebalancers, 4 stock workers, the relay and an enqueuer (durable and direct
    jobs, some audited) over 10,000 jobs; Redis killed -9 and restarted twice."""
    total = 10_000
    for _ in range(3):
        cluster.rebalancer()
    cluster.relay()
    cluster.workers(4)
    enqueuer, path = cluster.enqueue(total, "mixed")
    restarts = []
    for fraction in (0.3, 0.6):
        assert wait_until(lambda f=fraction: cluster.completed_count() >= f * total, 120, 0.05), (
            cluster.log_tail()
        )
        restarts.append(cluster.completed_count())
        cluster.server.kill9()
        time.sleep(1.0)
        cluster.server.start()
    assert enqueuer.wait(180) == 0, cluster.log_tail()
    assert wait_until(lambda: cluster.completed_count() >= total, 120, 0.2), (
        f"completed {cluster.completed_count()} of {total}\n{cluster.log_tail()}"
    )
    ids, audited = read_enqueued(path)
    counts = tally(
        "3 rebalancers + 4 workers + relay, Redis restarted twice", cluster, ids, audited, capsys
    )
    assert len(restarts) == 2
    assert_exact(counts, cluster)


def test_tenant_limits__kill9_leader_and_worker_and_a_redis_restart(cluster, capsys):
    """A tenant limited to 3 running jobs floods beside an unlimited one, with two stock
    workers of 4 slots and the loop running: the leader is killed -9 while jobs are held,
    a worker is killed -9 mid-job (its jobs stall), Redis is killed -9 and restarted from
    its AOF. Sampling BullMQ's active list throughout, the tenant never has more than 3
    jobs running; afterwards every job ran to completion once, and the tenant's occupied
    slots match its jobs in BullMQ's active list (none)."""
    cluster.env["FAULT_JOB_MS"] = "20"
    total = 600
    enqueuer, path = (
        cluster.agent("limited", str(cluster.tmp_path / "limited.jsonl"), "300", "3"),
        (cluster.tmp_path / "limited.jsonl"),
    )
    assert enqueuer.wait(120) == 0, cluster.log_tail()
    limited_ids = set()
    for line in path.read_text().splitlines():
        limited_ids.update(json.loads(line)["limited"])
    leader = cluster.rebalancer()
    cluster.workers(2)
    active_key = f"{cluster.prefix}:{QUEUE}:active"
    base = f"{cluster.prefix}:{QUEUE}:fq:lim"
    most = 0
    stages: list[str] = []

    held_seen = [0]

    def sample(client) -> int:
        nonlocal most
        running = sum(1 for job_id in client.lrange(active_key, 0, -1) if job_id in limited_ids)
        most = max(most, running)
        held_seen[0] = client.llen(f"{base}:held:lim")
        return held_seen[0]

    def run_until(predicate, timeout_s=60):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            client = cluster.client()
            try:
                if predicate(client):
                    return True
            except redis.RedisError:
                pass
            finally:
                client.close()
            time.sleep(0.005)
        raise AssertionError(f"timed out after {stages}\n{cluster.log_tail()}")

    run_until(lambda c: 0 < sample(c) < 250)
    leader.kill()  # kill -9 while jobs are held
    leader.wait(10)
    stages.append(f"leader killed with {held_seen[0]} held")
    cluster.rebalancer()  # the next leader, once the old lock expires
    victim = next(p for p in cluster.processes if "worker" in str(p.args))
    run_until(lambda c: sample(c) < 200 and c.llen(active_key) > 0)
    victim.kill()  # kill -9 a worker mid-job: its jobs stall
    victim.wait(10)
    stages.append(f"worker killed with {held_seen[0]} held")
    run_until(lambda c: 0 < sample(c) < 150)
    cluster.server.kill9()
    stages.append(f"redis killed with {held_seen[0]} held")
    cluster.server.start()  # from its AOF
    stages.append("redis restarted")
    cluster.workers(1)
    run_until(
        lambda c: (sample(c), c.zcard(f"{cluster.prefix}:{QUEUE}:completed"))[1] >= total, 120
    )
    ids, audited = read_enqueued(path)
    counts = tally("tenant limits: kill -9 leader, worker, redis", cluster, ids, audited, capsys)
    assert_exact(counts, cluster)
    assert most <= 3, f"the limited tenant had {most} jobs running at once"
    client = cluster.client()
    try:
        assert client.llen(f"{base}:held:lim") == 0
        # every occupied slot was freed once its job finished (checked against BullMQ's
        # completed set at the next release): nothing leaked
        assert wait_until(lambda: client.scard(f"{base}:out:lim") == 0, 10), client.smembers(
            f"{base}:out:lim"
        )
        assert client.zcard(f"{cluster.prefix}:{QUEUE}:delayed") == 0
    finally:
        client.close()
    with capsys.disabled():
        print(f"faults[tenant limits]: most running at once {most} (limit 3), stages {stages}")


@pytest.fixture
def node():
    import shutil

    from tests.helpers.node import NODE_DIR

    if shutil.which("node") is None or not (NODE_DIR / "node_modules" / "bullmq").is_dir():
        pytest.skip("node or tests/node/node_modules missing (run: cd tests/node && npm ci)")
    return shutil.which("node")


def test_tenant_limits__kill9_loop_mid_release_with_paused_and_limited_tenants(
    node, cluster, capsys
):
    """A paused tenant's 3,000 held jobs are resumed under a stock 16-slot Node worker,
    beside a tenant still paused (100 jobs), one limited to 2 running (100) and a free
    one (100), the loop (``manage.py rebalance_fair``) releasing the backlog; the loop is
    killed -9 mid-way and started again. Sampling BullMQ's active list throughout, no job
    of the paused tenant starts while it is paused and the limited one never runs more
    than 2; every job of the others runs once; resumed at last, the paused tenant's
    jobs all run too, each once, none before its resume: nothing lost, nothing twice."""

    total_drain = 3_000
    out = cluster.tmp_path / "paused.json"
    cluster.agent("paused", str(out), str(total_drain), wait=True)
    jobs = json.loads(out.read_text())
    zed, cap = set(jobs["zed"]), set(jobs["cap"])
    base = f"{cluster.prefix}:{QUEUE}:fq:lim"
    active_key = f"{cluster.prefix}:{QUEUE}:active"
    starts_path = cluster.tmp_path / "node-starts.txt"
    worker = cluster.node_worker(node, "limits_worker.mjs", starts_path, "16", "300000", "10", "")
    leader = cluster.rebalancer()
    most_cap, zed_started, seen = 0, 0, [0]

    def sample(client) -> None:
        nonlocal most_cap, zed_started
        active = client.lrange(active_key, 0, -1)
        most_cap = max(most_cap, sum(1 for job_id in active if job_id in cap))
        zed_started += sum(1 for job_id in active if job_id in zed)

    client = cluster.client()
    try:

        def held_drain() -> int:
            sample(client)
            seen[0] = client.llen(f"{base}:held:drain")
            return seen[0]

        low, high = total_drain // 4, 3 * total_drain // 4
        assert wait_until(lambda: client.zcard(f"{cluster.prefix}:{QUEUE}:completed") >= 1, 60)
        assert client.llen(f"{base}:held:drain") == total_drain  # paused: none out
        drain_resumed_ms = int(time.time() * 1000)
        cluster.agent("resume", "drain", wait=True)
        assert wait_until(lambda: low <= held_drain() <= high, 60, 0.002), cluster.log_tail()
        leader.kill()  # kill -9 mid-release: the backlog half out
        leader.wait(10)
        killed_at = seen[0]
        cluster.rebalancer()  # the next loop, once the old one's lock expires
        others = len(jobs["ids"]) - len(zed)

        def others_done() -> bool:
            sample(client)
            return client.zcard(f"{cluster.prefix}:{QUEUE}:completed") >= others

        assert wait_until(others_done, 120, 0.005), cluster.log_tail()
        assert client.llen(f"{base}:held:zed") == len(zed)  # all still held
        resumed_ms = int(time.time() * 1000)
        cluster.agent("resume", "zed", wait=True)
        assert wait_until(
            lambda: client.zcard(f"{cluster.prefix}:{QUEUE}:completed") >= len(jobs["ids"]),
            60,
            0.05,
        ), cluster.log_tail()
    finally:
        client.close()
    worker.kill()
    worker.wait(10)
    starts = [line.split(" ") for line in starts_path.read_text().splitlines()]
    started = Counter(job_id for _, job_id, *_ in starts)
    assert zed_started == 0
    assert all(int(at) >= resumed_ms for _, job_id, _, _, at in starts if job_id in zed)
    drain = set(jobs["drain"])
    assert all(int(at) >= drain_resumed_ms for _, job_id, _, _, at in starts if job_id in drain)
    assert most_cap <= 2, most_cap
    assert set(started) == set(jobs["ids"]) and set(started.values()) == {1}
    counts = tally(
        f"kill -9 loop mid-release at {killed_at}/{total_drain} held", cluster,
        jobs["ids"], [], capsys,
    )  # fmt: skip
    assert_exact(counts, cluster)


def test_usage_ledger__kill9_loop_between_the_redis_count_and_the_database_write(
    node, cluster, capsys
):
    """10,000 jobs of ten tenants (one whose jobs always fail, 2 attempts each) under a
    stock 16-slot Node worker, the loop counting them into the usage ledger; the loop is
    killed -9 while Redis holds counts the database does not have yet (its dirty set is
    not empty), and a second time later, each time started again. At the end the
    ledger's attempts, completions and failures per tenant equal what the worker itself
    counted, exactly, and its worker time is within 1% of what the worker measured: from
    taking each job to its end as BullMQ recorded them (processedOn, finishedOn), on the
    worker's clock (the processors alone ran less: the report prints both)."""

    total = 10_000
    out = cluster.tmp_path / "tenants.json"
    leader = cluster.rebalancer()  # the history's cursor starts before the first job
    client = cluster.client()
    assert wait_until(lambda: client.hexists(f"{cluster.prefix}:{QUEUE}:fq:hist", "cursor"), 30)
    cluster.agent("tenants", str(out), str(total), wait=True)
    ids = json.loads(out.read_text())["ids"]
    lines_path = cluster.tmp_path / "node-usage.txt"
    worker = cluster.node_worker(node, "usage_worker.mjs", lines_path, "16", "600000", "20", "u9")
    dirty_key = f"{cluster.prefix}:{QUEUE}:fq:use:dirty"
    kills = []
    try:
        for target in (total // 4, total // 2):
            assert wait_until(
                lambda t=target: client.zcard(f"{cluster.prefix}:{QUEUE}:completed") >= t, 120
            ), cluster.log_tail()
            # Counted in Redis, not yet in the database: kill -9 there.
            assert wait_until(lambda: client.zcard(dirty_key) > 0, 30, 0.001)
            leader.kill()
            leader.wait(10)
            kills.append(client.zcard(dirty_key))
            leader = cluster.rebalancer()
        assert wait_until(
            lambda: (
                client.zcard(f"{cluster.prefix}:{QUEUE}:completed")
                + client.zcard(f"{cluster.prefix}:{QUEUE}:failed")
                >= total
            ),
            300,
        ), cluster.log_tail()
        assert wait_until(lambda: client.zcard(dirty_key) == 0, 60), cluster.log_tail()
    finally:
        client.close()
    worker.kill()
    worker.wait(10)
    ends: dict[str, list[float]] = {}
    starts: Counter[str] = Counter()
    for line in lines_path.read_text().splitlines():
        parts = line.split(" ")
        if parts[0] == "start":
            starts[parts[2]] += 1
        elif parts[0] == "end":
            row = ends.setdefault(parts[2], [0, 0, 0.0, 0.0])
            row[0 if parts[3] == "1" else 1] += 1
            row[2] += float(parts[4])
            row[3] += float(parts[5])
    ledger: dict[str, list[int]] = cluster.agent_report("usage")
    assert set(ledger) == set(starts)
    worker_ms = sum(row[2] for row in ends.values())
    ledger_ms = sum(row[3] for row in ledger.values())
    processor_ms = sum(row[3] for row in ends.values())
    for tenant, (attempts, completed, failed, _ms) in ledger.items():
        assert attempts == starts[tenant], (tenant, attempts, starts[tenant])
        assert (completed, failed) == (ends[tenant][0], ends[tenant][1]), tenant
    assert sum(starts.values()) == len(ids) + len(ids) // 10  # u9's jobs ran twice
    assert abs(ledger_ms - worker_ms) <= 0.01 * worker_ms, (ledger_ms, worker_ms)
    with capsys.disabled():
        print(
            f"\nfaults[usage ledger]: attempts {sum(starts.values())} (ledger "
            f"{sum(r[0] for r in ledger.values())}), worker ms {worker_ms:.0f} ledger "
            f"{ledger_ms} ({(ledger_ms - worker_ms) / worker_ms:+.2%}), processors alone "
            f"{processor_ms:.0f} ms; rows dirty at the "
            f"kills {kills}"
        )
