"""Handlers the worker benchmarks run, the same work as their Celery tasks
(``benchmarks/worker_celery.py``):

* ``wcpu``: :func:`benchmarks.worker_work.cpu_job` (about 5 ms of pure Python, then one
  ``INCR`` the benchmark counts);
* ``wnoop``: nothing, ``async`` as the stock worker's processor it is compared with
  (the benchmark watches the queue empty); ``wnoopsync`` the same, sync (in the worker's
  thread pool; the stock worker's sync twin runs its no-op in a thread pool too);
* ``bench``: ``bench_fairness.py``'s job: ``runMs`` (or ``FQBENCH_RUN_MS``) ms of waiting
  (``async``: it holds a slot, not a core, as the Node worker's ``setTimeout`` does), then
  one JSON line on stdout like ``benchmarks/live_worker.mjs``'s.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import fairqueue
from benchmarks.worker_work import cpu_job


@fairqueue.handler("wcpu")
def cpu(payload: Any, job: Any) -> None:
    cpu_job()


@fairqueue.handler("wnoop")
async def noop(payload: Any, job: Any) -> None:
    return None


@fairqueue.handler("wnoopsync")
def noop_sync(payload: Any, job: Any) -> None:
    return None


@fairqueue.handler("bench")
async def bench(payload: Any, job: Any) -> None:
    started_ms = job.started_ms or int(time.time() * 1000)
    run_ms = float((payload or {}).get("runMs") or os.environ.get("FQBENCH_RUN_MS", "10"))
    await asyncio.sleep(run_ms / 1000)
    line = json.dumps(
        {
            "id": job.job_id,
            "l": job.priority_level.value if job.priority_level else None,
            "t": job.tenant_id,
            "ts": job.enqueued_ms,
            "p": started_ms,
            "f": int(time.time() * 1000),
            "a": job.attempts_made,
            "ok": True,
        }
    )
    os.write(1, (line + "\n").encode())  # one write: lines of processes never interleave
