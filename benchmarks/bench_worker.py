"""``fairqueue_worker --processes``: throughput beside two workers started by hand, one
process, Celery's prefork pool, and the stock Python ``bullmq`` Worker, interleaved in
one run on a private ``redis-server`` (so it may be flushed between runs).

CPU-bound jobs (``--jobs``, default 4,000; each ``--cpu-ms`` of pure Python, calibrated
here on one core, then one ``INCR`` the benchmark counts), one job at a time per process:

* ``fq --processes 2``: one supervisor, two children;
* ``fq x2 by hand``: two single-process ``fairqueue_worker`` started side by side (the
  ideal the supervisor is held to);
* ``fq --processes 1``: one child;
* ``celery prefork 2``: ``celery worker --pool prefork --concurrency 2`` on a Redis
  broker, the same job code as a task.

No-op jobs (``--noop-jobs``, default 10,000), one process, ``--concurrency`` 8:
``fq 1 process`` against ``stock bullmq`` (a stock ``bullmq.Worker``, no fairqueue code),
both ``async`` no-ops; ``fq 1 process, sync`` against ``stock bullmq, sync``, both sync
no-ops in a thread pool of 8. Besides the rate: each variant's CPU time per job (its
processes', a figure a loaded machine disturbs less) and Redis commands per job (``INFO
commandstats``, the benchmark's own polls left out).

Each run: the jobs are enqueued first (fairqueue's enqueue, so in the fair order; Celery's
``send_task``), with the BullMQ queue paused; the workers start, and once every process
is up (fairqueue's liveness records; the stock worker's and Celery's "ready" lines) the
queue is resumed and the clock starts; it stops when the last job is done. Process start
is left out: a worker starts once and runs for days. Rounds rotate the variants' order;
the table shows each variant's median rate and the ratios the targets are about.

Figures are ratios of runs side by side in one process: on a shared, loaded machine the
absolute rates mean nothing, and even ratios of CPU-bound runs are only meaningful when
nothing else competes for the cores (the run prints the load average first).

    python benchmarks/bench_worker.py [--jobs 4000] [--noop-jobs 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The handlers' settings, before bench_rebalance sets Django up on import.
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.worker_settings"

import redis  # noqa: E402

from benchmarks.bench_rebalance import private_redis  # noqa: E402
from benchmarks.common import stop_process, wait_until  # noqa: E402
from benchmarks.worker_work import loops_for  # noqa: E402

PREFIX = "fqbw"
DONE_KEY = "fqbench:done"
OUT = ROOT / "benchmarks" / "out"
LOG = OUT / "worker.log"
SETTINGS_MODULE = "benchmarks.worker_settings"
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # "cpu" or "noop"
    #: Commands to start (each one process tree), given the run's settings.
    commands: Callable[[argparse.Namespace, str], list[list[str]]]
    #: How the benchmark knows the workers are up: fairqueue processes expected in the
    #: liveness records, or a line each command prints.
    processes: int = 0
    ready_line: str | None = None
    #: The job type and queue of its jobs (the no-op ones: ``wnoop`` async handlers,
    #: ``wnoopsync`` sync ones).
    queue: str = ""

    @property
    def job_type(self) -> str:
        return self.queue or ("wcpu" if self.kind == "cpu" else "wnoop")


def _fq(job_type: str, *extra: str) -> list[str]:
    # -v 0: no line per job (the stock worker and Celery at WARNING log none either).
    return [
        sys.executable,
        str(ROOT / "manage.py"),
        "fairqueue_worker",
        job_type,
        "-v",
        "0",
        *extra,
    ]


VARIANTS = (
    Variant("fq --processes 2", "cpu", lambda a, u: [_fq("wcpu", "--processes", "2")], 2),
    Variant("fq x2 by hand", "cpu", lambda a, u: [_fq("wcpu"), _fq("wcpu")], 2),
    Variant("fq --processes 1", "cpu", lambda a, u: [_fq("wcpu", "--processes", "1")], 1),
    Variant(
        "celery prefork 2",
        "cpu",
        lambda a, u: [
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "benchmarks.worker_celery",
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                "2",
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-Q",
                "fqbench_cpu",
            ]
        ],
        ready_line="fqbench-ready",
    ),
    Variant(
        "fq 1 process",
        "noop",
        lambda a, u: [_fq("wnoop", "--concurrency", str(a.concurrency))],
        1,
    ),
    Variant(
        "stock bullmq",
        "noop",
        lambda a, u: [
            [
                sys.executable,
                str(ROOT / "benchmarks" / "stock_bullmq_worker.py"),
                u,
                PREFIX,
                "wnoop",
                str(a.concurrency),
            ]
        ],
        ready_line="ready",
    ),
    Variant(
        "fq 1 process, sync",
        "noop",
        lambda a, u: [_fq("wnoopsync", "--concurrency", str(a.concurrency))],
        1,
        queue="wnoopsync",
    ),
    Variant(
        "stock bullmq, sync",
        "noop",
        lambda a, u: [
            [
                sys.executable,
                str(ROOT / "benchmarks" / "stock_bullmq_worker.py"),
                u,
                PREFIX,
                "wnoopsync",
                str(a.concurrency),
                "sync",
            ]
        ],
        ready_line="ready",
        queue="wnoopsync",
    ),
)


def _env(url: str, loops: int) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
        "FAIRQUEUE_PREFIX": PREFIX,
        "FAIRQUEUE_REDIS_URL": url,
        "FQBENCH_REDIS_URL": url,
        "FQBENCH_CPU_LOOPS": str(loops),
        "FQBENCH_DONE_KEY": DONE_KEY,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }


# -- one run ---------------------------------------------------------------------------------


def _enqueue(variant: Variant, count: int) -> None:
    """The jobs of a run, before any worker starts (the BullMQ queue paused)."""
    if variant.name.startswith("celery"):
        from benchmarks.worker_celery import app

        for _ in range(count):
            app.send_task("fqbench.wcpu", queue="fqbench_cpu")
        return
    from fairqueue.broker import get_broker, get_sync_broker
    from fairqueue.enqueue.api import enqueue_jobs

    queue = variant.job_type
    sync = get_sync_broker()
    sync.run(_pause, get_broker(), queue)
    tenants = 10
    for tenant in range(tenants):
        payloads = [{"n": i} for i in range(tenant, count, tenants)]
        for start in range(0, len(payloads), 1000):
            enqueue_jobs(queue, payloads[start : start + 1000], tenant_id=f"t{tenant}")


async def _pause(broker: Any, queue: str) -> None:
    await broker.conn.queue(queue).pause()


async def _resume(broker: Any, queue: str) -> None:
    await broker.conn.queue(queue).resume()


@dataclass(frozen=True)
class Run:
    """One run: jobs per second; the CPU time its worker processes spent per job (user
    and system, the process trees of the commands: a figure a loaded machine disturbs
    far less than the rate); Redis commands per job by command (the workers' only)."""

    rate: float
    cpu_us: float
    commands: dict[str, float]
    #: ``--instructions``: the worker process's instructions per job (callgrind).
    instructions: float | None = None


def run_once(variant: Variant, args: argparse.Namespace, url: str, env: dict[str, str]) -> Run:
    """One run of ``variant``, measured while the clock ran."""
    client = redis.Redis.from_url(url)
    client.flushall()  # the benchmark's own server
    count = args.jobs if variant.kind == "cpu" else args.noop_jobs
    _enqueue(variant, count)
    queue = variant.job_type
    processes: list[subprocess.Popen[str]] = []
    with LOG.open("a") as log:
        log.write(f"\n== {variant.name}\n")
        log.flush()
        counted = args.instructions and variant.kind == "noop"
        callgrind_out = OUT / "worker.callgrind"
        try:
            for command in variant.commands(args, url):
                if counted:
                    command = [  # noqa: PLW2901 - the same command, under callgrind
                        "valgrind",
                        "--tool=callgrind",
                        "--instr-atstart=no",
                        f"--callgrind-out-file={callgrind_out}",
                        *command,
                    ]
                processes.append(_start(command, env, log, variant.ready_line is not None))
            _wait_ready(variant, processes, client, queue, 20 if counted else 1)
            if counted:
                time.sleep(CALLGRIND_SETTLE_S)
                _callgrind(processes, "-i", "on")
            if not variant.name.startswith("celery"):
                from fairqueue.broker import get_broker, get_sync_broker

                get_sync_broker().run(_resume, get_broker(), queue)
            before = _command_counts(client)
            cpu_before = _cpu_s(processes)
            polls = [0]
            started = time.monotonic()
            if not wait_until(
                lambda: _done(client, variant, queue, count, polls), args.timeout_s, 0.005
            ):
                raise RuntimeError(f"{variant.name}: not done in {args.timeout_s} s; see {LOG}")
            elapsed = time.monotonic() - started
            cpu_s = _cpu_s(processes) - cpu_before
            after = _command_counts(client)
            instructions = (
                _callgrind_total(processes, callgrind_out, variant.name) / count
                if counted
                else None
            )
        finally:
            for process in processes:
                stop_process(process, timeout=30)
    client.close()
    return Run(
        count / elapsed,
        cpu_s / count * 1e6,
        _per_job(before, after, variant, polls[0], count),
        instructions,
    )


#: ``--instructions``: how long a worker under callgrind is left to settle once ready
#: (the stock worker prints its line before it connects), before counting starts.
CALLGRIND_SETTLE_S = 15.0


def _callgrind(processes: Sequence[Any], *arguments: str) -> None:
    for process in processes:  # valgrind runs each command in the process it started
        subprocess.run(  # noqa: S603 - valgrind's own tool
            ["callgrind_control", *arguments, str(process.pid)], capture_output=True, check=True
        )


def _callgrind_total(processes: Sequence[Any], out: Path, name: str) -> int:
    """The instructions counted so far in ``processes`` (dumped now, read back); each
    dump is kept as ``benchmarks/out/callgrind.<variant>.<n>`` for ``callgrind_annotate``."""
    total = 0
    for index, process in enumerate(processes):
        for old in out.parent.glob(f"{out.name}*"):
            old.unlink()
        _callgrind([process], "-d")
        dumped = sorted(out.parent.glob(f"{out.name}*"), key=lambda p: p.stat().st_mtime)
        if not dumped:
            raise RuntimeError(f"callgrind wrote nothing for pid {process.pid}")
        kept = dumped[-1].rename(OUT / f"callgrind.{name.replace(' ', '_')}.{index}")
        for line in kept.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                total += int(line.split()[1])
                break
        else:
            raise RuntimeError("callgrind wrote no totals")
    return total


def _cpu_s(processes: Sequence[Any]) -> float:
    """CPU seconds (user + system) the process trees of ``processes`` have used so far
    (Linux's ``/proc``; children that exited are left out, none does during a run)."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # After the name: state ppid ... utime (the 12th) stime (the 13th).
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    tree = {process.pid for process in processes}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in stats.items() if ppid in tree} - tree
        grew = bool(children)
        tree |= children
    return sum(stats[pid][1] for pid in tree if pid in stats)


def _command_counts(client: redis.Redis) -> dict[str, int]:
    """The server's calls by command so far (``INFO commandstats``)."""
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def _per_job(
    before: dict[str, int], after: dict[str, int], variant: Variant, polls: int, count: int
) -> dict[str, float]:
    """Commands per job between two counts, less the benchmark's own: the INFO that
    read ``before`` and, per poll of :func:`_done`, a GET (CPU-bound runs) or a MULTI
    of four reads."""
    calls = {name: after[name] - before.get(name, 0) for name in after}
    calls["info"] -= 1
    if variant.kind == "cpu":
        calls["get"] -= polls
    else:
        for name, per_poll in (("multi", 1), ("exec", 1), ("llen", 3), ("zcard", 1)):
            calls[name] -= polls * per_poll
    return {name: n / count for name, n in sorted(calls.items()) if n > 0}


def _start(command: list[str], env: dict[str, str], log: TextIO, piped: bool) -> Any:
    return subprocess.Popen(  # noqa: S603 - our own commands
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE if piped else log,
        stderr=subprocess.STDOUT if piped else log,
        text=True,
        # This benchmark's session for every variant: with the kernel's autogroup
        # scheduling (on by default), each session gets its own share of a busy machine,
        # so two workers in two sessions would get twice the CPU of one supervisor's
        # processes (as two workers started by hand in one terminal would not).
        start_new_session=False,
    )


def _wait_ready(
    variant: Variant, processes: Sequence[Any], client: redis.Redis, queue: str, slower: int = 1
) -> None:
    """Until every process is up (``slower``: the timeout's factor, for valgrind)."""
    if variant.ready_line is not None:
        for process in processes:
            ready = threading.Event()
            threading.Thread(
                target=_read_output, args=(process, variant.ready_line, ready), daemon=True
            ).start()
            if not ready.wait(READY_TIMEOUT_S * slower):
                raise RuntimeError(f"{variant.name} did not start; see {LOG}")
        return
    key = f"{PREFIX}:{queue}:fq:procs"
    ready = wait_until(
        lambda: client.hlen(key) >= variant.processes, READY_TIMEOUT_S * slower, 0.05
    )
    if not ready:
        raise RuntimeError(f"{variant.name}: the worker processes did not start; see {LOG}")


def _read_output(process: Any, ready_line: str, ready: threading.Event) -> None:
    """Wait for ``ready_line``, then keep the pipe drained (a full pipe would block the
    worker) into the log."""
    with LOG.open("a") as log:
        for line in process.stdout:
            if ready_line in line:
                ready.set()
            log.write(line)


def _done(client: redis.Redis, variant: Variant, queue: str, count: int, polls: list[int]) -> bool:
    polls[0] += 1
    if variant.kind == "cpu":
        return int(client.get(DONE_KEY) or 0) >= count
    with client.pipeline(transaction=True) as pipe:
        for suffix, command in (
            ("wait", pipe.llen),
            ("paused", pipe.llen),
            ("prioritized", pipe.zcard),
            ("active", pipe.llen),
        ):
            command(f"{PREFIX}:{queue}:{suffix}")
        return sum(pipe.execute()) == 0


# -- the report --------------------------------------------------------------------------------


RATIOS = (
    ("cpu: --processes 2 / two by hand", "fq --processes 2", "fq x2 by hand", 0.95),
    ("cpu: --processes 2 / --processes 1", "fq --processes 2", "fq --processes 1", 1.6),
    ("cpu: --processes 2 / celery prefork 2", "fq --processes 2", "celery prefork 2", 1.0),
    ("cpu: two by hand / --processes 1 (the machine)", "fq x2 by hand", "fq --processes 1", None),
    ("noop: fq 1 process / stock bullmq", "fq 1 process", "stock bullmq", 1.0),
    ("noop, sync handlers: fq / stock", "fq 1 process, sync", "stock bullmq, sync", None),
)


def report(rates: dict[str, list[float]]) -> str:
    medians = {name: statistics.median(values) for name, values in rates.items() if values}
    lines = ["", f"{'variant':<22} {'median jobs/s':>14}  runs (jobs/s)"]
    for name, values in rates.items():
        if values:
            runs = " ".join(f"{v:.0f}" for v in values)
            lines.append(f"{name:<22} {medians[name]:>14.0f}  {runs}")
    lines += ["", f"{'ratio':<48} {'value':>6}  target"]
    for label, top, bottom, target in RATIOS:
        if top in medians and bottom in medians:
            ratio = medians[top] / medians[bottom]
            goal = (
                "—" if target is None else f">= {target:g}x {'ok' if ratio >= target else 'MISS'}"
            )
            lines.append(f"{label:<48} {ratio:>5.2f}x  {goal}")
    return "\n".join(lines)


def cpu_report(cpu: dict[str, list[float]]) -> str:
    """The no-op variants' median CPU time per job, and fairqueue's against the stock
    worker's as a rate would be (stock CPU / fairqueue CPU: above 1, fairqueue spends
    less per job)."""
    medians = {name: statistics.median(values) for name, values in cpu.items() if values}
    lines = ["", f"{'variant':<22} {'CPU us/job':>10}  runs"]
    for name, values in cpu.items():
        if values:
            runs = " ".join(f"{v:.0f}" for v in values)
            lines.append(f"{name:<22} {medians[name]:>10.0f}  {runs}")
    for suffix in ("", ", sync"):
        fq, stock = f"fq 1 process{suffix}", f"stock bullmq{suffix}"
        if fq in medians and stock in medians:
            ratio = medians[stock] / medians[fq]
            lines.append(f"noop{suffix}, by CPU per job: {stock} / {fq}  {ratio:.2f}x")
    return "\n".join(lines)


def instruction_report(instructions: dict[str, float]) -> str:
    """``--instructions``: each no-op variant's instructions per job, and the stock
    worker's against fairqueue's (above 1: fairqueue runs fewer per job)."""
    if not instructions:
        return ""
    lines = ["", f"{'variant':<22} {'instructions/job':>16}"]
    lines += [f"{name:<22} {n:>16,.0f}" for name, n in instructions.items()]
    for suffix in ("", ", sync"):
        fq, stock = f"fq 1 process{suffix}", f"stock bullmq{suffix}"
        if fq in instructions and stock in instructions:
            ratio = instructions[stock] / instructions[fq]
            lines.append(f"noop{suffix}, by instructions per job: {stock} / {fq}  {ratio:.3f}x")
    return "\n".join(lines)


def command_report(commands: dict[str, dict[str, float]]) -> str:
    """Redis commands per job of each variant's last run (the workers' only: what
    enqueued the jobs and the benchmark's polls left out), the busiest first."""
    lines = ["", f"{'variant':<22} {'commands/job':>12}  by command"]
    for name, per_job in commands.items():
        busiest = sorted(per_job.items(), key=lambda item: -item[1])[:6]
        by_command = " ".join(f"{command} {n:.2f}" for command, n in busiest)
        lines.append(f"{name:<22} {sum(per_job.values()):>12.2f}  {by_command}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4_000, help="CPU-bound jobs per run")
    parser.add_argument("--noop-jobs", type=int, default=10_000, help="no-op jobs per run")
    parser.add_argument("--cpu-ms", type=float, default=5.0, help="work per CPU-bound job")
    parser.add_argument("--concurrency", type=int, default=8, help="no-op runs' slots")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every variant")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per run")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="no-op runs under valgrind's callgrind: each worker's instructions per job "
        "(load does not move them; rates and CPU times then mean nothing)",
    )
    parser.add_argument(
        "--variant", action="append", choices=[v.name for v in VARIANTS], help="only these"
    )
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores")
    if load[0] > 3:
        print("WARNING: a loaded machine; CPU-bound ratios are not meaningful now")
    loops = loops_for(args.cpu_ms)
    print(f"{loops} loops = {args.cpu_ms:g} ms of pure Python on one core (calibrated)")
    chosen = [v for v in VARIANTS if not args.variant or v.name in args.variant]
    rates: dict[str, list[float]] = {v.name: [] for v in chosen}
    cpu: dict[str, list[float]] = {v.name: [] for v in chosen}
    instructions: dict[str, float] = {}
    commands: dict[str, dict[str, float]] = {}
    with private_redis() as url:
        env = _env(url, loops)
        os.environ.update({k: env[k] for k in env if k.startswith(("FQBENCH", "FAIRQUEUE"))})
        from fairqueue import conf

        conf.reload_settings()  # this server's URL and the prefix, from the environment
        from django.core.management import call_command

        call_command("migrate", verbosity=0)  # the enqueuer's tenant lookups (in memory)
        for round_index in range(args.rounds):
            shift = round_index % len(chosen)
            for variant in chosen[shift:] + chosen[:shift]:
                run = run_once(variant, args, url, env)
                rates[variant.name].append(run.rate)
                cpu[variant.name].append(run.cpu_us)
                if run.instructions is not None:
                    instructions[variant.name] = run.instructions  # the same every run
                commands[variant.name] = run.commands  # the last run's
                print(
                    f"round {round_index + 1}: {variant.name:<22} {run.rate:8.0f} jobs/s "
                    f"{run.cpu_us:7.0f} CPU us/job",
                    flush=True,
                )
        from fairqueue.broker import close_brokers

        close_brokers()
    print(report(rates))
    print(cpu_report(cpu))
    print(instruction_report(instructions))
    print(command_report(commands))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
