"""The audit trail of enqueues: which jobs get a ``PriorityOverrideAudit`` row, what it
holds, and writing it around the add (inserted before, settled after, in one
transaction with it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from fairqueue.broker import AddedJob
from fairqueue.conf import get_settings
from fairqueue.enqueue.priority import PriorityRule, ResolvedPriority
from fairqueue.exceptions import InvalidJobOptionError, InvalidPriorityError
from fairqueue.scheduling.levels import PriorityLevel, parse_level

#: The audit row's integer columns are 32-bit on PostgreSQL.
MAX_AUDITED_PRIORITY: Final = 2**31 - 1
MAX_AUDIT_TEXT_LENGTH: Final = 200


def _audit_text(argument: str, value: str) -> str:
    """``value`` as the audit row stores it, or a named error for text no database can
    store (PostgreSQL refuses NUL characters and unpaired surrogates)."""
    text = value[:MAX_AUDIT_TEXT_LENGTH]
    if "\x00" in text:
        raise InvalidJobOptionError(
            f"{argument} is not allowed: it contains a NUL character (\\x00), which the "
            "audit log cannot store"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidJobOptionError(
            f"{argument} is not allowed: it is not valid UTF-8 text (an unpaired surrogate)"
        ) from None
    return text


def audit_source(source: object) -> str:
    if source is None:
        return ""
    if not isinstance(source, str):
        raise InvalidJobOptionError(
            f"source of type {type(source).__name__} is not allowed: expected None or a string"
        )
    return _audit_text("source", source)


def actor_name(actor: object) -> str:
    if actor is None:
        return ""
    get_username = getattr(actor, "get_username", None)
    return _audit_text("actor", str(get_username() if callable(get_username) else actor))


def check_audited_priority(priority: object) -> None:
    if (
        isinstance(priority, int)
        and not isinstance(priority, bool)
        and priority > MAX_AUDITED_PRIORITY
    ):
        raise InvalidPriorityError(
            f"priority={priority!r} is not allowed: expected an integer in "
            f"0..{MAX_AUDITED_PRIORITY} (any value from 6 up means low)"
        )


def is_audited(resolved: ResolvedPriority, *, tenant_job: bool, override: bool) -> bool:
    """Which jobs get an audit row: ``priority_override=`` always (it overrides the
    tenant's plan for one request); an explicit ``priority_level=``
    / ``priority=`` on a tenant's job only with ``AUDIT_EXPLICIT_PRIORITY``: it is a code
    decision (the normal way to enqueue), and auditing it cost a database write per
    enqueue."""
    if override:
        return True
    explicit = resolved.rule in (PriorityRule.EXPLICIT_LEVEL, PriorityRule.EXPLICIT_PRIORITY)
    return explicit and tenant_job and get_settings().audit_explicit_priority


def audit_fields(
    job_type: str,
    queue: str,
    resolved: ResolvedPriority,
    *,
    priority: int | None,
    priority_level: str | PriorityLevel | None,
    priority_override: str | PriorityLevel | None,
    source: object,
    actor: object,
) -> dict[str, Any]:
    """The audit row of a call's jobs, as ``PriorityOverrideAudit`` takes it: what was
    asked, what was resolved and by which rule, and who asked."""
    return {
        "job_type": job_type,
        "queue": queue,
        "tenant_id": resolved.tenant_id or "",
        "requested_override": (
            parse_level(priority_override).value if priority_override is not None else ""
        ),
        "requested_level": (
            parse_level(priority_level).value if priority_level is not None else ""
        ),
        "requested_priority": priority,
        "resolved_level": resolved.level.value,
        "numeric_priority": resolved.numeric,
        "rule": resolved.rule.value,
        "source": audit_source(source),
        "actor": actor_name(actor),
    }


def insert_audits(entries: Sequence[tuple[str | None, dict[str, Any] | None]]) -> dict[int, Any]:
    """Insert the audit rows of ``entries`` (each a job's id, if the caller gave one, and
    its audit fields, or ``None``), before the add: index -> row. A row of a job without
    a caller's id gets its id once BullMQ has assigned it."""
    from fairqueue.models import PriorityOverrideAudit

    rows = {
        index: PriorityOverrideAudit(job_id=job_id or "", **audit)
        for index, (job_id, audit) in enumerate(entries)
        if audit is not None
    }
    if rows:
        PriorityOverrideAudit.objects.bulk_create(list(rows.values()))
    return rows


def settle_audits(rows: Mapping[int, Any], added: Sequence[AddedJob]) -> set[int]:
    """After the add: fill in BullMQ's ids, and drop the row of a job whose id already
    existed if that job has an audit row of its own (then this call added nothing). A
    job that exists without an audit row is the first attempt of a retried call (an
    ambiguous timeout), so its row stays. The indexes whose rows stay."""
    from fairqueue.models import PriorityOverrideAudit

    kept: set[int] = set()
    new_ids: list[Any] = []
    dropped: list[int] = []
    for index, row in rows.items():
        job = added[index]
        if job.priority is None:
            others = PriorityOverrideAudit.objects.filter(queue=row.queue, job_id=row.job_id)
            if others.exclude(pk=row.pk).exists():
                dropped.append(row.pk)
                continue
        elif not row.job_id:
            row.job_id = job.job_id
            new_ids.append(row)
        kept.add(index)
    if new_ids:
        PriorityOverrideAudit.objects.bulk_update(new_ids, ["job_id"])
    if dropped:
        # A queryset delete (the model's delete() refuses): a row of this transaction.
        PriorityOverrideAudit.objects.filter(pk__in=dropped).delete()
    return kept
