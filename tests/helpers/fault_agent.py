"""Processes of the fault suite (tests/e2e/test_faults.py), run as
``python -m tests.helpers.fault_agent``.

Each role is a separate OS process so the suite can kill Redis (or a leader) under it:

* ``worker OUT``: a stock ``bullmq.Worker`` on the ``email`` queue. It appends
  ``R <id>`` to ``OUT`` when its processor runs and ``C <id>`` when BullMQ confirmed the
  completion (the worker's ``completed`` event, emitted after ``moveToCompleted``
  returned): the file survives the worker, and a job counts as completed twice only if
  two ``C`` lines name it.
* ``enqueue OUT COUNT MODE``: enqueues ``COUNT`` jobs through fairqueue in batches of
  50: ``durable`` all through ``enqueue_jobs(durable=True)``; ``mixed`` alternates a
  durable batch and 50 direct ``enqueue_job`` calls with a ``job_id``, each retried on any
  error (the id is the idempotency key). A tenth of the jobs have a
  ``priority_override`` (an audit row). Writes one JSON line per committed batch:
  ``{"ids": [...], "audited": [...]}``.
* ``limited OUT COUNT MAX_ACTIVE``: enqueues ``COUNT`` jobs of a tenant limited to
  ``MAX_ACTIVE`` running jobs and as many of an unlimited one (see :func:`limited`).
* ``paused OUT COUNT``: pauses tenant ``drain`` and enqueues ``COUNT`` of its jobs (held
  until it is resumed), pauses ``zed`` with 100 jobs, and enqueues 100 jobs of ``cap``
  (``max_active`` 2) and 100 of ``free`` (see :func:`paused`).
* ``resume TENANT``: ``resume_tenant(TENANT)``, as an operator would.
* ``tenants OUT COUNT``: enqueues ``COUNT`` jobs over tenants ``u0``..``u9`` (``u9``'s
  fail, with 2 attempts) for the usage ledger's fault test; one JSON line with the ids.
* ``usage``: prints the usage ledger's rows as JSON (tenant -> attempts, completed,
  failed, worker ms).
* ``check``: prints the database side as JSON: outbox rows left, audit rows' job ids.
* ``reset``: deletes outbox and audit rows (the suite's scratch database).

Configuration comes from the environment (``DATABASE_URL``, ``FAIRQUEUE_REDIS_URL``,
``FAIRQUEUE_PREFIX``), as for the ``manage.py`` commands the suite also starts.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time


def _django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def worker(out_path: str) -> None:
    from bullmq import Worker

    prefix = os.environ["FAIRQUEUE_PREFIX"]
    url = os.environ["FAIRQUEUE_REDIS_URL"]
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)

    job_s = float(os.environ.get("FAULT_JOB_MS", "0")) / 1000

    async def process(job, token):
        out.write(f"R {job.id}\n")
        if job_s:
            await asyncio.sleep(job_s)
        return None

    def completed(job, result):
        out.write(f"C {job.id}\n")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        opts = {
            "connection": url,
            "prefix": prefix,
            "concurrency": 4,
            "autorun": False,
            # Short locks and stall checks, so a job left active by a Redis crash goes
            # back to wait within seconds; several stalls allowed (two restarts).
            "lockDuration": 4_000,
            "stalledInterval": 1_000,
            "maxStalledCount": 10,
            "runRetryDelay": 300,
        }
        while not stop.is_set():
            bull_worker = Worker("email", process, opts)
            bull_worker.on("completed", completed)
            bull_worker.on("error", lambda *args: None)
            task = asyncio.ensure_future(bull_worker.run())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                await bull_worker.close()
                task.cancel()
                break
            out.write("X worker run ended; starting a new worker\n")
            await asyncio.sleep(0.5)

    asyncio.run(main())
    out.close()


def enqueue(out_path: str, count: int, mode: str) -> None:
    _django()
    from fairqueue.enqueue.api import enqueue_job, enqueue_jobs

    out = open(out_path, "a", buffering=1)  # noqa: SIM115
    tag = os.environ.get("FAULT_TAG", "j")
    batch = 50
    step = 2 * batch if mode == "mixed" else batch
    for start in range(0, count, step):
        # Durable: one transaction per batch; never talks to Redis before commit.
        payloads = [{"n": start + i} for i in range(min(batch, count - start))]
        plain = enqueue_jobs("email", payloads[:45], tenant_id="t1", durable=True)
        audited = enqueue_jobs(
            "email", payloads[45:], tenant_id="t2", priority_override="high", durable=True
        )
        out.write(
            json.dumps(
                {
                    "ids": [job.job_id for job in plain + audited],
                    "audited": [job.job_id for job in audited],
                }
            )
            + "\n"
        )
        if mode != "mixed":
            continue
        # Direct, under the caller's id, retried until it succeeds.
        ids, audited_ids = [], []
        for i in range(start + batch, min(start + 2 * batch, count)):
            job_id = f"{tag}-{i}"
            override = "critical" if i % 10 == 0 else None
            for _attempt in range(600):
                try:
                    enqueue_job(
                        "email",
                        {"n": i},
                        tenant_id="t3",
                        job_id=job_id,
                        priority_override=override,
                    )
                    break
                except Exception:  # Redis down or restarting: same id, try again
                    time.sleep(0.1)
            else:
                raise SystemExit(f"could not enqueue {job_id}")
            ids.append(job_id)
            if override:
                audited_ids.append(job_id)
        out.write(json.dumps({"ids": ids, "audited": audited_ids}) + "\n")
    out.close()


def limited(out_path: str, count: int, max_active: int) -> None:
    """Enqueue ``count`` jobs of tenant ``lim`` (``max_active`` running at most, so most
    are held) and ``count`` of tenant ``free`` (no limits), interleaved in batches of 50,
    with the database lookups wired. One JSON line per batch, as ``enqueue`` writes, the
    limited tenant's ids also under ``"limited"``."""
    _django()
    from fairqueue.enqueue.api import enqueue_jobs
    from fairqueue.enqueue.priority import wire_tenant_plan_lookup
    from fairqueue.models import TenantPlan

    TenantPlan.objects.update_or_create(tenant_id="lim", defaults={"max_active": max_active})
    TenantPlan.objects.update_or_create(tenant_id="free", defaults={"max_active": None})
    wire_tenant_plan_lookup()
    out = open(out_path, "a", buffering=1)  # noqa: SIM115
    for start in range(0, count, 50):
        size = min(50, count - start)
        held = enqueue_jobs("email", [{"n": start + i} for i in range(size)], tenant_id="lim")
        free = enqueue_jobs("email", [{"n": start + i} for i in range(size)], tenant_id="free")
        ids = [job.job_id for job in held + free]
        record = {"ids": ids, "audited": [], "limited": [job.job_id for job in held]}
        out.write(json.dumps(record) + "\n")
    out.close()


