"""Stock BullMQ workers that fail the jobs a test says, for the usage ledger, the quotas,
the breaker's and the reruns' tests; the breaker's latest hold of a tenant; one-slot
workers whose jobs end when the test says (the tenant and account quotas' tests)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from bullmq import Worker

from tests.helpers import close_worker, stock_worker_until
from tests.helpers.keys import REDIS_URL


async def _work_failing(prefix, count, fails, seen):
    """A stock worker taking ``count`` jobs; ``fails(job)``: whether the attempt fails.
    ``seen``: (tenant, attempt made, ok) of each attempt."""
    done = asyncio.Event()

    async def process(job, token):
        tenant = job.data.get("tenantId")
        ok = not fails(job)
        seen.append((tenant, job.attemptsMade, ok))
        if len(seen) >= count:
            done.set()
        if not ok:
            raise RuntimeError("failing on purpose")

    worker = Worker("email", process, {"connection": REDIS_URL, "prefix": prefix, "concurrency": 4})
    try:
        await asyncio.wait_for(done.wait(), 60)
        await asyncio.sleep(0.2)  # the last completions reach Redis
    finally:
        await close_worker(worker)


def run_jobs(prefix, count, fails=lambda job: False):
    """A stock worker (4 slots) taking ``count`` jobs; ``fails(job)``: whether the attempt
    fails. Returns (tenant, attempt made, ok) of each attempt."""
    seen: list = []
    asyncio.run(_work_failing(prefix, count, fails, seen))
    return seen


def poison(job):
    """Whether ``job`` is tenant 'poison''s (its attempts fail)."""
    return job.data.get("tenantId") == "poison"


def breaker_hold(tenant="poison"):
    """The breaker's latest hold of ``tenant`` (None: never held)."""
    from fairqueue.models import TenantHold

    return TenantHold.objects.filter(tenant_id=tenant, reason="breaker").order_by("-id").first()


async def work_jobs(prefix, queue, count, seen, fail_tenants=(), job_s=0.0):
    """A stock worker; ``seen``: (job id, tenant, attempt made, ok, ms it ran)."""
    done = asyncio.Event()

    async def process(job, token):
        started = time.monotonic()
        if job_s:
            await asyncio.sleep(job_s)
        tenant = job.data.get("tenantId")
        ok = tenant not in fail_tenants
        seen.append((job.id, tenant, job.attemptsMade, ok, (time.monotonic() - started) * 1000))
        if len(seen) >= count:
            done.set()
        if not ok:
            raise RuntimeError("failing on purpose")

    worker = Worker(queue, process, {"connection": REDIS_URL, "prefix": prefix, "concurrency": 4})
    try:
        await asyncio.wait_for(done.wait(), 60)
        await asyncio.sleep(0.2)  # the last completions reach Redis
    finally:
        await close_worker(worker)


async def take_jobs_failing_first(
    prefix: str, count: int, fail: set[str], run_s: dict[str, float] | None = None
) -> list[str]:
    """A stock ``bullmq.Worker`` (concurrency 1) that fails the first attempt of the jobs
    in ``fail`` and runs a job of tenant t for ``run_s[t]`` seconds; returns the ids it
    took, in order, once it took ``count``."""
    taken: list[str] = []

    async def process(job):
        taken.append(job.id)
        if run_s:
            await asyncio.sleep(run_s[job.data["tenantId"]])
        if job.id in fail and job.attemptsMade == 0:
            raise RuntimeError("integration down")

    await stock_worker_until(prefix, "email", process, count)
    return taken[:count]


@contextlib.contextmanager
def one_slot_worker(prefix, process, before_stop=lambda: None):
    """A stock worker with one slot running ``process``, in a thread of its own;
    ``before_stop`` runs first on the way out (its close waits for a running job)."""
    from bullmq import Worker

    from tests.helpers.keys import REDIS_URL

    ready, stop = threading.Event(), threading.Event()

    async def main():
        options = {"connection": REDIS_URL, "prefix": prefix, "concurrency": 1}
        worker = Worker("email", process, options)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.01)
        await worker.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    ready.wait(30)
    try:
        yield
    finally:
        before_stop()
        stop.set()
        thread.join(30)


def until_true(condition, release=False):
    from fairqueue.broker import get_sync_broker

    sync = get_sync_broker()
    for _ in range(6000):
        if condition():
            return True
        if release:
            sync.run(sync.broker.limits.release, "email")  # the loop's release step
        time.sleep(0.01)
    return False


class Gate:
    """A stock worker's jobs each run until the test ends them (``finish``): the test,
    not the clock, says how long each one ran."""

    def __init__(self):
        self.started: list[str] = []
        self.finished = threading.Event()
        self._end: dict[str, threading.Event] = {}
        self.seen: list[tuple[str, float]] = []  # (level, ms run), as the worker measured

    async def process(self, job, token):
        began = time.monotonic()
        end = self._end.setdefault(job.id, threading.Event())
        self.started.append(job.id)
        while not end.is_set():
            await asyncio.sleep(0.005)
        self.seen.append((job.data.get("priorityLevel"), (time.monotonic() - began) * 1000))

    def finish(self, job_id):
        self._end.setdefault(job_id, threading.Event()).set()


@contextlib.contextmanager
def gated_worker(prefix, gate):
    """A one-slot stock worker whose jobs end when the test says (every one, at the end)."""

    def finish_all():
        for job_id in list(gate.started):
            gate.finish(job_id)

    with one_slot_worker(prefix, gate.process, finish_all):
        yield
