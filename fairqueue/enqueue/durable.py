"""The durable path: an enqueue written to the outbox in the caller's transaction (with
its audit rows), relayed to Redis after commit (:mod:`fairqueue.enqueue.outbox`), so the
job exists if and only if the transaction commits.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction
from django.db.models import Q

from fairqueue.broker import get_sync_broker
from fairqueue.enqueue.calls import EnqueuedJob, Prepared, result
from fairqueue.enqueue.priority import ResolvedPriority
from fairqueue.exceptions import AccountBacklogFullError, TenantBacklogFullError
from fairqueue.metrics import record_limited
from fairqueue.scheduling.hierarchy import ACCOUNT_MARK
from fairqueue.scheduling.limits import REASON_MAX_WAITING


def check_backlog(prepared: Sequence[Prepared], using: str | None, *, outbox: bool = True) -> None:
    """Refuse an enqueue that would put more than its tenant's ``max_waiting`` jobs
    waiting: those in Redis (held or takeable) plus, for a durable one, its outbox rows
    not relayed yet. The add script checks again when the jobs reach Redis (atomically;
    an outbox row it refuses stays in the outbox and is tried again), so this check only
    needs to be close."""
    from fairqueue.models import OutboxJob

    item = prepared[0]
    _check_account_backlog(prepared, using, outbox=outbox)
    limits = item.limits
    if limits is None or limits.max_waiting is None:
        return
    tenant = item.new_job.tenant
    sync_broker = get_sync_broker()
    waiting = sync_broker.run(sync_broker.broker.limits.waiting, item.queue, tenant)
    if outbox:
        waiting += OutboxJob.objects.using(using).filter(queue=item.queue, tenant=tenant).count()
    if waiting + len(prepared) > limits.max_waiting:
        record_limited(item.job_type, REASON_MAX_WAITING)
        raise TenantBacklogFullError(
            tenant_id=tenant, queue=item.queue, limit=limits.max_waiting, waiting=waiting
        )


def _check_account_backlog(
    prepared: Sequence[Prepared], using: str | None, *, outbox: bool
) -> None:
    """:func:`check_backlog` for the call's account's ``max_waiting``: its tenants' jobs
    waiting in Redis plus their outbox rows."""
    from fairqueue.models import OutboxJob, TenantPlan

    item = prepared[0]
    account = item.new_job.account
    limits = item.account_limits
    if account is None or limits is None or limits.max_waiting is None:
        return
    sync_broker = get_sync_broker()
    waiting = sync_broker.run(sync_broker.broker.limits.waiting, item.queue, ACCOUNT_MARK + account)
    if outbox:
        tenants = TenantPlan.objects.using(using).filter(account_id=account)
        waiting += (
            OutboxJob.objects.using(using)
            .filter(queue=item.queue, tenant__in=tenants.values("tenant_id"))
            .count()
        )
    if waiting + len(prepared) > limits.max_waiting:
        record_limited(item.job_type, REASON_MAX_WAITING)
        raise AccountBacklogFullError(
            account_id=account, queue=item.queue, limit=limits.max_waiting, waiting=waiting
        )


def outbox_ahead(
    queue: str, resolved: ResolvedPriority, delay_ms: int | None, using: str | None = None
) -> int:
    """The flow's outbox rows not relayed yet that its next job would start behind: the
    relay adds them in their order, each a turn of the flow, like jobs already waiting.
    Rows delayed longer than ``delay_ms`` are due after it and do not count (a row's
    delay counts from its write, which for rows still waiting was moments ago). Counted
    on database ``using`` in the caller's own connection, so a transaction sees its own
    rows (``enqueue_on_commit`` in a loop). Admission counts them on every path, so the
    same state gets the same answer whichever way a job comes in."""
    from fairqueue.models import OutboxJob

    rows = OutboxJob.objects.using(using).filter(
        queue=queue, tenant=resolved.tenant_bucket, level=resolved.level.value
    )
    rows = rows.filter(Q(delay_ms__isnull=True) | Q(delay_ms__lte=delay_ms or 0))
    return rows.count()


def enqueue_durable(prepared: Sequence[Prepared], using: str | None) -> list[EnqueuedJob]:
    """Write outbox rows and their audit rows in the caller's transaction (one of our
    own if none is open); after commit, try to relay them at once."""
    from fairqueue.enqueue.outbox import relay_after_commit
    from fairqueue.models import OutboxJob, PriorityOverrideAudit, new_outbox_job_id

    check_backlog(prepared, using)
    with transaction.atomic(using=using):
        rows = OutboxJob.objects.using(using).bulk_create(
            [
                OutboxJob(
                    job_type=item.job_type,
                    queue=item.queue,
                    job_id=item.new_job.job_id or new_outbox_job_id(),
                    data=item.new_job.data_json,
                    level=item.new_job.level.value,
                    tenant=item.new_job.tenant,
                    tenant_weight=item.new_job.tenant_weight,
                    delay_ms=item.new_job.delay_ms,
                    attempts=item.new_job.attempts,
                    backoff=item.new_job.backoff,
                    cost_ms=item.new_job.cost_ms,
                )
                for item in prepared
            ]
        )
        audits = [
            PriorityOverrideAudit(job_id=row.bullmq_job_id, **item.audit)
            for item, row in zip(prepared, rows, strict=True)
            if item.audit is not None
        ]
        if audits:
            PriorityOverrideAudit.objects.using(using).bulk_create(audits)
    pks = [row.pk for row in rows]
    transaction.on_commit(lambda: relay_after_commit(pks, using=using), using=using)
    return [
        result(item, row.bullmq_job_id, None, item.audit is not None, durable=True)
        for item, row in zip(prepared, rows, strict=True)
    ]
