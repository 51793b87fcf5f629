"""What ``benchmarks/bench_ledger.py``'s live scenarios share: Django on the benchmark's
settings (``benchmarks/live_settings.py``, a SQLite file the loop reads too), the
``rebalance_fair`` loop as a subprocess, stock Node BullMQ workers that count their own
attempts (``benchmarks/usage_worker.mjs``), and reading what they counted."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from benchmarks.common import loop_process, stop_process

ROOT = Path(__file__).resolve().parent.parent
WORKER_JS = ROOT / "benchmarks" / "usage_worker.mjs"
JOB_TYPE = QUEUE = "bench"
SETTINGS_MODULE = "benchmarks.live_settings"
#: The loop's pass interval (its ticks, the history and usage steps, every 250 ms).
INTERVAL_MS = 1_000


def setup_django(url: str, tmp: Path) -> None:
    """Django on the benchmark's settings (``DJANGO_SETTINGS_MODULE`` and ``FQBENCH_DB``
    were set before Django was) and the SQLite file the loop shares; the Django cache on
    the private Redis (database 1), shared by every process."""
    cache_url = url.rsplit("/", 1)[0] + "/1"
    os.environ.update(
        {
            "FAIRQUEUE_REDIS_URL": url,
            "FQBENCH_CACHE_URL": cache_url,
            # Every job hash kept: the history reads each start's tenant from it, and a
            # loop killed -9 is down for seconds (docs/usage.md).
            "FAIRQUEUE_KEEP_COMPLETED_COUNT": "10000000",
            "FAIRQUEUE_KEEP_FAILED_COUNT": "10000000",
        }
    )
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    # Read when the cache is first used (not yet): the loop reads FQBENCH_CACHE_URL.
    settings.CACHES = {
        "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": cache_url}
    }

    call_command("migrate", verbosity=0)


def use_prefix(prefix: str) -> None:
    """This process's fairqueue on ``prefix`` (each scenario its own)."""
    from fairqueue import conf
    from fairqueue.broker import close_brokers

    os.environ["FAIRQUEUE_PREFIX"] = prefix
    close_brokers()
    conf.reload_settings()


class Loop:
    """``manage.py rebalance_fair`` as a subprocess, with the scenario's usage settings."""

    def __init__(self, log: TextIO, **usage: Any) -> None:
        self.log = log
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for name, value in usage.items():
            self.env[f"FQBENCH_{name.upper()}"] = (
                value if isinstance(value, str) else json.dumps(value)
            )
        self.kills = 0
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        return loop_process(JOB_TYPE, INTERVAL_MS, self.env, self.log)

    def kill9_and_restart(self, down_s: float = 1.0) -> None:
        self.process.kill()
        self.process.wait(10)
        self.kills += 1
        time.sleep(down_s)
        self.process = self._start()

    def stop(self) -> None:
        stop_process(self.process)


class Workers:
    """Stock Node BullMQ workers, each writing its lines to a file of its own."""

    def __init__(
        self, url: str, prefix: str, tmp: Path, log: TextIO, *, concurrency: int, lock_ms: int
    ) -> None:
        self.url, self.prefix, self.tmp, self.log = url, prefix, tmp, log
        self.concurrency, self.lock_ms = concurrency, lock_ms
        self.fixed = tmp / f"{prefix}.fixed"
        self.processes: list[subprocess.Popen[str]] = []
        self.files: list[Path] = []
        self.kills = 0

    def start(self, run_ms: int = 10) -> int:
        path = self.tmp / f"{self.prefix}-worker{len(self.files)}.txt"
        process = subprocess.Popen(  # noqa: S603 - our own script
            [
                "node",
                str(WORKER_JS),
                self.url,
                self.prefix,
                QUEUE,
                str(self.concurrency),
                str(run_ms),
                str(path),
                str(self.lock_ms),
                str(self.fixed),
            ],  # noqa: S607
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,
        )
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise SystemExit(f"a Node worker did not start (see {self.tmp})")
        self.processes.append(process)
        self.files.append(path)
        return len(self.processes) - 1

    def kill9_and_restart(self, index: int, down_s: float = 1.0) -> None:
        self.processes[index].kill()
        self.processes[index].wait(10)
        self.kills += 1
        time.sleep(down_s)
        self.start()
        self.processes[index] = self.processes.pop()

    def fix(self) -> None:
        """The failing tenant fixed its integration: its jobs succeed from now on."""
        self.fixed.write_text("fixed")

    def stop(self) -> None:
        for process in self.processes:
            stop_process(process)

    def attempts(self) -> list[Attempt]:
        return read_attempts(self.files)


@dataclass
class Attempt:
    """One attempt as a worker counted it: started, and ended if it saw the end."""

    job_id: str
    tenant: str
    level: str
    started_ms: int
    made: int = 0  # attempts made before it (a stalled attempt's rerun has the same)
    ok: bool | None = None
    take_to_end_ms: float = 0.0
    processor_ms: float = 0.0
    ended_ms: int | None = None