def paused(out_path: str, count: int) -> None:
    """The tenants of the kill -9 of the loop mid-release: ``drain`` paused with ``count``
    held jobs (the backlog its resume releases), ``zed`` paused with 100, ``cap`` limited
    to 2 running with 100 and ``free`` with 100, database lookups wired. One JSON line:
    every id under ``"ids"``, and each tenant's under its name."""
    _django()
    from fairqueue import pause_tenant
    from fairqueue.enqueue.api import enqueue_jobs
    from fairqueue.enqueue.priority import wire_tenant_plan_lookup
    from fairqueue.models import TenantPlan

    for tenant, max_active in (("drain", None), ("zed", None), ("cap", 2), ("free", None)):
        TenantPlan.objects.update_or_create(
            tenant_id=tenant, defaults={"max_active": max_active, "paused": False}
        )
    wire_tenant_plan_lookup()
    pause_tenant("drain")
    pause_tenant("zed")
    record: dict[str, list[str]] = {"ids": [], "audited": []}
    for tenant, size in (("drain", count), ("zed", 100), ("cap", 100), ("free", 100)):
        ids = [
            job.job_id
            for start in range(0, size, 250)
            for job in enqueue_jobs(
                "email", [{"n": start + i} for i in range(min(250, size - start))], tenant_id=tenant
            )
        ]
        record[tenant] = ids
        record["ids"] += ids
    with open(out_path, "w") as out:
        out.write(json.dumps(record) + "\n")


def resume(tenant: str) -> None:
    _django()
    from fairqueue import resume_tenant

    resume_tenant(tenant)


def tenants(out_path: str, count: int) -> None:
    _django()
    from fairqueue.enqueue.api import enqueue_jobs

    ids: list[str] = []
    for start in range(0, count, 250):
        size = min(250, count - start)
        tenant = f"u{(start // 250) % 10}"
        attempts = 2 if tenant == "u9" else 1
        jobs = enqueue_jobs(
            "email", [{"n": start + i} for i in range(size)], tenant_id=tenant, attempts=attempts
        )
        ids += [job.job_id for job in jobs]
    with open(out_path, "w") as out:
        out.write(json.dumps({"ids": ids}) + "\n")


def usage() -> None:
    _django()
    from fairqueue.models import TenantUsage

    rows: dict[str, list[int]] = {}
    for row in TenantUsage.objects.filter(job_type="email"):
        got = rows.setdefault(row.tenant_id, [0, 0, 0, 0])
        for i, value in enumerate((row.attempts, row.completed, row.failed, row.worker_ms)):
            got[i] += value
    print(json.dumps(rows))


def check() -> None:
    _django()
    from fairqueue.models import OutboxJob, PriorityOverrideAudit

    print(
        json.dumps(
            {
                "outbox": OutboxJob.objects.count(),
                "audits": list(PriorityOverrideAudit.objects.values_list("job_id", flat=True)),
            }
        )
    )


def reset() -> None:
    _django()
    from fairqueue.models import OutboxJob, PriorityOverrideAudit, TenantUsage

    TenantUsage.objects.all().delete()
    OutboxJob.objects.all().delete()
    PriorityOverrideAudit.objects.all().delete()


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "worker":
        worker(args[0])
    elif role == "enqueue":
        enqueue(args[0], int(args[1]), args[2])
    elif role == "limited":
        limited(args[0], int(args[1]), int(args[2]))
    elif role == "paused":
        paused(args[0], int(args[1]))
    elif role == "resume":
        resume(args[0])
    elif role == "tenants":
        tenants(args[0], int(args[1]))
    elif role == "usage":
        usage()
    elif role == "check":
        check()
    elif role == "reset":
        reset()
    else:
        raise SystemExit(f"unknown role {role!r}")
