"""Jobs for fairqueue's own worker under test: the job types the worker tests register
handlers for (tests/redis/conftest.py's ``prefix`` configures them), jobs added and
counted straight through the broker."""

from __future__ import annotations

import asyncio

from fairqueue.broker import Broker, NewJob
from fairqueue.scheduling.levels import PriorityLevel

QUEUES = {
    "email": "email",
    "report": "report",
    "cleanup": "cleanup",
    "t_sync": "t_sync",
    "t_async": "t_async",
    "t_orm": "t_orm",
    "t_fail": "t_fail",
    "t_slow": "t_slow",
    "t_shared_a": "t_shared",
    "t_shared_b": "t_shared",
}


def run(broker: Broker, fn, *args, **kwargs):
    """Await ``fn`` on a fresh loop and close the broker's client for that loop."""

    async def main():
        try:
            return await fn(*args, **kwargs)
        finally:
            await broker.close()

    return asyncio.run(main())


def add(broker: Broker, job_type: str, *payloads: dict, attempts: int | None = None) -> list[str]:
    jobs = [
        NewJob(name=job_type, data=payload, level=PriorityLevel.NORMAL, attempts=attempts)
        for payload in payloads
    ]
    return [added.job_id for added in run(broker, broker.adding.add_jobs, QUEUES[job_type], jobs)]


def counts(broker: Broker, job_type: str) -> dict[str, int]:
    return run(broker, broker.passes.counts, QUEUES[job_type])
