"""Test helpers shared by the test modules (which never import one another): stock
BullMQ workers (closed within a bound, so a test fails rather than hangs), metric
readers, waits, private Redis servers. The modules beside this one hold the helpers of
one kind of test each; fixtures live in the conftest files."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from typing import TypeVar

import redis.asyncio as aioredis
from bullmq import Worker
from prometheus_client import REGISTRY

from tests.helpers.keys import REDIS_URL

T = TypeVar("T")


async def stock_worker_until(
    prefix: str,
    queue: str,
    on_job,
    count: int,
    timeout_s: float = 60.0,
    *,
    concurrency: int = 1,
    connection=REDIS_URL,
) -> None:
    """A stock ``bullmq.Worker`` (``concurrency`` slots) on ``queue`` under ``prefix`` that
    calls ``on_job(job)`` (a function or a coroutine function) for every attempt it starts
    (one that raises fails its attempt, as any processor's does) until ``count`` attempts
    ended; ``TimeoutError`` when they did not in ``timeout_s``."""
    done = asyncio.Event()
    ended = 0

    async def process(job, token):
        nonlocal ended
        try:
            outcome = on_job(job)
            if inspect.isawaitable(outcome):
                await outcome
        finally:
            ended += 1
            if ended >= count:
                done.set()

    worker = Worker(
        queue,
        process,
        {"connection": connection, "prefix": prefix, "concurrency": concurrency, "autorun": False},
    )
    errors: list[str] = []
    worker.on("error", lambda error, *_: errors.append(repr(error)))
    task = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    except TimeoutError as exc:
        # What the worker met says more than "it timed out" (its loop retries errors).
        raise TimeoutError(
            f"{ended} of {count} attempts ended; worker errors: {errors[:5]}"
        ) from exc
    finally:
        await close_worker(worker)
        task.cancel()


#: How long a stock worker's ``close()`` may take before it is closed by force, as
#: fairqueue's own worker does (``CLOSE_IDLE_S``): BullMQ's close swallows cancellation
#: and waits on its teardown, which once never ended and hung the run.
CLOSE_S = 10.0


async def close_worker(worker: Worker, close_s: float = CLOSE_S) -> None:
    """Close a stock BullMQ worker; after ``close_s`` close it by force (its running
    jobs cancelled), and after as long again raise ``TimeoutError``: a test fails
    rather than hang."""
    closing = asyncio.ensure_future(worker.close())
    if (await asyncio.wait({closing}, timeout=close_s))[0]:
        return closing.result()
    forced = asyncio.ensure_future(worker.close(force=True))
    if not (await asyncio.wait({forced}, timeout=close_s))[0]:
        raise TimeoutError(
            f"a stock BullMQ worker did not close in {2 * close_s:g} s, even by force"
        )
    forced.result()


def run_bounded(main: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """``asyncio.run(main())`` on a daemon thread, given ``timeout_s``: past it,
    ``TimeoutError`` here, the stuck loop left behind (a loop whose task swallows
    cancellation never ends, and ``asyncio.run`` would wait for it forever)."""
    outcome: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(asyncio.run(main()))
        except BaseException as exc:  # re-raised on the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="bounded-loop", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if errors:
        raise errors[0]
    if thread.is_alive():
        raise TimeoutError(f"an event loop of the test did not end in {timeout_s:g} s")
    return outcome[0]


async def _drain(prefix: str, queue: str, count: int, timeout_s: float) -> list[tuple[str, dict]]:
    processed: list[tuple[str, dict]] = []
    try:
        await stock_worker_until(
            prefix, queue, lambda job: processed.append((job.id, job.data)), count, timeout_s
        )
    except TimeoutError as exc:
        print(f"drain of {queue!r}: {exc}")  # shown beside the failed assertion
    return processed


def drain_with_stock_worker(
    prefix: str, queue: str, count: int, timeout_s: float = 30.0
) -> list[tuple[str, dict]]:
    """Run a stock ``bullmq.Worker`` (concurrency 1) until ``count`` jobs were processed;
    return ``(job_id, data)`` in processing order."""
    return run_bounded(lambda: _drain(prefix, queue, count, timeout_s), timeout_s + 3 * CLOSE_S)


def release(queue: str = "email", tenants=None):
    """One call of the release step (the held jobs of ``tenants``, or of the tenants due)."""
    from fairqueue.broker import get_sync_broker

    sync = get_sync_broker()
    return sync.run(sync.broker.limits.release, queue, tenants)


def run_stock_worker(prefix, expect, *, concurrency=8, job_s=0.03, sample_ids=(), timeout_s=30):
    """A stock ``bullmq.Worker`` runs until ``expect`` jobs finished; meanwhile BullMQ's
    active list is sampled every 10 ms. Returns (finished ids in order, the most of
    ``sample_ids`` ever active at once)."""
    finished: list[str] = []
    sample_ids = set(sample_ids)

    async def main():
        done = asyncio.Event()

        async def process(job, token):
            await asyncio.sleep(job_s)
            finished.append(job.id)
            if len(finished) >= expect:
                done.set()

        worker = Worker(
            "email",
            process,
            {"connection": REDIS_URL, "prefix": prefix, "concurrency": concurrency},
        )
        client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
        most = 0

        async def sample():
            nonlocal most
            while not done.is_set():
                active = await client.lrange(f"{prefix}:email:active", 0, -1)
                most = max(most, sum(1 for job_id in active if job_id in sample_ids))
                await asyncio.sleep(0.01)

        sampler = asyncio.ensure_future(sample())
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        finally:
            done.set()
            await sampler
            await close_worker(worker)
            await client.aclose()
        return most

    most = run_bounded(main, timeout_s + 3 * CLOSE_S)
    return finished, most


def bullmq_counts(prefix: str, queue: str = "email") -> dict[str, int]:
    """BullMQ's own job counts of ``queue`` (its getJobCounts), by state."""
    from bullmq import Queue

    async def read() -> dict[str, int]:
        q = Queue(queue, {"connection": REDIS_URL, "prefix": prefix})
        try:
            return await q.getJobCounts(
                "wait", "prioritized", "delayed", "active", "completed", "failed"
            )
        finally:
            await q.close()

    return asyncio.run(read())


def metric(name: str, **labels: str) -> float:
    """A sample of the process-wide registry; a job type's series carries its queue,
    filled in here from the settings when not given."""
    if "job_type" in labels and "queue" not in labels:
        from fairqueue.metrics import queue_label

        labels["queue"] = queue_label(labels["job_type"])
    return REGISTRY.get_sample_value(name, labels) or 0.0


@contextmanager
def metric_delta(name: str, **labels: str):
    """``with metric_delta(...) as delta: ...; assert delta() == 1``"""
    before = metric(name, **labels)
    yield lambda: metric(name, **labels) - before


def settle_releases(queue: str = "email", idle_calls: int = 5_000, most_s: float = 240.0) -> int:
    """Run the loop's release step until nothing is due (its sweep done, no tenant due
    now), as the loop would over its next steps. Each call stops at its time budget
    (about 2 ms of Redis), so how many calls it takes depends on the machine; and while a
    call catches up on BullMQ's events (250 a call) it may visit only tenants those events
    made due that are at their limits, releasing nothing for a few hundred calls (10,000
    limited tenants added at once: about 300 here). It fails only when ``idle_calls``
    calls in a row release nothing, or after ``most_s`` seconds. Returns the jobs
    released."""
    import redis

    from fairqueue.broker import get_sync_broker
    from fairqueue.broker.common import limits_key

    sync = get_sync_broker()
    base = limits_key(sync.broker.prefix, queue)
    client = redis.Redis.from_url(REDIS_URL)
    released = idle = 0
    deadline = time.monotonic() + most_s
    try:
        while idle < idle_calls and time.monotonic() < deadline:
            moved = sync.run(sync.broker.limits.release, queue).released
            released += moved
            idle = 0 if moved else idle + 1
            seconds, micros = client.time()
            now_ms = seconds * 1000 + micros // 1000
            if not client.exists(f"{base}:sweep") and not client.zcount(
                f"{base}:due", "-inf", now_ms
            ):
                return released
    finally:
        client.close()
    raise AssertionError(
        f"the release step did not settle: {released} released, then {idle} calls in a row "
        "released nothing"
        if idle >= idle_calls
        else f"not settled in {most_s} s"
    )


def staff(username: str, *perms: str):
    """A staff user (password ``pw``) with fairqueue's permissions ``perms``, read back
    with a fresh permission cache."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="fairqueue", codename=codename)
        )
    return User.objects.get(pk=user.pk)


@contextmanager
def spawner():
    """Yields ``start(args, **popen_kwargs)``: a process with its output (stderr too) on
    a text pipe. Every process it started is killed, if still running, and reaped on the
    way out."""
    processes: list[subprocess.Popen] = []

    def start(args: list[str], **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs
        )
        processes.append(process)
        return process

    try:
        yield start
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.communicate()


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateRedis:
    """A redis-server of the test's own, on its own port and directory, with AOF on
    (``appendfsync always``), that the test can kill -9 and restart on the same data.

    ``password`` makes it require one (``requirepass``); ``unix_socket`` has it listen on
    that socket too, and :attr:`url` is then the socket's ``unix://`` URL."""

    def __init__(
        self,
        directory,
        *,
        port: int | None = None,
        aof: bool = True,
        password: str | None = None,
        unix_socket: str | None = None,
    ) -> None:
        self.directory = str(directory)
        self.port = port or free_port()
        self.aof = aof
        self.password = password
        self.unix_socket = unix_socket
        self.process = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.unix_socket:
            return f"unix://{auth}{self.unix_socket}?db=0"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> PrivateRedis:
        import subprocess

        import redis

        args = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.directory,
            "--save",
            "",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        if self.password:
            args += ["--requirepass", self.password]
        if self.unix_socket:
            args += ["--unixsocket", self.unix_socket, "--unixsocketperm", "700"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.2)
        try:
            if not wait_until(lambda: _answers(client), timeout_s):
                raise RuntimeError(f"redis-server did not start on port {self.port}")
        finally:
            client.close()
        return self

    def kill9(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> None:
        self.kill9()
        self.start()

    def stop(self) -> None:
        self.kill9()
        self.process = None


def _answers(client) -> bool:
    import redis

    try:
        client.ping()
        # AOF loading answers PING with LOADING on some versions: ask for a key too.
        client.exists("fq-probe")
        return True
    except (redis.ConnectionError, redis.BusyLoadingError, OSError):
        return False


@contextmanager
def hang_up_server():
    """A localhost TCP port where something accepts every connection and closes it at
    once: it answers a port probe, but no Redis (nor a TLS handshake) is behind it.
    Yields the port."""
    import socket
    import threading

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:  # the accept timeout: look at ``stop`` again
                continue
            connection.close()

    thread = threading.Thread(target=serve, name="hang-up-server", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def read_until(process: subprocess.Popen, text: str, timeout_s: float = 30.0) -> list[str]:
    """``process``'s output lines up to the first that contains ``text`` (read on a
    thread: a pipe has no read timeout)."""
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if text in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout_s), "".join(lines)
    return lines


def holding_worker(
    prefix: str, concurrency: int, started: list[str], release: threading.Event
) -> threading.Thread:
    """A thread running a stock BullMQ worker on ``email`` that takes ``concurrency`` jobs
    (their ids appended to ``started``) and holds them running until ``release``, then
    closes within a bound (:func:`close_worker`). Start it, and join it once released."""

    async def run() -> None:
        async def process(job, token):
            started.append(job.id)
            while not release.is_set():
                await asyncio.sleep(0.05)

        opts = {"connection": REDIS_URL, "prefix": prefix, "concurrency": concurrency}
        worker = Worker("email", process, opts)
        while not release.is_set():
            await asyncio.sleep(0.05)
        await close_worker(worker)

    return threading.Thread(target=asyncio.run, args=(run(),))
