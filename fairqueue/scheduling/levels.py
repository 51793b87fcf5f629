"""Priority levels, their weights and the numeric priority formats fairqueue accepts.

The level is the source of truth for scheduling (docs/design.md, "Levels and priorities");
numbers are only an input format, kept because BullMQ users speak in numbers.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Final

from fairqueue.exceptions import (
    InvalidAccountError,
    InvalidPriorityError,
    InvalidPriorityLevelError,
    InvalidTenantError,
    InvalidTenantWeightError,
    ReservedTenantIdError,
)


class PriorityLevel(StrEnum):
    """The four scheduling levels, highest first."""

    CRITICAL = "critical"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


LEVELS_BY_RANK: Final[tuple[PriorityLevel, ...]] = (
    PriorityLevel.CRITICAL,
    PriorityLevel.HIGH,
    PriorityLevel.NORMAL,
    PriorityLevel.LOW,
)

#: Service share of each level when several are backlogged. Documented defaults, not
#: tuning knobs: dashboards and alerts assume 4:3:2:1.
DEFAULT_FAIR_WEIGHTS: Final = MappingProxyType(
    {
        PriorityLevel.CRITICAL: 4,
        PriorityLevel.HIGH: 3,
        PriorityLevel.NORMAL: 2,
        PriorityLevel.LOW: 1,
    }
)

JOB_PRIORITY_CRITICAL: Final = 1
JOB_PRIORITY_HIGH: Final = 3
JOB_PRIORITY_NORMAL: Final = 5
JOB_PRIORITY_LOW: Final = 10

NUMERIC_PRIORITY_BY_LEVEL: Final = MappingProxyType(
    {
        PriorityLevel.CRITICAL: JOB_PRIORITY_CRITICAL,
        PriorityLevel.HIGH: JOB_PRIORITY_HIGH,
        PriorityLevel.NORMAL: JOB_PRIORITY_NORMAL,
        PriorityLevel.LOW: JOB_PRIORITY_LOW,
    }
)

#: The tenant bucket of jobs enqueued without a tenant id.
DEFAULT_TENANT: Final = "default"
#: The tenant bucket of internal jobs (``tenant_id=None``, ``internal=True``; their
#: payload's ``tenantId`` is JSON ``null``): their flows, ledger rows and the like are
#: keyed by it. No tenant id may take it (:func:`validate_tenant_id` refuses it), so no
#: tenant shares them, and neither the breaker nor a quota holds it. The Lua scripts
#: spell it too (``lua/include/rerun_meta.lua``, ``lua/job_status.lua``).
INTERNAL_TENANT: Final = "(internal)"
#: The longest tenant id (a column of its own in the models, a string in Redis).
MAX_TENANT_ID_LENGTH: Final = 255

#: Per-tenant weights inside a level: a tenant of weight 3 gets 3 turns per round of a
#: level's round-robin against a weight-1 tenant. Bounded so that one tenant cannot
#: starve the others of its level, and never 0 (a tenant that is never served).
MIN_TENANT_WEIGHT: Final = 1
MAX_TENANT_WEIGHT: Final = 100
DEFAULT_TENANT_WEIGHT: Final = 1

#: Keys fairqueue merges into every job's data payload (named so that Node workers
#: and the rebalance pass read the same durable metadata).
PAYLOAD_TENANT_KEY: Final = "tenantId"
PAYLOAD_LEVEL_KEY: Final = "priorityLevel"
FAIRQUEUE_PAYLOAD_KEYS: Final = (PAYLOAD_TENANT_KEY, PAYLOAD_LEVEL_KEY)
#: Merged only into the jobs of a tenant that has an account, so the account travels
#: with the job as its tenant does. Not stripped from what handlers get: a payload of
#: a job without an account may hold that key as its own data, as it could before.
PAYLOAD_ACCOUNT_KEY: Final = "accountId"

#: How deeply a job payload may nest (dicts and lists inside the top-level dict). Deeper
#: payloads are refused with a named error instead of a raw ``RecursionError`` from the
#: JSON encoder (at ~1,000 levels) and are hard for any worker to handle anyway.
MAX_PAYLOAD_DEPTH: Final = 32


def is_strict_utf8(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8: no lone surrogate (``"\\ud800"``), which Python
    strings may hold but Redis, PostgreSQL, JSON readers and HTML pages cannot."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: The level names as an error message lists them.
LEVELS_QUOTED: Final = ", ".join(repr(level.value) for level in LEVELS_BY_RANK)


def normalize_priority(priority: int | None) -> PriorityLevel:
    """Map a numeric BullMQ-style priority onto a level.

    The table (docs/design.md, "Levels and priorities") keeps every ``JOB_PRIORITY_*``
    constant on its own level, with ``1 -> critical`` and ``2 -> high``::

        None, 0 -> normal   1 -> critical   2-3 -> high   4-5 -> normal   >= 6 -> low

    Mapping 3 to normal or 4-5 to low instead would put ``JOB_PRIORITY_HIGH`` and
    ``JOB_PRIORITY_NORMAL`` on the wrong level.

    Raises:
        InvalidPriorityError: (a ``ValueError``) for booleans, non-integers and
            negative numbers.
    """
    if priority is None:
        return PriorityLevel.NORMAL
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidPriorityError(
            f"priority={priority!r} is not allowed: expected a non-negative integer or None"
        )
    if priority < 0:
        raise InvalidPriorityError(
            f"priority={priority!r} is not allowed: expected a non-negative integer or None"
        )
    if priority == 0:
        return PriorityLevel.NORMAL
    if priority == 1:
        return PriorityLevel.CRITICAL
    if priority <= 3:
        return PriorityLevel.HIGH
    if priority <= 5:
        return PriorityLevel.NORMAL
    return PriorityLevel.LOW


def parse_level(value: object, *, argument: str = "priority_level") -> PriorityLevel:
    """Turn a level name (or a ``PriorityLevel``) into a ``PriorityLevel``.

    Raises:
        InvalidPriorityLevelError: (a ``ValueError``) naming ``argument``, the value
            and the allowed names.
    """
    if isinstance(value, PriorityLevel):
        return value
    if isinstance(value, str):
        try:
            return PriorityLevel(value.strip().lower())
        except ValueError:
            pass
    raise InvalidPriorityLevelError(
        f"{argument}={value!r} is not allowed: expected one of {LEVELS_QUOTED}"
    )


def validate_tenant_id(tenant_id: object, *, none_allowed: bool = True) -> str:
    """A tenant id is an opaque, non-empty string of at most 255 characters of valid
    UTF-8 text without NUL or a line feed: it is stored in Redis, in PostgreSQL (which
    refuses NUL) and shown on the dashboard, so a lone surrogate or a NUL would fail
    later, far from the caller; and fairqueue's Redis scripts join tenant ids (and a
    flow's level and tenant) with line feeds, so an id holding one could not be told
    apart. Messages never echo a string tenant id (only its length).

    ``none_allowed``: whether the caller takes ``None`` (an enqueue: an internal job), so
    the message says what the caller accepts."""
    expected = "None or a non-empty string" if none_allowed else "a non-empty string"
    if not isinstance(tenant_id, str) or not tenant_id or len(tenant_id) > MAX_TENANT_ID_LENGTH:
        shown = tenant_id if not isinstance(tenant_id, str) else f"<{len(tenant_id)} characters>"
        raise InvalidTenantError(
            f"tenant_id={shown!r} is not allowed: expected {expected} of at "
            f"most {MAX_TENANT_ID_LENGTH} characters"
        )
    if "\x00" in tenant_id or not is_strict_utf8(tenant_id):
        raise InvalidTenantError(
            f"tenant_id=<{len(tenant_id)} characters> is not allowed: expected valid UTF-8 "
            "text without NUL (it holds a lone surrogate or a NUL character)"
        )
    if "\n" in tenant_id:
        raise InvalidTenantError(
            f"tenant_id=<{len(tenant_id)} characters> is not allowed: a tenant id may not "
            "contain a line feed (\\n), which fairqueue's Redis scripts use as a separator"
        )
    if tenant_id == INTERNAL_TENANT:
        raise ReservedTenantIdError(
            f"tenant_id={INTERNAL_TENANT!r} is not allowed: it is the reserved key internal "
            "jobs are counted under (tenant_id=None or internal=True enqueues one)"
        )
    return tenant_id


def validate_account_id(account_id: object) -> str:
    """An account id follows a tenant id's rules (:func:`validate_tenant_id`), for the
    same reasons: stored in Redis and the database, joined with line feeds by the
    scripts, shown on the console. Messages never echo a string id (only its length)."""
    if not isinstance(account_id, str) or not account_id or len(account_id) > MAX_TENANT_ID_LENGTH:
        shown = account_id if not isinstance(account_id, str) else f"<{len(account_id)} characters>"
        raise InvalidAccountError(
            f"account_id={shown!r} is not allowed: expected None or a non-empty string of "
            f"at most {MAX_TENANT_ID_LENGTH} characters"
        )
    if "\x00" in account_id or "\n" in account_id or not is_strict_utf8(account_id):
        raise InvalidAccountError(
            f"account_id=<{len(account_id)} characters> is not allowed: expected valid UTF-8 "
            "text without NUL or a line feed (\\n, the scripts' separator)"
        )
    return account_id


def validate_tenant_weight(weight: object, *, argument: str = "tenant_weight") -> int:
    """A tenant weight is an integer in ``MIN_TENANT_WEIGHT..MAX_TENANT_WEIGHT``.

    Booleans are refused although they are ``int``s: ``tenant_weight=True`` is a bug,
    not a weight of 1.

    Raises:
        InvalidTenantWeightError: (a ``ValueError``) naming ``argument``, the value and
            the allowed range.
    """
    if (
        isinstance(weight, int)
        and not isinstance(weight, bool)
        and MIN_TENANT_WEIGHT <= weight <= MAX_TENANT_WEIGHT
    ):
        return weight
    raise InvalidTenantWeightError(
        f"{argument}={weight!r} is not allowed: expected an integer in "
        f"{MIN_TENANT_WEIGHT}..{MAX_TENANT_WEIGHT}"
    )
