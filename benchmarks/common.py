"""What the benchmarks share: where Redis is, and how to leave it as they found it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import redis

ROOT = Path(__file__).resolve().parent.parent

REDIS_URL = os.environ.get("FAIRQUEUE_REDIS_URL", "redis://127.0.0.1:6379/0")


def delete_prefix(prefix: str) -> None:
    """Delete every key under ``prefix:`` (a benchmark's private BullMQ prefix)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=5000))
        for start in range(0, len(keys), 5000):
            client.delete(*keys[start : start + 5000])
    finally:
        client.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it), for a private Redis."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def loop_process(
    queue: str, interval_ms: int, env: dict[str, str], log: IO[Any]
) -> subprocess.Popen[bytes]:
    """``manage.py rebalance_fair`` for ``queue`` in a session of its own (so a kill -9
    of it leaves the benchmark running), its output to ``log``."""
    return subprocess.Popen(  # noqa: S603 - our own command
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "rebalance_fair",
            "--queue",
            queue,
            "--interval-ms",
            str(interval_ms),
            "--verbosity",
            "0",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )


def stop_process(process: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM (a loop ends its step and lets its locks go), then SIGKILL."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until(what: Callable[[], Any], timeout_s: float, step_s: float = 0.01) -> bool:
    """Whether ``what()`` came true within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(step_s)
    return False


def wait_for_redis(client: Any, tries: int = 100) -> None:
    """Until a just started redis-server answers (or ``tries`` PINGs 50 ms apart)."""
    for _ in range(tries):
        try:
            client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)


def side_by_side(
    script: str,
    other_root: Path,
    names: list[str],
    only_flag: str,
    argv: list[str],
    capacity_of: Callable[[Path], float | None],
) -> list[tuple[str, str, Path]]:
    """Runs ``benchmarks/<script>`` of ``other_root`` (another checkout: the code before a
    change) and of this one, alternating one ``names`` item at a time (``only_flag
    name``, the rest of ``argv`` alike: its ``--compare``, ``only_flag`` and ``--json``
    options, given per run, left out), so both see the same load of a shared machine
    rather than one after the other; the second run of each takes the capacity the first
    measured (``--capacity``, read by ``capacity_of`` from its JSON), so both offer the
    same load: a capacity measured apart swung 33-80 jobs/s between runs on a loaded
    machine. Returns ``(label, name, json file)`` rows, ``old`` then ``new`` per name."""
    import tempfile

    passed, skip = [], False
    for item in argv:
        if skip and not item.startswith("--"):
            continue
        skip = item.split("=")[0] in ("--compare", only_flag, "--json")
        if not skip:
            passed.append(item)
    here = Path(__file__).resolve().parent.parent
    folder = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    rows = []
    for name in names:
        capacity = None
        for label, root in (("old", other_root.resolve()), ("new", here)):
            out = folder / f"{label}-{name}.json"
            command = [sys.executable, str(root / "benchmarks" / script), *passed]
            command += [only_flag, name, "--json", str(out)]
            if capacity is not None:
                command += ["--capacity", f"{capacity:.1f}"]
            # each checkout imports its own fairqueue (its root first on sys.path)
            subprocess.run(command, cwd=root, check=True, stdout=subprocess.DEVNULL)
            rows.append((label, name, out))
            capacity = capacity_of(out) if capacity is None else capacity
    return rows
