"""Admission control and estimates at enqueue: ``max_wait_ms=`` refuses a job expected to
start later than that (:class:`~fairqueue.exceptions.ExpectedWaitTooLongError`, before
anything is written), ``estimate=True`` returns the estimate on the ``EnqueuedJob``; either keeps
the expected start in the job's opts (``fqEta``) for the estimate-error metric and the
calibration of later estimates and admissions.

Enqueues that ask for neither pay nothing: no read, no field. One that asks reads the
flow's place first (one read-only script call; a batch, two: its first and last job),
then adds as usual: the estimate is not atomic with the add, so concurrent enqueues may
have moved the line a little between the two.

The estimate counts everything that will run ahead of the job, on every path alike
(single, batch, delayed, durable, async, the tasks backend): the jobs waiting before its
place, the batch's own jobs before it, its flow's delayed jobs due by its own ready time
(a delayed job is placed when it is due, behind what its flow has by then), and its
flow's outbox rows not relayed yet (counted in the database, one COUNT). So a producer
cannot walk around ``max_wait_ms`` by delaying its jobs or writing them to the outbox.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence

from asgiref.sync import sync_to_async

from fairqueue.broker import get_sync_broker
from fairqueue.enqueue.calls import EnqueuedJob, Prepared
from fairqueue.enqueue.durable import outbox_ahead
from fairqueue.enqueue.start_estimates import MAX_ESTIMATE_COUNT, placed_estimate
from fairqueue.exceptions import (
    BrokerUnavailableError,
    ExpectedWaitTooLongError,
    InvalidJobOptionError,
)
from fairqueue.scheduling.estimate import StartEstimate

logger = logging.getLogger(__name__)

#: The largest ``max_wait_ms``: a day.
MAX_MAX_WAIT_MS = 86_400_000


def check_admission_options(estimate: object, max_wait_ms: object) -> None:
    """``estimate`` and ``max_wait_ms``, checked before anything is read or written."""
    if estimate is not True and estimate is not False:
        raise InvalidJobOptionError(
            f"estimate={estimate!r}"[:300] + " is not allowed: expected True or False"
        )
    if max_wait_ms is not None and (
        isinstance(max_wait_ms, bool)
        or not isinstance(max_wait_ms, int)
        or not 1 <= max_wait_ms <= MAX_MAX_WAIT_MS
    ):
        raise InvalidJobOptionError(
            f"max_wait_ms={max_wait_ms!r}"[:300]
            + f" is not allowed: expected None or a whole number of ms in 1..{MAX_MAX_WAIT_MS}"
        )


def refuse_if_too_long(estimate: StartEstimate, *, job_type: str, max_wait_ms: int | None) -> None:
    """Raise :class:`ExpectedWaitTooLongError` when the estimate's admission wait (the
    expected wait stretched to how late the level's recent estimates came out 9 times in
    10, ``admission_wait_ms``) is past ``max_wait_ms``. A job with no estimate (nothing
    measured yet, or its tenant paused) is admitted."""
    expected = estimate.expected_wait_ms
    wait = estimate.admission_wait_ms if estimate.admission_wait_ms is not None else expected
    if max_wait_ms is None or expected is None or wait is None or wait <= max_wait_ms:
        return
    raise ExpectedWaitTooLongError(
        job_type=job_type,
        level=estimate.level or "",
        expected_wait_ms=expected,
        max_wait_ms=max_wait_ms,
        retry_after_s=max(1, math.ceil((wait - max_wait_ms) / 1000)),
        share=estimate.share,
        admission_wait_ms=wait,
    )


async def estimates_for(
    prepared: Sequence[Prepared], call_count: int, extra: int = 0
) -> list[StartEstimate]:
    """Each job's estimate, behind ``extra`` jobs of its flow not on the clock yet (its
    outbox rows) and its delayed jobs due by its ready time: the first and the last of a
    batch read, those between interpolated (one flow's jobs are evenly spaced on its
    clock)."""
    item = prepared[0]
    job = item.new_job

    async def read(count: int) -> tuple[StartEstimate, int]:
        return await placed_estimate(
            item.queue, item.resolved, job.cost_ms, count, job.delay_ms, extra
        )

    last, last_at = await read(min(call_count, MAX_ESTIMATE_COUNT))
    if call_count == 1:
        return [last]
    first, first_at = await read(1)
    if last_at <= first_at:  # the two reads saw different backlogs (racing adds): no pace
        return [last] * call_count
    # one flow's jobs are evenly spaced on its clock: beyond the jobs placed, the same pace
    return [_between(first, last, index / (last_at - first_at)) for index in range(call_count)]


def _between(first: StartEstimate, last: StartEstimate, at: float) -> StartEstimate:
    """The estimate ``at`` of the way from ``first`` to ``last`` (past 1: beyond it)."""

    def mix(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else round(a + (b - a) * at)

    return dataclasses.replace(
        last,
        expected_wait_ms=mix(first.expected_wait_ms, last.expected_wait_ms),
        expected_start_ms=mix(first.expected_start_ms, last.expected_start_ms),
        earliest_start_ms=mix(first.earliest_start_ms, last.earliest_start_ms),
        latest_start_ms=mix(first.latest_start_ms, last.latest_start_ms),
        ahead=mix(first.ahead, last.ahead),
        admission_wait_ms=mix(first.admission_wait_ms, last.admission_wait_ms),
    )


def admit(
    prepared: list[Prepared],
    *,
    estimate: bool,
    max_wait_ms: int | None,
    durable: bool = False,
    using: str | None = None,
) -> tuple[list[Prepared], list[StartEstimate] | None]:
    """The jobs to add (with their expected start in their opts when asked) and their
    estimates, or :class:`ExpectedWaitTooLongError`. ``durable``: Redis may be down,
    which admits the jobs unestimated (the outbox's promise comes first). ``using``: the
    database of the outbox rows counted ahead (:func:`outbox_ahead`)."""
    check_admission_options(estimate, max_wait_ms)
    if not estimate and max_wait_ms is None:
        return prepared, None
    item = prepared[0]
    extra = outbox_ahead(item.queue, item.resolved, item.new_job.delay_ms, using)
    sync = get_sync_broker()
    try:
        estimates = sync.run(estimates_for, prepared, len(prepared), extra)
    except BrokerUnavailableError:
        if not durable:
            raise
        logger.warning("fairqueue: no estimate for a durable enqueue (Redis unavailable)")
        return prepared, None
    refuse_if_too_long(estimates[-1], job_type=prepared[0].job_type, max_wait_ms=max_wait_ms)
    if durable:
        return prepared, (estimates if estimate else None)
    # the expected start rides on every job estimated, asked or admitted: how those come
    # out calibrates the next admissions (calibration.admission_wait)
    return _with_eta(prepared, estimates), (estimates if estimate else None)


async def aadmit(
    prepared: list[Prepared], *, estimate: bool, max_wait_ms: int | None
) -> tuple[list[Prepared], list[StartEstimate] | None]:
    """:func:`admit` on the caller's event loop (async enqueues)."""
    item = prepared[0]
    extra = await sync_to_async(outbox_ahead)(item.queue, item.resolved, item.new_job.delay_ms)
    estimates = await estimates_for(prepared, len(prepared), extra)
    refuse_if_too_long(estimates[-1], job_type=prepared[0].job_type, max_wait_ms=max_wait_ms)
    return _with_eta(prepared, estimates), (estimates if estimate else None)


def _with_eta(prepared: list[Prepared], estimates: list[StartEstimate]) -> list[Prepared]:
    return [
        dataclasses.replace(
            item, new_job=dataclasses.replace(item.new_job, eta_ms=est.expected_start_ms)
        )
        for item, est in zip(prepared, estimates, strict=True)
    ]


def attach(results: list[EnqueuedJob], estimates: list[StartEstimate] | None) -> list[EnqueuedJob]:
    """The results with their estimates (when asked)."""
    if estimates is None:
        return results
    return [
        dataclasses.replace(job, estimate=est) for job, est in zip(results, estimates, strict=True)
    ]
