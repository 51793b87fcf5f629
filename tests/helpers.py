"""Test helpers: a stock BullMQ worker that records the order it processes jobs in,
and metric readers (assert a metric's value or its change)."""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager

from bullmq import Worker
from prometheus_client import REGISTRY

from tests.conftest import REDIS_URL


async def _drain(prefix: str, queue: str, count: int, timeout_s: float) -> list[tuple[str, dict]]:
    processed: list[tuple[str, dict]] = []
    done = asyncio.Event()

    async def process(job, token):
        processed.append((job.id, job.data))
        if len(processed) >= count:
            done.set()
        return None

    worker = Worker(
        queue,
        process,
        {"connection": REDIS_URL, "prefix": prefix, "concurrency": 1, "autorun": False},
    )
    task = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    except TimeoutError:
        pass
    finally:
        await worker.close()
        task.cancel()
    return processed


def drain_with_stock_worker(
    prefix: str, queue: str, count: int, timeout_s: float = 30.0
) -> list[tuple[str, dict]]:
    """Run a stock ``bullmq.Worker`` (concurrency 1) until ``count`` jobs were processed;
    return ``(job_id, data)`` in processing order."""
    return asyncio.run(_drain(prefix, queue, count, timeout_s))


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@contextmanager
def metric_delta(name: str, **labels: str):
    """``with metric_delta(...) as delta: ...; assert delta() == 1``"""
    before = metric(name, **labels)
    yield lambda: metric(name, **labels) - before


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
