"""When a new job would start (``estimate_start``), and the estimate admission control
checks an enqueue against (``placed_estimate``): one read-only Redis script, the
arithmetic in :func:`.status.estimate_from`."""

from __future__ import annotations

from typing import Final, Unpack

from asgiref.sync import sync_to_async

from fairqueue.broker import get_sync_broker
from fairqueue.enqueue.calls import resolve_call
from fairqueue.enqueue.durable import outbox_ahead
from fairqueue.enqueue.options import EnqueueOptions, check_keywords
from fairqueue.enqueue.priority import ResolvedPriority
from fairqueue.enqueue.status import estimate_from, status_reader
from fairqueue.exceptions import InvalidJobOptionError
from fairqueue.scheduling.estimate import StartEstimate

#: The most jobs one ``estimate_start`` call places (the script places them one after the
#: other: about a microsecond each); a longer batch's last job is extrapolated.
MAX_ESTIMATE_COUNT: Final = 10_000


def check_count(count: object) -> int:
    if (
        isinstance(count, bool)
        or not isinstance(count, int)
        or not 1 <= count <= MAX_ESTIMATE_COUNT
    ):
        raise InvalidJobOptionError(
            f"count={count!r}"[:300]
            + f" is not allowed: expected a whole number in 1..{MAX_ESTIMATE_COUNT}"
        )
    return count


async def placed_estimate(
    queue: str,
    resolved: ResolvedPriority,
    cost_ms: int | None,
    count: int = 1,
    delay_ms: int | None = None,
    extra: int = 0,
) -> tuple[StartEstimate, int]:
    """The estimate for the ``count``-th new job of a resolved call, behind what will
    run ahead of it without being on the fair clock yet: its flow's delayed jobs due by
    its own ready time and ``extra`` jobs (outbox rows not relayed:
    :func:`~fairqueue.enqueue.durable.outbox_ahead`); and the place in its flow of the
    job estimated."""
    placed_in = None
    if resolved.account_id is not None:
        placed_in = (resolved.account_id, int(resolved.account_weight))
    raw = await status_reader().estimate(
        queue,
        level=resolved.level,
        tenant=resolved.tenant_bucket,
        tenant_weight=resolved.tenant_weight,
        cost_ms=cost_ms,
        count=count,
        delay_ms=delay_ms,
        extra=extra,
        account=placed_in,
    )
    account = None
    if placed_in is not None:
        account = (placed_in[0], float(placed_in[1]))
    estimate = estimate_from(
        raw, delay_ms=delay_ms, tenant=resolved.tenant_bucket, count=raw.placed, account=account
    )
    return estimate, raw.placed


def estimate_start(
    job_type: str, *, count: int = 1, **options: Unpack[EnqueueOptions]
) -> StartEstimate:
    """When a job enqueued now with these options (those of :func:`enqueue_job`) is
    expected to start: where the fair clock would place it, the jobs before it, the
    measured service rate and the limits that hold its tenant. Writes nothing.
    ``count``: the last of that many jobs (an ``enqueue_jobs`` batch).

    Raises:
        the input errors of :func:`enqueue_job`; BrokerError: Redis trouble.
    """
    check_keywords("estimate_start", options, ("count",))
    count = check_count(count)
    call = resolve_call(job_type, **options)
    delay_ms = options.get("delay_ms")
    extra = outbox_ahead(call.queue, call.resolved, delay_ms)
    sync = get_sync_broker()
    args = (call.queue, call.resolved, call.cost_ms, count, delay_ms, extra)
    return sync.run(placed_estimate, *args)[0]


async def aestimate_start(
    job_type: str, *, count: int = 1, **options: Unpack[EnqueueOptions]
) -> StartEstimate:
    """:func:`estimate_start` for async views."""
    check_keywords("aestimate_start", options, ("count",))
    count = check_count(count)
    call = await sync_to_async(resolve_call)(job_type, **options)
    delay_ms = options.get("delay_ms")
    extra = await sync_to_async(outbox_ahead)(call.queue, call.resolved, delay_ms)
    args = (call.queue, call.resolved, call.cost_ms, count, delay_ms, extra)
    return (await placed_estimate(*args))[0]
