"""Django tasks backend cost: ``@task.enqueue`` and ``get_result`` against raw bullmq and
``enqueue_job``, side by side in one run.

* enqueue: ``task.enqueue(...)`` through ``FairQueueBackend`` (validation, JSON copy of
  the arguments, ``enqueue_job``, a ``TaskResult``) from a plain thread, as a sync view
  calls it, against ``enqueue_job`` and against ``await bullmq.Queue.add`` in a loop;
* get_result: ``task.get_result(id)`` (find the job, BullMQ's state script, its hash,
  the ``TaskResult``) against ``await Queue.getJobState`` + ``Job.fromId``.

Ratios are time per call, fairqueue / raw bullmq (1.00 = same speed; lower is better).

    python benchmarks/bench_tasks.py [--jobs 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

from benchmarks.common import REDIS_URL, delete_prefix  # noqa: E402

django.setup()

from bullmq import Job, Queue  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

try:  # Django 6
    from django.tasks import task  # noqa: E402
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # noqa: E402

from fairqueue import conf  # noqa: E402
from fairqueue.broker import close_brokers  # noqa: E402
from fairqueue.enqueue import priority  # noqa: E402
from fairqueue.enqueue.api import enqueue_job  # noqa: E402

TASKS = {
    "default": {
        "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
        "OPTIONS": {"JOB_TYPES": {"default": "email"}},
    }
}


@task()
def send(to: str, i: int, tenant_id: str | None = None) -> None:
    """Never runs here: only enqueued."""


def raw_add(prefix: str, n: int) -> tuple[float, list[str]]:
    async def main():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": prefix})
        await queue.add("email", {"warm": True}, {"priority": 5})
        ids = []
        start = time.perf_counter()
        for i in range(n):
            job = await queue.add("email", {"to": "a@example.com", "i": i}, {"priority": 5})
            ids.append(job.id)
        elapsed = time.perf_counter() - start
        await queue.close()
        return elapsed, ids

    return asyncio.run(main())


def raw_read(prefix: str, ids: list[str]) -> float:
    async def main():
        queue = Queue("email", {"connection": REDIS_URL, "prefix": prefix})
        start = time.perf_counter()
        for job_id in ids:
            await queue.getJobState(job_id)
            await Job.fromId(queue, job_id)
        elapsed = time.perf_counter() - start
        await queue.close()
        return elapsed

    return asyncio.run(main())


def in_thread(fn):
    """Run ``fn`` in a plain thread, the way a sync view runs under a WSGI server."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def fair_enqueue_job(n: int) -> float:
    enqueue_job("email", {"warm": True}, tenant_id="t-1")
    start = time.perf_counter()
    for i in range(n):
        enqueue_job("email", {"to": "a@example.com", "i": i}, tenant_id="t-1")
    return time.perf_counter() - start


def task_enqueue(n: int) -> tuple[float, list[str]]:
    send.enqueue("a@example.com", -1, tenant_id="t-1")
    ids = []
    start = time.perf_counter()
    for i in range(n):
        ids.append(send.enqueue("a@example.com", i, tenant_id="t-1").id)
    return time.perf_counter() - start, ids


def task_read(ids: list[str]) -> float:
    start = time.perf_counter()
    for result_id in ids:
        send.get_result(result_id)
    return time.perf_counter() - start


def measure(n: int) -> list[tuple[str, float, float]]:
    # No plan or weight lookup (the demo project wires the database one; this measures
    # the backend and Redis, not a plan query).
    priority.unwire_tenant_plan_lookup()
    priority.unwire_tenant_weight_lookup()
    prefix = f"fqbench-{uuid.uuid4().hex[:8]}"
    fq = {"PREFIX": prefix, "QUEUES": {"email": "email"}, "REDIS_URL": REDIS_URL}
    rows = []
    with override_settings(FAIRQUEUE=fq, TASKS=TASKS):
        conf.reload_settings()
        try:
            raw_runs = [raw_add(f"{prefix}-raw{r}", n) for r in range(3)]
            raw = min(elapsed for elapsed, _ in raw_runs)
            fair_job = min(in_thread(lambda: fair_enqueue_job(n)) for _ in range(3))
            task_runs = [in_thread(lambda: task_enqueue(n)) for _ in range(3)]
            fair_task = min(elapsed for elapsed, _ in task_runs)
            rows.append(("enqueue: enqueue_job(tenant) vs Queue.add", raw, fair_job))
            rows.append(("enqueue: @task .enqueue(tenant_id=) vs Queue.add", raw, fair_task))
            rows.append(("enqueue: @task .enqueue vs enqueue_job (overhead)", fair_job, fair_task))
            raw_ids, task_ids = raw_runs[0][1], task_runs[0][1]
            raw_get = min(raw_read(f"{prefix}-raw0", raw_ids) for _ in range(3))
            fair_get = min(in_thread(lambda: task_read(task_ids)) for _ in range(3))
            rows.append(("read: get_result vs getJobState + Job.fromId", raw_get, fair_get))
        finally:
            close_brokers()
            delete_prefix(prefix)
            for r in range(3):
                delete_prefix(f"{prefix}-raw{r}")
    conf.reload_settings()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000)
    args = parser.parse_args()
    rows = measure(args.jobs)
    print(
        f"Django tasks backend, {args.jobs} calls per run, best of 3 (calls/s; ratio = time "
        "per call, second / first)"
    )
    print(f"{'case':<52} | {'first /s':>9} | {'second /s':>9} | {'ratio':>5}")
    print("-" * 86)
    for name, first, second in rows:
        print(
            f"{name:<52} | {args.jobs / first:>9.0f} | {args.jobs / second:>9.0f} | "
            f"{second / first:>5.2f}"
        )


if __name__ == "__main__":
    main()
