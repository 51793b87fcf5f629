"""The encoded shapes fairqueue's Python and its Lua scripts share, in one place.

Their Lua half is ``broker/lua/include/wire.lua``, function for function; the unit tests
run both on the same values (``tests/unit/test_wire.py``). Nothing else builds or splits
these strings: the rest of the package speaks ``(level, tenant)`` and
:class:`~fairqueue.scheduling.limits.TenantLimits`. A line feed separates the parts, which
is why a tenant id may not hold one (:func:`~fairqueue.scheduling.levels.validate_tenant_id`).

Plain strings in and out (no Django, no Redis), so the scheduling model, which keys its
state by flow as the scripts do, uses it too.
"""

from __future__ import annotations

from typing import Final

from fairqueue.scheduling.limits import LIMIT_FIELDS, TenantLimits

SEPARATOR: Final = "\n"

#: An add's per-job arguments, in the order ``wire.lua``'s ``fqReadJobs`` reads them.
ADD_JOB_FIELDS: Final = (
    "packed",
    "data",
    "opts",
    "level",
    "tenant",
    "weight",
    "cost",
    "account",
    "account_weight",
)


def flow_member(level: str, tenant: str) -> str:
    """A flow, ``(level, tenant)``, as a hash field or a set member (``fqFlowMember``)."""
    return f"{level}{SEPARATOR}{tenant}"


def flow_prefix(level: str) -> str:
    """What every flow member of ``level`` starts with (``fqFlowPrefix``)."""
    return f"{level}{SEPARATOR}"


def split_flow_member(member: str) -> tuple[str, str] | None:
    """``(level, tenant)`` of a flow member; ``None`` for a string that is not one."""
    level, sep, tenant = member.partition(SEPARATOR)
    return (level, tenant) if sep else None


def account_member(level: str, account: str) -> str:
    """An account's fields among a level's flows (``fqAccountMember``): no flow member is
    one, as no tenant id is empty or holds a line feed."""
    return f"{level}{SEPARATOR}{SEPARATOR}{account}"


def account_meta(account: str, weight: int) -> str:
    """A job's account and the account's weight, as its opts keep them (``fqAcct``) and
    its held meta ends with them (``fqAccountMeta``)."""
    return f"{weight}{SEPARATOR}{account}"


def split_account_meta(meta: str) -> tuple[str, int] | None:
    """``(account, weight)`` of :func:`account_meta`'s string; ``None``: not one."""
    weight, sep, account = meta.partition(SEPARATOR)
    return (account, int(weight)) if sep and account and weight.isdigit() else None


def held_meta(
    level: str, weight: int, cost_ms: float | None = None, account: str | None = None
) -> str:
    """A held job's meta, what it is placed with when released (``fqHeldMeta``);
    ``account``: :func:`account_meta`'s string, for a job of an account."""
    parts = (level, str(weight), "" if cost_ms is None else f"{cost_ms:g}")
    return SEPARATOR.join(parts if account is None else (*parts, account))


def split_held_meta(meta: str) -> tuple[str, int, float | None, tuple[str, int] | None] | None:
    """``(level, weight, cost_ms, (account, account weight) or None)`` of
    :func:`held_meta`'s string; ``None``: not one."""
    parts = meta.split(SEPARATOR, 3)
    if len(parts) < 3 or not parts[1].isdigit():
        return None
    account = split_account_meta(parts[3]) if len(parts) == 4 else None
    if len(parts) == 4 and account is None:
        return None
    return parts[0], int(parts[1]), float(parts[2]) if parts[2] else None, account


def delayed_meta(level: str, weight: int, tenant: str) -> str:
    """A delayed job's meta in its opts (``fqMeta``), read when the pass places it."""
    return SEPARATOR.join((level, str(weight), tenant))


def split_delayed_meta(meta: str) -> tuple[str, int, str] | None:
    """``(level, weight, tenant)`` of :func:`delayed_meta`'s string; ``None``: not one."""
    level, sep, rest = meta.partition(SEPARATOR)
    weight, sep2, tenant = rest.partition(SEPARATOR)
    return (level, int(weight), tenant) if sep and sep2 and weight.isdigit() else None


def encoded_limits(limits: TenantLimits) -> str:
    """The form the scripts read (``fqSplitLimits``): the ``LIMIT_FIELDS`` in order, one a
    line, empty for no limit (pause is kept apart: it is set by ``pause_tenant``, never
    by an enqueue's possibly stale cache)."""
    values = (getattr(limits, name) for name in LIMIT_FIELDS)
    return SEPARATOR.join("" if value is None else str(value) for value in values)


def add_encoded_limits(limits: TenantLimits) -> str:
    """What an add sends: :func:`encoded_limits`, plus ``"\\np"`` when the lookup says the
    tenant is paused. The add script drops the mark; it pauses the tenant only while Redis
    has not had the database's copy rebuilt (after it lost fairqueue's keys), so a pause
    Redis forgot still holds the job (``tenant_limits.lua``)."""
    return encoded_limits(limits) + (f"{SEPARATOR}p" if limits.paused else "")


def decoded_limits(encoded: str | None, *, paused: bool = False) -> TenantLimits:
    """The limits :func:`encoded_limits` wrote (``None`` or ``""``: none), with ``paused``
    as Redis keeps it apart."""
    fields = [int(part) if part else None for part in (encoded or "").split(SEPARATOR)]
    return TenantLimits(**dict(zip(LIMIT_FIELDS, fields, strict=False)), paused=paused)
