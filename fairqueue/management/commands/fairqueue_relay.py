"""``manage.py fairqueue_relay``: move durable jobs from the outbox to BullMQ.

The ``rebalance_fair`` leader already relays every round; run this where no rebalancer
runs, or to drain the outbox faster. Several may run at once on PostgreSQL (rows are
claimed with ``SKIP LOCKED``); on SQLite run one. The command parses arguments;
:class:`fairqueue.enqueue.relay.Relay` runs the loop.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from fairqueue.enqueue.outbox import RELAY_BATCH_SIZE
from fairqueue.enqueue.relay import DEFAULT_INTERVAL_MS, Relay
from fairqueue.exceptions import BrokerRejectedError, BrokerUnavailableError
from fairqueue.management.arguments import configured_job_types, int_in_range, recheck
from fairqueue.management.base import LoopCommand

batch_size = int_in_range(1, 10_000)


class Command(LoopCommand):
    help = (
        "Move durable jobs (enqueue_on_commit, durable=True) from the outbox table to "
        "BullMQ, oldest first, with their fair placement."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        self.add_loop_arguments(
            parser,
            verb="relay",
            once_help="Run the relay once and exit.",
            interval_help=f"Pause between runs in ms, 1..3600000 (default: {DEFAULT_INTERVAL_MS}).",
        )
        parser.add_argument(
            "--batch-size",
            type=batch_size,
            default=RELAY_BATCH_SIZE,
            help=f"Rows claimed per transaction, 1..10000 (default: {RELAY_BATCH_SIZE}).",
        )

    def handle_loop(self, **options: Any) -> None:
        relay = Relay(
            configured_job_types(options.get("job_types")),
            interval_ms=self.interval_ms(options, DEFAULT_INTERVAL_MS),
            batch_size=recheck(
                "--batch-size", options.get("batch_size", RELAY_BATCH_SIZE), batch_size
            ),
            verbosity=options["verbosity"],
            out=self.stdout,
        )
        try:
            relay.run(once=options["once"])
        except BrokerUnavailableError as exc:
            raise CommandError(f"Redis is unreachable: {exc}") from None
        except BrokerRejectedError as exc:
            raise CommandError(f"{exc}: the outbox rows wait") from None
