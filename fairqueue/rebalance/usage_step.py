"""The loop's usage step, after each history step of a queue it leads: write the ledger's
changed rows to the database, then let quotas and the breaker act on what changed.

A failure of any part (Redis, the database, a bug) is logged by class, once per kind,
and retried at the next step: the rows stay dirty in Redis until written, a hold stays
in force until a step lifts it, and the loop goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fairqueue.loop import RepeatedFailure
from fairqueue.usage.ledger import Written, write_usage

logger = logging.getLogger("fairqueue.usage")

#: Batches of rows one step writes at most (500 rows each).
STEP_BATCHES = 4


class UsageStep:
    """The usage step of one loop process (one per :class:`Rebalancer`)."""

    def __init__(self) -> None:
        self._write_failure = RepeatedFailure(logger, "usage ledger write")
        self._act_failure = RepeatedFailure(logger, "quotas and breaker")
        #: Called with each write's result (quotas, the breaker); tests add their own.
        self.consumers: list[Callable[[str, Written], None]] = []
        self._running: Callable[[], int] | None = None
        self._running_due: Callable[[], float] | None = None
        self._wire_defaults()

    def _wire_defaults(self) -> None:
        try:
            from fairqueue.usage.quotas import after_write as quotas_after_write
        except ImportError:  # pragma: no cover - quotas not installed in this build
            return
        self.consumers.append(quotas_after_write)
        from fairqueue.usage import account_quotas, quotas

        self.consumers.append(account_quotas.after_write)

        def check_running() -> int:  # tenants' quotas, then accounts'
            return quotas.check_running() + account_quotas.check_running()

        def due_in_s() -> float:
            return min(quotas.watch.due_in_s(), account_quotas.watch.due_in_s())

        self._running, self._running_due = check_running, due_in_s
        try:
            from fairqueue.usage.breaker import after_write as breaker_after_write
        except ImportError:  # pragma: no cover
            return
        self.consumers.append(breaker_after_write)

    def quota_due_in_s(self) -> float:
        """Seconds until a watched tenant's running attempts could take it over its
        quota (``inf``: none watched)."""
        return self._running_due() if self._running_due is not None else float("inf")

    def check_running(self) -> int:
        """The quota check between steps (:func:`fairqueue.usage.quotas.check_running`).
        Never raises: a failure is logged and the next step checks again."""
        if self._running is None:
            return 0
        try:
            return self._running()
        except Exception as exc:  # holds stay as they are; the next write checks again
            self._act_failure.failed(exc)
            return 0

    def run(self, queue: str) -> Written:
        """One step for ``queue``: write, then act. Never raises."""
        written = Written()
        try:
            for _ in range(STEP_BATCHES):
                step = write_usage(queue)
                written.rows += step.rows
                written.changes += step.changes
                if not step.more:
                    break
            self._write_failure.succeeded()
        except Exception as exc:  # the rows stay dirty in Redis: written next step
            self._write_failure.failed(exc)
        failed = False
        for consumer in self.consumers:  # each on its own: a quota failure spares the breaker
            try:
                consumer(queue, written)
            except Exception as exc:  # holds stay as they are until a step succeeds
                failed = True
                self._act_failure.failed(exc)
        if not failed:
            self._act_failure.succeeded()
        return written
