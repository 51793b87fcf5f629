"""How one setting's value is checked: each parser takes the value and the name it was
set under (an environment variable or ``FAIRQUEUE[...]``) and returns it parsed or
raises ``ImproperlyConfigured`` naming the setting, the value and what is allowed.
:mod:`fairqueue.conf` reads the settings and calls these."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from django.core.exceptions import ImproperlyConfigured

from fairqueue.exceptions import InvalidTenantLimitError
from fairqueue.plans import PlanTier
from fairqueue.redis_target import RedisTarget, queue_hash_tag
from fairqueue.scheduling.limits import TenantLimits, parse_limits

#: An integer as an environment variable may spell it: ASCII digits only (no sign, no
#: "²" or "٣", which ``str.isdigit`` accepts), at most 12 of them.
_ASCII_INT = re.compile(r"[0-9]{1,12}")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
MAX_QUEUE_NAME_LENGTH: Final = 200


def _empty_hint(value: Any) -> str:
    return " (unset the variable for the default)" if value == "" else ""


def _ascii_int(value: Any) -> Any:
    """``value`` as an int if it is a string of ASCII digits, else unchanged."""
    if isinstance(value, str) and _ASCII_INT.fullmatch(value.strip()):
        return int(value.strip())
    return value


def int_in(name: str, value: Any, low: int, high: int) -> int:
    parsed = _ascii_int(value)
    if isinstance(parsed, bool) or not isinstance(parsed, int) or not low <= parsed <= high:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not allowed: expected an integer in {low}..{high} "
            f"(ASCII digits){_empty_hint(value)}"
        )
    return parsed


def parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ImproperlyConfigured(
        f"{name}={value!r} is not allowed: expected true or false{_empty_hint(value)}"
    )


def check_cluster_queues(redis: RedisTarget, prefix: str, queues: Mapping[str, str]) -> None:
    """On a Redis Cluster every key of a queue must hash to one slot (BullMQ's scripts and
    fairqueue's touch many keys of a queue at once): its name needs a hash tag."""
    if redis.kind != "cluster":
        return
    for queue in queues.values():
        if queue_hash_tag(prefix, queue) is None:
            raise ImproperlyConfigured(
                f"FAIRQUEUE['QUEUES'] queue name {queue!r} is not allowed on a Redis "
                f"Cluster: expected a hash tag, e.g. '{{{queue}}}', so all of the queue's "
                "keys (BullMQ's and fairqueue's) share one slot (workers, Node ones too, "
                "must use the same queue name)"
            )


def parse_queues(value: Any) -> Mapping[str, str]:
    if not isinstance(value, Mapping) or not value:
        raise ImproperlyConfigured(
            f"FAIRQUEUE['QUEUES']={value!r} is not allowed: "
            "expected a non-empty dict mapping job type to BullMQ queue name"
        )
    for job_type, queue in value.items():
        for label, item in (("job type", job_type), ("queue name", queue)):
            if (
                not isinstance(item, str)
                or not item
                or len(item) > MAX_QUEUE_NAME_LENGTH
                or ":" in item
            ):
                raise ImproperlyConfigured(
                    f"FAIRQUEUE['QUEUES'] {label} {item!r} is not allowed: expected a "
                    f"non-empty string of at most {MAX_QUEUE_NAME_LENGTH} characters "
                    "without ':'"
                )
    return MappingProxyType(dict(value))


def parse_str(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value or ":" in value:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not allowed: expected a non-empty string without ':'"
        )
    return value


#: What FAIRNESS_BY may be.
FAIRNESS_BY_CHOICES: Final = ("time", "jobs")


def parse_fairness_by(value: Any) -> str:
    if value not in FAIRNESS_BY_CHOICES:
        raise ImproperlyConfigured(
            f"FAIRQUEUE['FAIRNESS_BY']={value!r} is not allowed: expected 'time' or 'jobs'"
        )
    return value


def parse_tenant_limits(value: Any) -> Mapping[str, TenantLimits]:
    tiers = tuple(tier.value for tier in PlanTier)
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(
            f"FAIRQUEUE['TENANT_LIMITS']={value!r} is not allowed: expected a dict of plan "
            f"tier ({', '.join(tiers)}) to a dict of limits"
        )
    parsed = {}
    for tier, limits in value.items():
        if tier not in tiers:
            raise ImproperlyConfigured(
                f"FAIRQUEUE['TENANT_LIMITS'] has key {tier!r}, which is not allowed: expected "
                f"a plan tier ({', '.join(tiers)})"
            )
        try:
            parsed[tier] = parse_limits(limits, where=f"FAIRQUEUE['TENANT_LIMITS'][{tier!r}]")
        except InvalidTenantLimitError as exc:
            raise ImproperlyConfigured(str(exc)) from None
    return MappingProxyType({tier: limits for tier, limits in parsed.items() if limits.holds})