def read_attempts(files: Iterable[Path]) -> list[Attempt]:
    """Each file's attempts, a start paired with the next end of its job in that file (a
    worker killed -9 leaves starts without an end)."""
    out: list[Attempt] = []
    for path in files:
        running: dict[str, Attempt] = {}
        for text in path.read_text().splitlines():
            parts = text.split(" ")
            if parts[0] == "s" and len(parts) >= 5:
                attempt = Attempt(parts[1], parts[2], parts[5] if len(parts) > 5 else "", 0)
                attempt.started_ms, attempt.made = int(parts[4]), int(parts[3])
                running[parts[1]] = attempt
                out.append(attempt)
            elif parts[0] == "e" and len(parts) >= 7:
                attempt = running.pop(parts[1], None)
                if attempt is None:
                    continue
                attempt.ok = parts[3] == "1"
                attempt.take_to_end_ms = float(parts[5]) - float(parts[4])
                attempt.processor_ms = float(parts[6])
                attempt.ended_ms = int(parts[5])
    return out


@dataclass
class Tally:
    attempts: int = 0
    completed: int = 0
    failed: int = 0
    unended: int = 0
    ms: float = 0.0
    processor_ms: float = 0.0
    by_level: dict[str, int] = field(default_factory=dict)


def tally(attempts: Iterable[Attempt]) -> dict[str, Tally]:
    out: dict[str, Tally] = {}
    for a in attempts:
        row = out.setdefault(a.tenant, Tally())
        row.attempts += 1
        row.by_level[a.level] = row.by_level.get(a.level, 0) + 1
        if a.ok is None:
            row.unended += 1
            continue
        row.completed += a.ok
        row.failed += not a.ok
        row.ms += a.take_to_end_ms
        row.processor_ms += a.processor_ms
    return out


@dataclass
class Unseen:
    """Where a worker killed -9 could not count what Redis did."""

    #: Attempts BullMQ started (its ``ats``) that no processor started: taken by the
    #: killed worker (fetched with its previous job's end) in the instant before it died.
    taken: int = 0
    #: Attempts it started whose end Redis recorded before the worker wrote its line.
    ended: int = 0
    #: Attempts it started that stalled (BullMQ ran the job again, the same attempt).
    stalled: int = 0


def reconcile(attempts: list[Attempt], started_by_job: Mapping[str, int]) -> dict[str, Unseen]:
    """Per tenant, what the workers could not see, from BullMQ's own count of each job's
    started attempts (``ats`` of its hash) and the workers' lines."""
    out: dict[str, Unseen] = {}
    by_job: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_job.setdefault(a.job_id, []).append(a)
    for job_id, mine in by_job.items():
        row = out.setdefault(mine[0].tenant, Unseen())
        row.taken += max(0, started_by_job.get(job_id, 0) - len(mine))
        for i, a in enumerate(mine):
            if a.ok is not None:
                continue
            rerun = any(later.made == a.made for later in mine[i + 1 :])
            if rerun:
                row.stalled += 1
            else:
                row.ended += 1
    return out


def started_by_job(client: Any, prefix: str, job_ids: Iterable[str]) -> dict[str, int]:
    """BullMQ's ``ats`` (attempts started) of each job's hash."""
    ids = list(job_ids)
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(f"{prefix}:{QUEUE}:{job_id}", "ats")
    return {job_id: int(v or 0) for job_id, v in zip(ids, pipe.execute(), strict=True)}


def ledger() -> dict[str, tuple[int, int, int, int]]:
    """The database's ledger per tenant: (attempts, completed, failed, worker ms)."""
    from fairqueue.models import TenantUsage

    out: dict[str, list[int]] = {}
    for row in TenantUsage.objects.filter(job_type=JOB_TYPE):
        got = out.setdefault(row.tenant_id, [0, 0, 0, 0])
        for i, value in enumerate((row.attempts, row.completed, row.failed, row.worker_ms)):
            got[i] += value
    return {tenant: (v[0], v[1], v[2], v[3]) for tenant, v in out.items()}


def settled(client: Any, prefix: str, timeout_s: float = 60.0) -> bool:
    """Until the loop has read the events stream up to its last entry now and written
    every ledger row it changed to the database."""
    base = f"{prefix}:{QUEUE}"
    last = client.xrevrange(f"{base}:events", count=1)
    target = last[0][0].decode() if last else "0-0"

    def seq(text: str) -> tuple[int, int]:
        ms, _, n = text.partition("-")
        return int(ms or 0), int(n or 0)

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cursor = client.hget(f"{base}:fq:hist", "cursor")
        read = cursor is not None and seq(cursor.decode()) >= seq(target)
        if read and client.zcard(f"{base}:fq:use:dirty") == 0:
            time.sleep(0.6)  # the usage step after the last history step
            if client.zcard(f"{base}:fq:use:dirty") == 0:
                return True
        time.sleep(0.1)
    return False


def finished(client: Any, prefix: str) -> int:
    base = f"{prefix}:{QUEUE}"
    return int(client.zcard(f"{base}:completed")) + int(client.zcard(f"{base}:failed"))


def clear_usage_tables() -> None:
    from fairqueue.models import HoldAudit, TenantHold, TenantPlan, TenantUsage

    for model in (TenantUsage, TenantHold, HoldAudit, TenantPlan):
        model.objects.all().delete()


def print_table(rows: list[Mapping[str, Any]]) -> None:
    if not rows:
        return
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row[col]) for col in cols) + " |")
