"""Pausing and resuming a tenant, and bringing its limits to Redis when its plan changes.

A pause stops a customer's work, so like a priority override it is audited (who, when:
``TenantPauseAudit``). Redis is changed first, then the row and the audit record are
written; if the database write fails the pause is undone, so an unaudited pause does not
stay in force.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from django.db import transaction

from fairqueue.broker import MAX_JOB_ID_LENGTH, AccountCopy, get_sync_broker
from fairqueue.conf import get_settings
from fairqueue.exceptions import BrokerError, UnknownAccountError
from fairqueue.scheduling.levels import (
    DEFAULT_TENANT_WEIGHT,
    validate_account_id,
    validate_tenant_id,
)
from fairqueue.scheduling.limits import NO_LIMITS, TenantLimits
from fairqueue.scheduling.wire import encoded_limits
from fairqueue.usage.holds import actor_text

logger = logging.getLogger("fairqueue.tenants")
T = TypeVar("T")


def _queues() -> list[str]:
    return sorted(set(get_settings().queues.values()))


def _in_every_queue(write: Callable[[Any, str], Coroutine[Any, Any, T]]) -> list[T]:
    """``write(limits, queue)`` in every configured queue, in turn."""
    sync_broker = get_sync_broker()
    return [sync_broker.run(write, sync_broker.broker.limits, queue) for queue in _queues()]


def _set_paused(tenant_id: str, paused: bool) -> int:
    return sum(_in_every_queue(lambda limits, queue: limits.set_paused(queue, tenant_id, paused)))


def _record(tenant_id: str, paused: bool, actor: object, source: str) -> None:
    from fairqueue.models import TenantPauseAudit, TenantPlan  # `import fairqueue` needs no apps

    with transaction.atomic():
        # An existing row shows the pause; none is created: a row would give an unknown
        # tenant a plan (free, by the classifier) and so change its jobs' level.
        plan = TenantPlan.objects.select_for_update().filter(tenant_id=tenant_id).first()
        if plan is not None and plan.paused != paused:
            plan.paused = paused
            plan.save(update_fields=["paused", "updated_at"])
        TenantPauseAudit.objects.create(
            tenant_id=tenant_id,
            action=TenantPauseAudit.PAUSED if paused else TenantPauseAudit.RESUMED,
            actor=actor_text(actor),
            source=str(source)[:200],
        )


def pause_tenant(tenant_id: str, *, actor: object = None, source: str = "") -> int:
    """Pause a tenant in every configured queue: none of its jobs starts once this
    returns (those no worker has taken yet go back to its held jobs, in their order);
    jobs already running finish. Its new jobs are held until :func:`resume_tenant`.

    Args:
        actor: who paused (a user, or a name), recorded in ``TenantPauseAudit``.
        source: where from (``"admin"``, ``"incident 42"``), recorded too.

    Returns:
        How many of its jobs were taken back from the takeable sets.

    Raises:
        InvalidTenantError: ``tenant_id`` is not a tenant id.
        BrokerError: Redis failed; the tenant may be paused in some queues only (call
            again: pausing twice is harmless), and nothing was audited.
    """
    tenant_id = validate_tenant_id(tenant_id, none_allowed=False)
    moved = _set_paused(tenant_id, True)
    try:
        _record(tenant_id, True, actor, source)
    except Exception:
        _set_paused(tenant_id, False)  # no pause without its audit record
        raise
    return moved


def _account_tenants(account_id: str) -> list[str]:
    from fairqueue.models import Account, TenantPlan

    if not Account.objects.filter(account_id=account_id).exists():
        raise UnknownAccountError(
            f"account_id={account_id!r} is not allowed: no Account has that id"
        )
    rows = TenantPlan.objects.filter(account_id=account_id).order_by("tenant_id")
    return list(rows.values_list("tenant_id", flat=True))


def _record_account(account_id: str, paused: bool, actor: object, source: str) -> list[str]:
    """The account's ``paused`` and one pause audit per tenant (its source naming the
    account), in one transaction; returns its tenants as of that transaction."""
    from fairqueue.models import Account, TenantPauseAudit, TenantPlan

    with transaction.atomic():
        account = Account.objects.select_for_update().get(account_id=account_id)
        if account.paused != paused:
            account.paused = paused
            account.save(update_fields=["paused", "updated_at"])
        tenants = list(
            TenantPlan.objects.filter(account_id=account_id)
            .order_by("tenant_id")
            .values_list("tenant_id", flat=True)
        )
        action = TenantPauseAudit.PAUSED if paused else TenantPauseAudit.RESUMED
        TenantPauseAudit.objects.bulk_create(
            TenantPauseAudit(
                tenant_id=tenant_id,
                action=action,
                actor=actor_text(actor),
                source=f"account {account_id}: {source}"[:200],
            )
            for tenant_id in tenants
        )
    return tenants


def pause_account(account_id: str, *, actor: object = None, source: str = "") -> int:
    """Pause every tenant of an account, as :func:`pause_tenant` pauses one: none of
    their jobs starts once this returns; a tenant that joins the account while it is
    paused is paused too, and resuming one of its tenants alone does not resume it
    (docs/limits.md#accounts). Audited on each tenant.

    Returns:
        How many of its tenants' jobs were taken back from the takeable sets.

    Raises:
        InvalidAccountError: not an account id. UnknownAccountError: no such account.
        BrokerError: Redis failed; its tenants may be paused in some queues only (call
            again), and nothing was audited.
    """
    account_id = validate_account_id(account_id)
    tenants = _account_tenants(account_id)
    moved = 0
    done: list[str] = []
    try:
        for tenant_id in tenants:
            moved += _set_paused(tenant_id, True)
            done.append(tenant_id)
        # a tenant that joined meanwhile: paused too (its plan's save saw no pause yet)
        for tenant_id in _record_account(account_id, True, actor, source):
            if tenant_id not in tenants:
                moved += _set_paused(tenant_id, True)
    except Exception:
        for tenant_id in done:  # no pause without its audit record
            _lift_pause(tenant_id)
        raise
    return moved


def resume_account(account_id: str, *, actor: object = None, source: str = "") -> int:
    """Resume a paused account: each of its tenants is resumed in the queues where
    nothing else holds it (its own pause, a quota, a breaker). Audited on each tenant.

    Returns:
        How many of its tenants' held jobs were released at once.

    Raises:
        InvalidAccountError, UnknownAccountError: as :func:`pause_account`.
        BrokerError: Redis failed; call again (resuming twice is harmless).
    """
    account_id = validate_account_id(account_id)
    _account_tenants(account_id)
    return sum(
        _lift_pause(tenant_id) for tenant_id in _record_account(account_id, False, actor, source)
    )


def _lift_pause(tenant_id: str) -> int:
    """Resume ``tenant_id`` in Redis in the queues where nothing holds it (an operator's
    pause, its account's, a quota or a breaker). Returns the jobs released."""
    from fairqueue.usage.holds import held_queues, paused_by_operator

    if paused_by_operator(tenant_id):
        return 0
    kept = held_queues(tenant_id)
    sync_broker = get_sync_broker()
    return sum(
        sync_broker.run(sync_broker.broker.limits.set_paused, queue, tenant_id, False)
        for queue in _queues()
        if queue not in kept
    )


def sync_tenant_pause(tenant_id: str) -> None:
    """After a tenant's row changed (it joined or left an account): pause it in Redis
    when its account is paused, hold it where its account's quota holds the account's
    tenants, resume it where Redis has it paused and nothing holds it any more. Best
    effort, like :func:`sync_tenant_limits`."""
    from fairqueue.usage.holds import held_queues, pause_in, paused_by_operator

    sync_broker = get_sync_broker()
    limits = sync_broker.broker.limits
    try:
        held = held_queues(tenant_id)
        if paused_by_operator(tenant_id):
            _set_paused(tenant_id, True)
        elif held:
            pause_in(sorted(held), tenant_id)
        elif any(sync_broker.run(limits.is_paused, queue, tenant_id) for queue in _queues()):
            _lift_pause(tenant_id)
    except BrokerError as exc:
        logger.warning("tenant pause not synced to Redis (%s)", type(exc).__name__)


def resume_tenant(tenant_id: str, *, actor: object = None, source: str = "") -> int:
    """Resume a paused tenant: its held jobs are released in their order, as far as its
    other limits allow (the rest as it gets room). Audited like :func:`pause_tenant`.

    Returns:
        How many of its jobs were released at once.

    Raises:
        InvalidTenantError: ``tenant_id`` is not a tenant id.
        BrokerError: Redis failed; call again (resuming twice is harmless).
    """
    tenant_id = validate_tenant_id(tenant_id, none_allowed=False)
    _record(tenant_id, False, actor, source)
    # a quota or breaker hold, or its account's pause, stays in force
    return _lift_pause(tenant_id)


def sync_tenant_limits(tenant_id: str) -> None:
    """Bring a tenant's limits to Redis in every queue after its row changed, so held
    jobs are released under the new limits at once (not at the tenant's next enqueue).
    Best effort: Redis down is logged, and the next enqueue writes them anyway."""
    from fairqueue.enqueue.lookups import with_tier_defaults
    from fairqueue.models import TenantPlan

    plan = TenantPlan.objects.filter(tenant_id=tenant_id).select_related("account").first()
    limits = (
        NO_LIMITS if plan is None else with_tier_defaults(plan.own_limits(), plan.resolve_plan())
    )
    try:
        _in_every_queue(lambda store, queue: store.set_limits(queue, tenant_id, limits))
        _in_every_queue(lambda store, queue: store.release(queue, [tenant_id]))
    except BrokerError as exc:
        logger.warning("tenant limits not synced to Redis (%s)", type(exc).__name__)


def sync_account_limits(account_id: str, limits: TenantLimits | None = None) -> None:
    """Bring an account's limits (``None``: its row's) to Redis in every queue after its
    row changed: one write per queue, whatever its number of tenants, and its tenants
    with held jobs are visited at the release step's next call. Best effort, like a
    tenant's: Redis down is logged, and its tenants' next enqueue writes them anyway."""
    from fairqueue.models import Account, TenantPlan

    if limits is None:
        account = Account.objects.filter(account_id=account_id).first()
        limits = NO_LIMITS if account is None else account.limits()
    tenants = list(
        TenantPlan.objects.filter(account_id=account_id).values_list("tenant_id", flat=True)
    )
    try:
        _in_every_queue(
            lambda store, queue: store.set_account_limits(queue, account_id, limits, tenants)
        )
    except BrokerError as exc:
        logger.warning("account limits not synced to Redis (%s)", type(exc).__name__)


def sync_tenant_weight(tenant_id: str) -> None:
    """Bring a tenant's weight to Redis in every queue after its row changed: each of its
    flows with work counts it at once, and so do their levels' totals, so its next jobs
    and the other tenants' are placed by the new weight, and its waiting jobs are placed
    again by it (paged: the rest at the loop's next ticks). Only while enqueues in this
    process look weights up in the database (``wire_tenant_plan_lookup()``): without that
    lookup every job is placed at weight 1 and the row's weight places nothing. Best
    effort: Redis down is logged, and its next enqueue counts the weight."""
    from fairqueue.enqueue.lookups import lookup_tenant_weight
    from fairqueue.enqueue.priority import get_tenant_weight_lookup
    from fairqueue.models import TenantPlan

    if get_tenant_weight_lookup() is not lookup_tenant_weight:
        return

    plan = TenantPlan.objects.filter(tenant_id=tenant_id).only("weight").first()
    weight = DEFAULT_TENANT_WEIGHT if plan is None else plan.weight
    try:
        _in_every_queue(lambda store, queue: store.set_weight(queue, tenant_id, weight))
    except BrokerError as exc:
        logger.warning("tenant weight not synced to Redis (%s)", type(exc).__name__)


def database_limits(accounts: AccountCopy | None = None) -> tuple[dict[str, str], set[str]]:
    """Every tenant's limits (encoded as Redis keeps them, tier defaults filled in; empty
    ones for a tenant of one of ``accounts``, held like a limited tenant) and the paused
    tenants, as the database says: a ``TenantPlan``'s ``paused`` or its account's, and for
    a tenant paused without a row (``pause_tenant`` creates none), its latest
    ``TenantPauseAudit`` record."""
    from django.db.models import Max, Q

    from fairqueue.enqueue.lookups import with_tier_defaults
    from fairqueue.models import TenantPauseAudit, TenantPlan

    plans = TenantPlan.objects.select_related("account")
    of_accounts = accounts if accounts is not None else database_account_limits()
    if not get_settings().tenant_limits:  # no tier defaults: rows without limits have none
        plans = plans.filter(
            Q(max_active__isnull=False)
            | Q(rate_max__isnull=False)
            | Q(max_waiting__isnull=False)
            | Q(paused=True)
            | Q(account__paused=True)
            | Q(account__account_id__in=list(of_accounts.limits))
        )
    limits: dict[str, str] = {}
    paused: set[str] = set()
    for plan in plans.iterator(chunk_size=2_000):
        own = plan.own_limits()
        merged = with_tier_defaults(own, plan.resolve_plan())
        if merged.holds or plan.tenant_id in of_accounts.tenants:
            # a tenant of an account with limits is held, maybe with none of its own, as
            # its adds make it (enqueue.calls)
            limits[plan.tenant_id] = encoded_limits(merged)
        if plan.paused or plan.account_paused:
            paused.add(plan.tenant_id)
    rowless = TenantPauseAudit.objects.exclude(tenant_id__in=TenantPlan.objects.values("tenant_id"))
    latest = rowless.values("tenant_id").annotate(last=Max("id")).values("last")
    paused.update(
        TenantPauseAudit.objects.filter(id__in=latest, action=TenantPauseAudit.PAUSED).values_list(
            "tenant_id", flat=True
        )
    )
    return limits, paused


def database_account_limits() -> AccountCopy:
    """The accounts with limits (encoded as Redis keeps them) and their tenants, as the
    database says: what a rebuild brings back beside the tenants' own."""
    from fairqueue.models import Account, TenantPlan

    limits: dict[str, str] = {}
    for account in Account.objects.iterator(chunk_size=2_000):
        if account.limits().holds:
            limits[account.account_id] = encoded_limits(account.limits())
    rows = TenantPlan.objects.filter(account__account_id__in=list(limits))
    tenants = dict(rows.values_list("tenant_id", "account__account_id").iterator(chunk_size=2_000))
    return AccountCopy(limits, tenants)


def rebuild_tenant_limits(queues: Sequence[str] | None = None, *, force: bool = True) -> bool:
    """Rebuild Redis's copy of the tenants' and accounts' limits and pauses from the
    database, in ``queues`` (default: every configured queue). ``force=False``: only in the queues
    where the copy is missing (Redis lost fairqueue's keys: a restart without
    persistence, a new server, a flush), which one ``EXISTS`` per queue tells: what the
    loop checks at every pass. Returns whether it rebuilt anything."""
    sync_broker = get_sync_broker()
    store = sync_broker.broker.limits
    wanted = [
        queue
        for queue in (queues if queues is not None else _queues())
        if force or not sync_broker.run(store.synced, queue)
    ]
    if not wanted:
        return False
    # Redis's copy first, then the database: a tenant's limits or pause changed between
    # the two reads (an add, a saved plan, pause_tenant, resume_tenant) are newer than the
    # rows and are kept.
    before = {queue: sync_broker.run(store.read_copy, queue) for queue in wanted}
    accounts = database_account_limits()
    limits, paused = database_limits(accounts)
    from fairqueue.usage.holds import holds_by_queue  # quota and breaker holds, per queue

    held = holds_by_queue()
    for queue in wanted:
        queue_paused = paused | held.get(queue, set())
        sync_broker.run(store.rebuild, queue, limits, queue_paused, before[queue], accounts)
    logger.info("tenant limits and pauses rebuilt from the database in %d queue(s)", len(wanted))
    return True


#: Queues whose last rebuild failed in this process: a failure is logged when it starts
#: and when it ends, not at every pass in between (a loop passes several times a second).
_REBUILD_FAILING: set[str] = set()


def keep_tenant_limits(queue: str, *, force: bool = False) -> bool:
    """:func:`rebuild_tenant_limits` for one queue, for the loop and the Celery pass: a
    failure (Redis or the database down) is logged by class once, and tried again next
    pass. Returns whether Redis's copy is known to be in place."""
    try:
        rebuild_tenant_limits([queue], force=force)
    except Exception as exc:  # the pass goes on; the next one checks again
        if queue not in _REBUILD_FAILING:
            _REBUILD_FAILING.add(queue)
            logger.warning(
                "tenant limits not rebuilt (%s); trying again at every pass",
                type(exc).__name__,
            )
        return False
    if queue in _REBUILD_FAILING:
        _REBUILD_FAILING.discard(queue)
        logger.warning("tenant limits rebuilt again after failing")
    return True


def retry_failed(job_type: str, tenant_id: str | None = None, *, limit: int = 10_000) -> int:
    """Retry failed jobs of ``job_type`` (of ``tenant_id`` only, unless ``None``), oldest
    failure first, at most ``limit``: each as a fair turn of its flow (never at the front
    of the queue, where BullMQ's own ``retryJobs`` / ``job.retry()`` put it) and inside
    its tenant's limits: a limited or paused tenant's jobs are held and released as its
    limits allow. Its attempts made are kept, as BullMQ's retry keeps them.

    Returns:
        How many jobs were retried.

    Raises:
        UnknownJobTypeError: ``job_type`` is not configured.
        InvalidTenantError: ``tenant_id`` is not a tenant id.
        ValueError: ``limit`` is not a whole number in 1..1,000,000.
        BrokerError: Redis failed; the jobs retried so far stay retried.
    """
    settings = get_settings()
    queue = settings.queue_for(job_type)
    if tenant_id is not None:
        tenant_id = validate_tenant_id(tenant_id, none_allowed=True)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000:
        raise ValueError(f"limit={limit!r} is not allowed: expected a whole number in 1..1000000")
    sync_broker = get_sync_broker()
    retried, _held = sync_broker.run(
        sync_broker.broker.limits.retry_failed,
        queue,
        tenant_id,
        limit=limit,
        max_wait_ms=settings.max_wait_ms,
        max_payload_bytes=settings.max_payload_bytes,
    )
    return retried


def retry_failed_job(job_type: str, job_id: str) -> bool:
    """Retry one failed job of ``job_type`` as :func:`retry_failed` retries its tenant's:
    a fair turn of its flow inside its tenant's limits (held while its tenant is paused or
    at its limit), its attempts made kept. A job that is not failed is left as it is.

    Returns:
        Whether the job was retried (``False``: it is not in BullMQ's failed set).

    Raises:
        UnknownJobTypeError: ``job_type`` is not configured.
        ValueError: ``job_id`` is not a BullMQ job id.
        BrokerError: Redis failed.
    """
    settings = get_settings()
    queue = settings.queue_for(job_type)
    if not isinstance(job_id, str) or not 0 < len(job_id) <= MAX_JOB_ID_LENGTH or ":" in job_id:
        raise ValueError(
            f"job_id={job_id!r} is not allowed: expected a BullMQ job id (1..{MAX_JOB_ID_LENGTH} "
            "characters, no ':')"
        )
    sync_broker = get_sync_broker()
    retried, _held = sync_broker.run(
        sync_broker.broker.limits.retry_failed,
        queue,
        None,
        limit=1,
        max_wait_ms=settings.max_wait_ms,
        max_payload_bytes=settings.max_payload_bytes,
        job_id=job_id,
    )
    return retried == 1
