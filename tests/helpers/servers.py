"""Private Redis deployments for the cluster and Sentinel tests (and benchmarks/bench_cluster.py):
a Redis Cluster of N masters, or a master + replica watched by sentinels, each started on
free loopback ports with its own directory under /tmp, and torn down (processes stopped,
directory removed) afterwards. Nothing here touches the shared Redis on 6379."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def cluster_support() -> str | None:
    """Why a local cluster cannot be started here, or ``None`` when it can."""
    if REDIS_SERVER is None or REDIS_CLI is None:
        return "redis-server or redis-cli is not installed"
    out = subprocess.run(
        [REDIS_SERVER, "--version"], capture_output=True, text=True, check=False
    ).stdout
    try:
        major = int(out.split("v=")[1].split(".")[0])
    except (IndexError, ValueError):
        return f"cannot read the redis-server version from {out!r}"
    if major < 5:
        return f"redis-server {out.strip()} predates `redis-cli --cluster create` (needs 5+)"
    return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, *, bus: bool = False) -> list[int]:
    """``count`` free loopback ports (and their cluster bus ports, port + 10000)."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(21_000, 39_000)  # noqa: S311 - not cryptographic
        if port in ports or not _port_free(port) or (bus and not _port_free(port + 10_000)):
            continue
        ports.append(port)
    return ports


def _wait_ping(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client = redis.Redis(port=port, socket_connect_timeout=0.5)
            try:
                client.ping()
                return
            finally:
                client.close()
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass
class _Servers:
    """Processes started in one private directory."""

    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fq-redis-")))
    processes: dict[int, subprocess.Popen] = field(default_factory=dict)

    def start(self, port: int, *args: str) -> subprocess.Popen:
        work = self.directory / str(port)
        work.mkdir(exist_ok=True)
        log = open(work / "log", "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            [
                REDIS_SERVER,
                *args,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(work),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=work,
        )
        log.close()
        self.processes[port] = process
        return process

    def kill(self, port: int) -> None:
        process = self.processes.pop(port, None)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self.processes.clear()
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class LocalCluster:
    """A Redis Cluster of ``masters`` masters (no replicas) on loopback."""

    ports: list[int]
    servers: _Servers

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports]

    def stop(self) -> None:
        self.servers.stop()

    def flush(self) -> None:
        for port in self.ports:
            client = redis.Redis(port=port)
            try:
                client.flushall()
            finally:
                client.close()


def start_cluster(masters: int = 3) -> LocalCluster:
    """Start ``masters`` cluster-enabled servers and join them with ``redis-cli --cluster
    create`` (by hand below 3 masters; masters only: the slots are split evenly)."""
    servers = _Servers()
    ports = free_ports(masters, bus=True)
    try:
        for port in ports:
            servers.start(
                port,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
            )
        for port in ports:
            _wait_ping(port)
        if masters < 3:
            # redis-cli --cluster create wants 3 masters: split the slots by hand.
            _join_by_hand(ports)
        else:
            subprocess.run(
                [
                    REDIS_CLI,
                    "--cluster",
                    "create",
                    *[f"127.0.0.1:{port}" for port in ports],
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            )
        _wait_cluster_ok(ports)
    except BaseException:
        servers.stop()
        raise
    return LocalCluster(ports, servers)


def _join_by_hand(ports: list[int]) -> None:
    """Give each node an even share of the 16384 slots and introduce it to the first."""
    share = 16_384 // len(ports)
    for i, port in enumerate(ports):
        client = redis.Redis(port=port)
        try:
            last = 16_383 if i == len(ports) - 1 else (i + 1) * share - 1
            client.execute_command("CLUSTER ADDSLOTSRANGE", i * share, last)
            if i:
                client.execute_command("CLUSTER MEET", "127.0.0.1", ports[0])
        finally:
            client.close()


def _wait_cluster_ok(ports: list[int], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        states = []
        for port in ports:
            client = redis.Redis(port=port, decode_responses=True)
            try:
                info = client.execute_command("CLUSTER INFO")
            finally:
                client.close()
            if isinstance(info, dict):
                states.append(info.get("cluster_state"))
            else:
                states.append("ok" if "cluster_state:ok" in info else "fail")
        if all(state == "ok" for state in states):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"cluster on {ports} not ok: {states}")
        time.sleep(0.1)


@dataclass
class LocalSentinel:
    """A master and its replicas watched by ``len(sentinel_ports)`` sentinels."""

    service: str
    master_port: int
    replica_ports: list[int]
    sentinel_ports: list[int]
    servers: _Servers

    @property
    def sentinels(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.sentinel_ports]

    def master_port_now(self) -> int:
        """The port Sentinel names as the master now."""
        client = redis.Redis(port=self.sentinel_ports[0], decode_responses=True)
        try:
            _, port = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)
        finally:
            client.close()
        return int(port)

    def failover(self, pause_writes_ms: int = 3_000, timeout_s: float = 30.0) -> int:
        """A planned failover: pause writes on the master (so the replica has every
        acknowledged write when it is promoted), ask Sentinel to fail over and wait until
        it names a new master that serves as one; returns the new master's port. Writes
        held by the pause then meet a master without replicas (NOREPLICAS) and go to the
        new one. (The old master rejoins as a replica when Sentinel next looks at it.)"""
        old = self.master_port_now()
        if pause_writes_ms:
            master = redis.Redis(port=old)
            try:
                master.execute_command("CLIENT PAUSE", pause_writes_ms, "WRITE")
            finally:
                master.close()
        client = redis.Redis(port=self.sentinel_ports[0], decode_responses=True)
        try:
            client.execute_command("SENTINEL FAILOVER", self.service)
        finally:
            client.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            new = self.master_port_now()
            if new != old and _role(new) == "master":
                return new
            time.sleep(0.1)
        raise TimeoutError(f"failover of {self.service} did not complete")

    def stop(self) -> None:
        self.servers.stop()


