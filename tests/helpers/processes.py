"""What a test starts and stops: a management command of the test project (the loop, the
relay, the worker), a private redis-server a test may kill, the loop in a thread."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis as redis_lib

from tests.helpers import wait_until
from tests.helpers.keys import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]


def spawn(args, prefix, **env):
    """``manage.py *args`` of the test project under ``prefix`` (output piped)."""
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "FAIRQUEUE_PREFIX": prefix,
            "FAIRQUEUE_REDIS_URL": REDIS_URL,
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(process, sig=signal.SIGTERM, timeout=15):
    """Send ``sig`` and wait; killed if it does not exit in ``timeout`` s."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def redis_server_args(binary, port, directory):
    """A throwaway redis-server's command line: ``port`` on 127.0.0.1, no persistence,
    its files in ``directory`` (the tests' and the benchmarks' private servers)."""
    local = ("--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
    return [binary, "--port", str(port), *local, "--dir", str(directory)]


def start_private_redis(port, directory):
    """A redis-server of the test's own on ``port`` (no persistence), answering."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is not on PATH (.ci/ensure-redis installs it)")
    process = subprocess.Popen(
        redis_server_args(server, port, directory), stdout=subprocess.DEVNULL
    )
    client = redis_lib.Redis(port=port)
    assert wait_until(lambda: _pings(client), 10)
    return process


def _pings(client):
    try:
        return client.ping()
    except redis_lib.RedisError:
        return False


@contextmanager
def running_loop():
    """The loop (a Rebalancer on ``email``) in a thread, holding its locks; stopped on the
    way out."""
    import threading

    from fairqueue.rebalance.rebalancer import Rebalancer

    rebalancer = Rebalancer(["email"], interval_ms=1000, install_signal_handlers=False)
    thread = threading.Thread(target=rebalancer.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: all(lock.held for lock in rebalancer.locks.values()), 10)
        yield rebalancer
    finally:
        rebalancer.request_stop()
        thread.join(10)
