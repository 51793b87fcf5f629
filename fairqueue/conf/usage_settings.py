"""The settings of quotas and the breaker (``FAIRQUEUE['QUOTAS']``, ``['BREAKER']``),
parsed for :mod:`fairqueue.conf`: every bad value is refused with a message naming the
setting, the value and what is allowed (docs/usage.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from django.core.exceptions import ImproperlyConfigured

from fairqueue.plans import PlanTier

#: What a quota counts over, and what happens to a tenant over it.
PERIODS: Final = ("day", "month")
ACTIONS: Final = ("demote", "hold")
#: Worker seconds a quota may allow (about 31 years of one worker).
MAX_QUOTA_S: Final = 1_000_000_000


@dataclass(frozen=True, slots=True)
class QuotaRule:
    """A plan tier's quota: worker seconds per period (``None``: no quota unless the
    tenant's plan sets one), and what happens over it."""

    worker_seconds: int | None = None
    period: str = "day"
    action: str = "demote"


#: A tier without an entry: no quota of its own; a tenant's own quota then demotes.
NO_QUOTA: Final = QuotaRule()


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """When a tenant's jobs of one type are held for failing (docs/usage.md)."""

    enabled: bool = False
    #: The window the failure ratio is measured over (seconds).
    window_s: int = 60
    #: Attempts that must have ended in the window (completed, failed or lost with
    #: their worker) before the ratio counts.
    min_jobs: int = 20
    #: Open when failed / ended attempts in the window reaches this (a failed attempt
    #: with retries left is a failure, and so is a stall).
    failure_ratio: float = 0.95
    #: How long an open breaker holds before one job is released as a probe (seconds).
    cool_off_s: int = 300


BREAKER_RANGES: Final[Mapping[str, tuple[float, float]]] = MappingProxyType(
    {
        "WINDOW_S": (1, 86_400),
        "MIN_JOBS": (1, 1_000_000),
        "FAILURE_RATIO": (0.01, 1.0),
        "COOL_OFF_S": (1, 86_400),
    }
)


def _tiers() -> tuple[str, ...]:
    return tuple(tier.value for tier in PlanTier)


def parse_quotas(value: Any) -> Mapping[str, QuotaRule]:
    """``{tier: {"worker_seconds": n or None, "period": "day"|"month", "action":
    "demote"|"hold"}}``."""
    name = "FAIRQUEUE['QUOTAS']"
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(
            f"{name}={value!r} is not allowed: expected a dict of plan tier "
            f"({', '.join(_tiers())}) to a dict with 'worker_seconds', 'period' and 'action'"
        )
    parsed: dict[str, QuotaRule] = {}
    for tier, rule in value.items():
        if tier not in _tiers():
            raise ImproperlyConfigured(
                f"{name} has key {tier!r}, which is not allowed: expected a plan tier "
                f"({', '.join(_tiers())})"
            )
        where = f"{name}[{tier!r}]"
        if not isinstance(rule, Mapping) or not set(rule) <= {"worker_seconds", "period", "action"}:
            raise ImproperlyConfigured(
                f"{where}={rule!r} is not allowed: expected a dict with 'worker_seconds' "
                "(a whole number or None), 'period' ('day' or 'month') and 'action' "
                "('demote' or 'hold')"
            )
        seconds = rule.get("worker_seconds")
        if seconds is not None and (
            isinstance(seconds, bool)
            or not isinstance(seconds, int)
            or not 1 <= seconds <= MAX_QUOTA_S
        ):
            raise ImproperlyConfigured(
                f"{where}['worker_seconds']={seconds!r} is not allowed: expected a whole "
                f"number of seconds in 1..{MAX_QUOTA_S}, or None for no quota"
            )
        period = rule.get("period", "day")
        if period not in PERIODS:
            raise ImproperlyConfigured(
                f"{where}['period']={period!r} is not allowed: expected 'day' or 'month'"
            )
        action = rule.get("action", "demote")
        if action not in ACTIONS:
            raise ImproperlyConfigured(
                f"{where}['action']={action!r} is not allowed: expected 'demote' (its jobs "
                "run at low until the period ends) or 'hold' (held until the period ends)"
            )
        parsed[tier] = QuotaRule(seconds, period, action)
    return MappingProxyType(parsed)


def parse_breaker(value: Any) -> BreakerSettings:
    """``{"ENABLED": bool, "WINDOW_S": s, "MIN_JOBS": n, "FAILURE_RATIO": r,
    "COOL_OFF_S": s}``, each optional."""
    name = "FAIRQUEUE['BREAKER']"
    allowed = {"ENABLED", *BREAKER_RANGES}
    if not isinstance(value, Mapping) or not set(value) <= allowed:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not allowed: expected a dict with any of {sorted(allowed)}"
        )
    fields: dict[str, Any] = {}
    enabled = value.get("ENABLED", False)
    if not isinstance(enabled, bool):
        raise ImproperlyConfigured(
            f"{name}['ENABLED']={enabled!r} is not allowed: expected True or False"
        )
    fields["enabled"] = enabled
    for key, (low, high) in BREAKER_RANGES.items():
        if key not in value:
            continue
        raw = value[key]
        ratio = key == "FAILURE_RATIO"
        ok_type = isinstance(raw, int | float) if ratio else isinstance(raw, int)
        if isinstance(raw, bool) or not ok_type or not low <= raw <= high:
            kind = "a number" if ratio else "a whole number"
            raise ImproperlyConfigured(
                f"{name}[{key!r}]={raw!r} is not allowed: expected {kind} in {low:g}..{high:g}"
            )
        fields[key.lower()] = float(raw) if ratio else raw  # its BreakerSettings field
    return BreakerSettings(**fields)
