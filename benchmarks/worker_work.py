"""The CPU-bound work of ``bench_worker.py``'s jobs, shared by the fairqueue handler
(``benchmarks/worker_app/jobs.py``) and the Celery task (``benchmarks/worker_celery.py``)
so both run the very same code; it imports neither fairqueue nor Django."""

from __future__ import annotations

import os
import time

import redis

_clients: dict[int, redis.Redis] = {}


def _redis() -> redis.Redis:
    """One client per process: a forked child must not share its parent's socket."""
    client = _clients.get(os.getpid())
    if client is None:
        client = _clients[os.getpid()] = redis.Redis.from_url(os.environ["FQBENCH_REDIS_URL"])
    return client


def burn(loops: int) -> int:
    """Pure Python work that holds the GIL: what a rendering or parsing job does."""
    total = 0
    for i in range(loops):
        total = (total + i * i) % 1_000_003
    return total


def loops_for(ms: float, *, trials: int = 5) -> int:
    """How many :func:`burn` loops take about ``ms`` on one core of this machine (the
    fastest of a few trials: the least disturbed by other processes)."""
    probe = 200_000
    best = min(_timed(probe) for _ in range(trials))
    return max(1, int(probe * ms / 1000 / best))


def _timed(loops: int) -> float:
    started = time.perf_counter()
    burn(loops)
    return time.perf_counter() - started


def cpu_job() -> None:
    """One job: the calibrated work, then one INCR the benchmark counts jobs done by."""
    burn(int(os.environ.get("FQBENCH_CPU_LOOPS", "20000")))
    _redis().incr(os.environ["FQBENCH_DONE_KEY"])
