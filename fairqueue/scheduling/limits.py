"""Per-tenant and per-account limits: what they are and how many of a tenant's held jobs
may go now.

Limits decide *whether* a tenant's next job may be taken; the fair clock decides *which*
job is next among those that may. Plain data in, plain data out (no Django, no Redis):
``release_held.lua`` makes the same decision inside Redis, and the tests hold the two
together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final, NamedTuple

from fairqueue.exceptions import InvalidTenantLimitError


class LimitField(NamedTuple):
    """One limit's allowed values (inclusive; ``None`` means no limit) and its words on
    the console (``""``: shown with another, as the rate's window with its count)."""

    low: int
    high: int
    label: str


#: Every per-tenant limit, in the order of the encoded form: the one declaration the
#: model's checks, the admin, the console's form and pages and the wire read.
LIMITS: Final[Mapping[str, LimitField]] = {
    "max_active": LimitField(1, 1_000_000, "at once"),
    "rate_max": LimitField(1, 1_000_000, "rate"),
    "rate_duration_ms": LimitField(1, 86_400_000, ""),
    "max_waiting": LimitField(1, 100_000_000, "waiting at most"),
}
LIMIT_RANGES: Final[Mapping[str, tuple[int, int]]] = {
    name: (field.low, field.high) for name, field in LIMITS.items()
}
LIMIT_FIELDS: Final = tuple(LIMITS)

#: Why a tenant's job is held (the ``reason`` label of ``queue_fair_limited_total``).
REASON_MAX_ACTIVE: Final = "max_active"
REASON_RATE: Final = "rate"
REASON_PAUSED: Final = "paused"
REASON_MAX_WAITING: Final = "max_waiting"
REASONS: Final = (REASON_MAX_ACTIVE, REASON_RATE, REASON_PAUSED, REASON_MAX_WAITING)
#: A resumed tenant's jobs takeable at once while its held backlog drains and other jobs
#: wait: its backlog takes the slots the other tenants leave instead of standing ahead of
#: their arrivals (with nothing else waiting it drains at the workers' pace).
CATCHUP_AHEAD: Final = 4
#: A limited tenant's released jobs no worker has taken yet, at most: the release step
#: and a limited add check its released jobs one by one, so their number must stay small
#: whatever its backlog (the loop refills every 20 ms: 10,000 jobs a second and more).
TAKEABLE_CAP: Final = 200


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's limits in one queue (``None``: no limit of that kind).

    ``max_active`` bounds its jobs running or takeable at once, ``rate_max`` per
    ``rate_duration_ms`` its jobs started (BullMQ's ``limiter: {max, duration}``),
    ``max_waiting`` its jobs waiting (an enqueue beyond it is refused).
    """

    max_active: int | None = None
    rate_max: int | None = None
    rate_duration_ms: int | None = None
    max_waiting: int | None = None
    paused: bool = False

    @property
    def holds(self) -> bool:
        """Whether the tenant's jobs go through the held state (any limit but
        ``max_waiting`` alone needs it; ``max_waiting`` needs the count it keeps)."""
        return (
            self.max_active is not None
            or self.rate_max is not None
            or self.max_waiting is not None
            or self.paused
        )

    def over(self, defaults: TenantLimits) -> TenantLimits:
        """These limits with ``defaults`` (the plan tier's) filling the fields left
        empty: a tenant's own value wins. A rate limit is taken whole, never one half
        from each."""
        merged = self
        if self.max_active is None:
            merged = replace(merged, max_active=defaults.max_active)
        if self.rate_max is None:
            merged = replace(
                merged, rate_max=defaults.rate_max, rate_duration_ms=defaults.rate_duration_ms
            )
        if self.max_waiting is None:
            merged = replace(merged, max_waiting=defaults.max_waiting)
        return replace(merged, paused=self.paused or defaults.paused)


NO_LIMITS: Final = TenantLimits()


def validate_limit(name: str, value: object, *, where: str) -> int | None:
    """``value`` as limit ``name``, or :class:`InvalidTenantLimitError` naming ``where``
    (the setting or field), the value and the allowed range. Booleans are refused: a
    ``max_active=True`` is a bug, not 1."""
    if value is None:
        return None
    low, high = LIMIT_RANGES[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidTenantLimitError(
            f"{where}={value!r} is not allowed: expected a whole number in {low}..{high} "
            "or None for no limit"
        )
    return value


def parse_limits(values: Mapping[str, object], *, where: str) -> TenantLimits:
    """A mapping of limit names to values (a ``TENANT_LIMITS`` entry) as
    :class:`TenantLimits`; unknown names and half a rate limit are refused."""
    if not isinstance(values, Mapping):
        raise InvalidTenantLimitError(
            f"{where}={values!r} is not allowed: expected a dict of {', '.join(LIMIT_FIELDS)}"
        )
    unknown = sorted(str(key) for key in values if key not in LIMIT_RANGES)
    if unknown:
        raise InvalidTenantLimitError(
            f"{where} has unknown key {unknown[0]!r}: allowed keys are {', '.join(LIMIT_FIELDS)}"
        )
    parsed = {
        name: validate_limit(name, values.get(name), where=f"{where}[{name!r}]")
        for name in LIMIT_FIELDS
    }
    if (parsed["rate_max"] is None) != (parsed["rate_duration_ms"] is None):
        raise InvalidTenantLimitError(
            f"{where} sets only one of rate_max and rate_duration_ms: a rate limit needs "
            "both (rate_max jobs started per rate_duration_ms)"
        )
    return TenantLimits(**parsed, paused=False)


@dataclass(frozen=True, slots=True)
class Release:
    """How many held jobs may go now, and which limit keeps the rest (``None``: none
    is kept, or nothing is held)."""

    count: int
    reason: str | None


def rate_burst(limits: TenantLimits) -> int:
    """The pacing bucket's size for a rate limit: a tenant limited to N per duration gets
    its jobs at N/duration in small steps (at most a tenth of N, at least 2, at once)
    rather than N at the start of each window, so any 10 windows hold about 10 N starts
    whatever their phase; the release log still caps every window at N."""
    return max(2, math.ceil((limits.rate_max or 0) / 10))


@dataclass(frozen=True, slots=True)
class AccountRoom:
    """An account's limits and state, as :func:`release_room` weighs them for each of its
    tenants: its tenants' released jobs not finished (``occupied``), started in its rate
    window, no worker has taken yet (``takeable``, ``untaken_before_window``) and its
    pacing bucket's ``tokens``, all counted over all its tenants together."""

    limits: TenantLimits
    occupied: int = 0
    started_in_window: int = 0
    tokens: float | None = None
    takeable: int = 0
    untaken_before_window: int = 0
    #: Its other tenants waiting for its slots before this one (its max_active's): the
    #: slots free now are theirs first, in their order.
    waiting_ahead: int = 0


def _limit_room(
    limits: TenantLimits,
    count: int,
    *,
    occupied: int,
    started_in_window: int,
    tokens: float | None,
    takeable: int,
    untaken_before_window: int,
) -> tuple[int, str | None]:
    """``count`` cut to what max_active and rate allow, and the reason of the cut."""
    reason = None
    if limits.max_active is not None:
        room = max(0, limits.max_active - occupied)
        if room < count:
            count, reason = room, REASON_MAX_ACTIVE
    if limits.rate_max is not None:
        burst = rate_burst(limits)
        paced = math.floor(burst if tokens is None else min(burst, tokens))
        started = started_in_window + untaken_before_window
        room = max(0, min(limits.rate_max - started, paced, burst - takeable))
        if room < count:
            count, reason = room, REASON_RATE
    return count, reason


def release_room(
    limits: TenantLimits,
    *,
    held: int,
    occupied: int,
    started_in_window: int,
    tokens: float | None = None,
    takeable: int = 0,
    untaken_before_window: int = 0,
    catching_up: bool = False,
    others_waiting: bool = True,
    account: AccountRoom | None = None,
) -> Release:
    """How many of a tenant's ``held`` jobs may be made takeable now.

    ``occupied`` counts its released jobs not finished yet (running, takeable, or waiting
    to run again), ``started_in_window`` its attempts started within the last
    ``rate_duration_ms`` and its jobs released within it and not started yet,
    ``untaken_before_window`` its untaken jobs released before it (they may still start
    within it), ``tokens`` what its pacing bucket holds (``None``: full, as for a tenant
    new to its rate), ``takeable`` its released jobs no worker has taken yet (a rate
    limit keeps at most a burst of them waiting, so starts follow the rate even when the
    workers fall behind the releases), ``catching_up`` whether it was resumed and still
    has held jobs (then, while ``others_waiting``, other jobs wait in the queue, at most
    :data:`CATCHUP_AHEAD` takeable at once; with none waiting it drains at the workers'
    pace, up to :data:`TAKEABLE_CAP`), ``account`` its account's limits and state when
    the account has limits: the same max_active and rate rules over all its tenants, and
    at most :data:`TAKEABLE_CAP` of their released jobs untaken. Releasing ``count``
    keeps occupied <= max_active and any window's starts <= rate_max, the tenant's and
    its account's, so stock workers of any concurrency never run more.
    """
    if held <= 0:
        return Release(0, None)
    if limits.paused:
        return Release(0, REASON_PAUSED)
    count, reason = _limit_room(
        limits,
        held,
        occupied=occupied,
        started_in_window=started_in_window,
        tokens=tokens,
        takeable=takeable,
        untaken_before_window=untaken_before_window,
    )
    if account is not None:
        room, why = _limit_room(
            account.limits,
            count,
            occupied=account.occupied
            + (account.waiting_ahead if account.limits.max_active is not None else 0),
            started_in_window=account.started_in_window,
            tokens=account.tokens,
            takeable=account.takeable,
            untaken_before_window=account.untaken_before_window,
        )
        if TAKEABLE_CAP - account.takeable < room:
            room, why = max(0, TAKEABLE_CAP - account.takeable), None
        if room < count:
            count, reason = room, why
    if catching_up and others_waiting:
        room = max(0, CATCHUP_AHEAD - takeable)
        if room < count:
            count, reason = room, REASON_PAUSED
    count = min(count, max(0, TAKEABLE_CAP - takeable))  # not a limit: no reason of its own
    return Release(count, reason)