def _role(port: int) -> str | None:
    client = redis.Redis(port=port, decode_responses=True, socket_connect_timeout=0.5)
    try:
        return client.info("replication").get("role")
    except redis.ConnectionError:
        return None
    finally:
        client.close()


#: What the README asks of every data node behind Sentinel: refuse writes without a
#: replica in sync, so a master a failover left behind cannot accept writes it would lose.
SAFE_REPLICATION = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")


def start_sentinel(
    sentinels: int = 3, replicas: int = 1, service: str = "fqmaster"
) -> LocalSentinel:
    """Start a master, ``replicas`` replicas of it and ``sentinels`` sentinels (quorum: a
    majority), every data node with :data:`SAFE_REPLICATION`.

    With one replica a failover loses nothing: the old master refuses writes the moment
    its only replica is promoted (NOREPLICAS), and the new master refuses them until the
    old one rejoins as its replica (seconds: a write outage that clients retry through).
    A second replica would keep the old master writable, into that replica, until
    Sentinel repoints it, and those writes are then discarded."""
    servers = _Servers()
    master, *ports = free_ports(1 + replicas + sentinels)
    replica_ports, sentinel_ports = ports[:replicas], ports[replicas:]
    try:
        servers.start(master, *SAFE_REPLICATION)
        _wait_ping(master)
        for replica in replica_ports:
            servers.start(replica, *SAFE_REPLICATION, "--replicaof", "127.0.0.1", str(master))
        for replica in replica_ports:
            _wait_ping(replica)
        quorum = sentinels // 2 + 1
        for port in sentinel_ports:
            config = servers.directory / f"sentinel-{port}.conf"
            config.write_text(
                f"sentinel monitor {service} 127.0.0.1 {master} {quorum}\n"
                f"sentinel down-after-milliseconds {service} 2000\n"
                f"sentinel failover-timeout {service} 10000\n"
                f"sentinel parallel-syncs {service} 1\n"
            )
            servers.start(port, str(config), "--sentinel")
        for port in sentinel_ports:
            _wait_ping(port)
        for replica in replica_ports:
            _wait_replica_synced(replica)
        _wait_sentinels_see_replicas(sentinel_ports, service, replicas)
    except BaseException:
        servers.stop()
        raise
    return LocalSentinel(service, master, replica_ports, sentinel_ports, servers)


def _wait_replica_synced(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _role_info(port).get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise TimeoutError(f"replica on {port} did not sync")
        time.sleep(0.1)


def _role_info(port: int) -> dict:
    client = redis.Redis(port=port, decode_responses=True)
    try:
        return client.info("replication")
    finally:
        client.close()


def _wait_sentinels_see_replicas(
    ports: list[int], service: str, replicas: int, timeout_s: float = 30.0
) -> None:
    """Sentinels learn the replica (and each other) from the master's INFO and hello
    messages; a failover before that has nowhere to go."""
    deadline = time.monotonic() + timeout_s
    while True:
        ready = True
        for port in ports:
            client = redis.Redis(port=port, decode_responses=True)
            try:
                known = client.execute_command("SENTINEL REPLICAS", service)
                others = client.execute_command("SENTINEL SENTINELS", service)
            finally:
                client.close()
            if len(known) < replicas or len(others) < len(ports) - 1:
                ready = False
        if ready:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"sentinels on {ports} never saw the replicas of {service}")
        time.sleep(0.2)


#: The prefix and queues of fairqueue on the private cluster (the ``on_cluster`` fixture):
#: each queue named with its hash tag, so a queue's keys share one slot.
CLUSTER_PREFIX = "fqc"
CLUSTER_QUEUES = {"email": "{email}", "report": "{report}", "cleanup": "{cleanup}"}
