"""The standalone relay loop that ``manage.py fairqueue_relay`` runs: :func:`relay_outbox`
every interval, at once again while rows remain. Stopping, start-up, backoff and
database connections are :class:`fairqueue.loop.Loop`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TextIO

from fairqueue.broker import refuses_every_write
from fairqueue.conf import get_settings
from fairqueue.enqueue.outbox import RELAY_BATCH_SIZE, RelayResult, relay_outbox
from fairqueue.exceptions import BrokerRejectedError
from fairqueue.loop import Loop, backoff_ms

logger = logging.getLogger("fairqueue.outbox")

#: The pause between relay runs when nothing was waiting.
DEFAULT_INTERVAL_MS = 1_000


class Relay(Loop):
    """The relay loop: a relay run every interval (at once again while rows remain).

    Redis refusing every write (out of memory, read-only, an ACL) is backed off like
    Redis down (:class:`fairqueue.loop.Loop`): one add per run until it ends, one log line
    when it starts and one when it ends. A stop between an add and its row's delete is
    safe: the next relay adds it again under the same id (nothing twice). With ``once``
    the run's summary is written to ``out``.
    """

    logger = logger
    round_name = "outbox relay"
    resumed = "relaying resumed"
    finishing = "after the relay run in flight"

    def __init__(
        self,
        job_types: Sequence[str],
        *,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        batch_size: int = RELAY_BATCH_SIZE,
        verbosity: int = 1,
        out: TextIO | None = None,
        install_signal_handlers: bool = True,
    ) -> None:
        super().__init__(interval_ms=interval_ms, install_signal_handlers=install_signal_handlers)
        self.job_types = list(job_types)
        self.batch_size = batch_size
        self.verbosity = verbosity
        self.out = out
        #: The Redis error refusing every write, and the runs it refused in a row.
        self.refusing: str | None = None
        self.refusals = 0

    def run_once(self) -> RelayResult:
        try:
            result = relay_outbox(job_types=self.job_types, batch_size=self.batch_size)
        except BrokerRejectedError as exc:
            if self.once or not refuses_every_write(exc):
                raise
            return self._refused(exc)
        if self.refusing is not None:
            logger.info("Redis accepts writes again (was %s); relaying resumed", self.refusing)
            self.refusing, self.refusals = None, 0
        if self.once and self.out is not None:
            self.out.write(f"{result.summary()}\n")
        elif result.sent or result.refused:
            logger.log(logging.INFO if self.verbosity >= 2 else logging.DEBUG, result.summary())
        return result

    def _refused(self, exc: BrokerRejectedError) -> RelayResult:
        if self.refusing != exc.redis_error:
            logger.warning(
                "Redis refuses writes (%s): the outbox rows wait; retrying with backoff",
                exc.redis_error,
            )
        self.refusing = exc.redis_error
        self.refusals += 1
        return RelayResult(refusing=exc.redis_error)

    def pause_ms(self, result: RelayResult) -> int:
        if result.refusing is not None:
            return backoff_ms(self.interval_ms, self.refusals)
        return 0 if result.sent else self.interval_ms  # rows moved: more may wait

    def start_line(self) -> str:
        settings = get_settings()
        return (
            f"fairqueue_relay starting: {', '.join(self.job_types)}; every {self.interval_ms} ms "
            f"(at once while rows remain), {self.batch_size} rows a batch; Redis "
            f"{settings.redis_location} prefix {settings.prefix!r}"
        )
