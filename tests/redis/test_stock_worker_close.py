"""The suite's bound on closing a stock BullMQ worker: a worker whose job never ends is
closed by force after the bound (a test then fails or goes on, never hangs), and a loop
that never ends is left behind with a ``TimeoutError``."""

from __future__ import annotations

import asyncio
import time

import pytest
from bullmq import Queue, Worker

from tests.helpers import close_worker, run_bounded
from tests.helpers.keys import REDIS_URL, delete_prefix, run_prefix


@pytest.fixture
def prefix():
    prefix = run_prefix()
    yield prefix
    delete_prefix(prefix)


def test_close_worker__a_job_that_never_ends_is_closed_by_force_after_the_bound(prefix):
    async def main() -> float:
        started = asyncio.Event()

        async def process(job, token):
            started.set()
            await asyncio.Event().wait()  # never ends: a plain close() waits forever

        queue = Queue("email", {"connection": REDIS_URL, "prefix": prefix})
        await queue.add("stuck", {})
        await queue.close()
        worker = Worker("email", process, {"connection": REDIS_URL, "prefix": prefix})
        await asyncio.wait_for(started.wait(), 10)
        began = time.monotonic()
        await close_worker(worker, close_s=0.5)
        return time.monotonic() - began

    took = run_bounded(main, 30)
    assert 0.5 <= took < 5


def test_run_bounded__a_loop_that_never_ends_raises_timeout_error():
    async def main() -> None:
        while True:  # swallows cancellation, as BullMQ's close() did
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    began = time.monotonic()
    with pytest.raises(TimeoutError, match="did not end in 0.5 s"):
        run_bounded(main, 0.5)
    assert time.monotonic() - began < 5
