"""A stock Python ``bullmq`` Worker with a no-op processor, no fairqueue code:
``bench_worker.py``'s baseline for the no-op jobs. Prints ``ready`` once built; SIGTERM
closes it (active jobs finish). With ``sync``, the no-op is a sync function run in a
thread pool of CONCURRENCY threads (``run_in_executor``), as a sync handler would be.

    python benchmarks/stock_bullmq_worker.py REDIS_URL PREFIX QUEUE CONCURRENCY [sync]
"""

from __future__ import annotations

import asyncio
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bullmq import Worker


def noop() -> None:
    return None


async def main(url: str, prefix: str, queue: str, concurrency: int, sync: bool) -> None:
    pool = ThreadPoolExecutor(max_workers=concurrency)

    async def process(job: Any, token: str) -> None:
        if sync:
            await asyncio.get_running_loop().run_in_executor(pool, noop)
        return None

    worker = Worker(
        queue,
        process,
        {"connection": url, "prefix": prefix, "concurrency": concurrency, "autorun": False},
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    run = asyncio.ensure_future(worker.run())
    print("ready", flush=True)
    await stop.wait()
    await worker.close()
    await asyncio.gather(run, return_exceptions=True)
    pool.shutdown()


if __name__ == "__main__":
    sync = sys.argv[5:] == ["sync"]
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sync))
