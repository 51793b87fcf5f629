"""The Celery side of ``bench_worker.py``: the same CPU-bound job as a Celery task, on a
Redis broker (``FQBENCH_REDIS_URL``), run by ``celery -A benchmarks.worker_celery worker
--pool prefork``. Celery's defaults otherwise (early acks, prefetch multiplier 4); it
prints ``fqbench-ready`` once its pool is up."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_ready

from benchmarks.worker_work import cpu_job

app = Celery("fqbench", broker=os.environ.get("FQBENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(broker_connection_retry_on_startup=True, task_default_queue="fqbench_cpu")


@worker_ready.connect
def _ready(**_: object) -> None:
    """Tell the benchmark the pool is up (Celery logs its own line at INFO only)."""
    os.write(1, b"fqbench-ready\n")


@app.task(name="fqbench.wcpu", ignore_result=True)
def wcpu() -> None:
    cpu_job()
