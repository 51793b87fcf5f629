"""``manage.py rebalance_fair``: keep BullMQ queues in the fair order.

The command parses and checks arguments; :class:`fairqueue.rebalance.rebalancer.Rebalancer`
runs the loop (the django-tasks ``db_worker`` split).
"""

from __future__ import annotations

import gc
from typing import Any

from django.core.management.base import CommandError, CommandParser

from fairqueue.conf import get_settings
from fairqueue.exceptions import BrokerRejectedError, BrokerUnavailableError
from fairqueue.loop import unavailable_reason
from fairqueue.management.arguments import configured_job_types, port, recheck
from fairqueue.management.base import LoopCommand
from fairqueue.metrics import get_metrics
from fairqueue.rebalance.rebalancer import Rebalancer


class Command(LoopCommand):
    help = (
        "Rebalance BullMQ queues into fairqueue's weighted fair order every "
        "QUEUE_FAIR_REBALANCE_INTERVAL_MS. Run one per host; a Redis lock makes only one "
        "write per queue."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        self.add_loop_arguments(
            parser,
            verb="rebalance",
            once_help="Run one pass and exit.",
            interval_help=(
                "Pass interval in ms, 1..3600000 (default: QUEUE_FAIR_REBALANCE_INTERVAL_MS)."
            ),
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Print what a pass would do (adopt, overdue); write nothing.",
        )
        parser.add_argument(
            "--metrics-port", type=port, help="Serve Prometheus metrics on this port."
        )

    def handle_loop(self, **options: Any) -> None:
        settings = get_settings()
        job_types = configured_job_types(options.get("job_types"))
        interval = self.interval_ms(options, settings.rebalance_interval_ms)
        metrics_port = options.get("metrics_port")
        if metrics_port:
            from prometheus_client import start_http_server

            get_metrics()
            start_http_server(recheck("--metrics-port", metrics_port, port))
        rebalancer = Rebalancer(
            job_types,
            interval_ms=interval,
            dry_run=options["dry_run"],
            out=self.stdout,
            verbosity=options["verbosity"],
        )
        # Everything loaded so far (Django, the app, the settings) lives as long as the
        # loop: kept out of the garbage collector's scans, as preloading servers do, so the
        # history step's many short-lived objects never make it walk them all.
        gc.freeze()
        try:
            rebalancer.run(once=options["once"])
        except BrokerUnavailableError as exc:
            raise CommandError(
                f"Redis at {settings.redis.described} is unreachable "
                f"({unavailable_reason(exc)}): no pass ran"
            ) from None
        except BrokerRejectedError as exc:
            if exc.redis_error == "NoPermissionError":  # the message names the command
                raise CommandError(f"{exc}: no pass ran") from None
            raise CommandError(
                f"Redis refused a command ({exc.redis_error}): no pass ran"
            ) from None
