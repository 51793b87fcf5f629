"""fairqueue's settings, read in one place.

Settings come from ``settings.FAIRQUEUE`` (a dict) with the environment variables the
seeds name taking precedence, so operators can flip ``JOB_PRIORITY_ENABLED`` or the wait
bound without a deploy. Values are validated once, on first use, and cached; the cache
is cleared on Django's ``setting_changed`` so ``override_settings`` works in tests.

Nothing here is read at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any, Final

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from .redis_target import RedisTarget, parse_redis_target, queue_hash_tag, redis_location

__all__ = [
    "DEFAULTS",
    "ENV_VARS",
    "FairqueueSettings",
    "RedisTarget",
    "get_settings",
    "load_settings",
    "redis_location",
    "reload_settings",
]

DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "MAX_WAIT_MS": 300_000,
        "REBALANCE_INTERVAL_MS": 5_000,
        "PRIORITY_ENABLED": True,
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        # Where Redis is, in any form redis_target.py takes (a URL, Sentinel, Cluster);
        # None: REDIS_URL. FAIRQUEUE_REDIS_URL (any of the URL forms) wins over both.
        "REDIS": None,
        # BullMQ key prefix ("bull" is BullMQ's own default, so Node workers find the jobs).
        "PREFIX": "bull",
        # job type -> BullMQ queue name. A job type not listed is unknown.
        "QUEUES": {"default": "default"},
        # How many jobs at the head of the queue a rebalance pass fully reorders.
        "REBALANCE_WINDOW": 1_000,
        # Django cache alias used for tenant-plan lookups.
        "CACHE_ALIAS": "default",
        "PLAN_CACHE_TIMEOUT": 300,
        # Largest job payload accepted, in bytes of its JSON as BullMQ stores it (1 MiB).
        "MAX_PAYLOAD_BYTES": 1_048_576,
    }
)

#: Setting key -> environment variable that overrides it (names from the seeds).
ENV_VARS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "MAX_WAIT_MS": "QUEUE_FAIR_MAX_WAIT_MS",
        "REBALANCE_INTERVAL_MS": "QUEUE_FAIR_REBALANCE_INTERVAL_MS",
        "PRIORITY_ENABLED": "JOB_PRIORITY_ENABLED",
        "REDIS_URL": "FAIRQUEUE_REDIS_URL",
        "REBALANCE_WINDOW": "QUEUE_FAIR_REBALANCE_WINDOW",
        "PREFIX": "FAIRQUEUE_PREFIX",
        "MAX_PAYLOAD_BYTES": "FAIRQUEUE_MAX_PAYLOAD_BYTES",
    }
)

_INT_RANGES: Final[Mapping[str, tuple[int, int]]] = MappingProxyType(
    {
        "MAX_WAIT_MS": (1, 86_400_000),
        "REBALANCE_INTERVAL_MS": (1, 3_600_000),
        "REBALANCE_WINDOW": (1, 100_000),
        "PLAN_CACHE_TIMEOUT": (0, 86_400),
        "MAX_PAYLOAD_BYTES": (1_024, 536_870_912),  # 1 KiB .. 512 MiB (Redis's string limit)
    }
)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
MAX_QUEUE_NAME_LENGTH: Final = 200


@dataclass(frozen=True, slots=True)
class FairqueueSettings:
    """Validated settings. ``redis_url`` and ``redis`` may hold a password: never log them;
    ``redis_location`` says where Redis is without one."""

    max_wait_ms: int
    rebalance_interval_ms: int
    priority_enabled: bool
    redis_url: str
    prefix: str
    queues: Mapping[str, str]
    rebalance_window: int
    cache_alias: str
    plan_cache_timeout: int
    max_payload_bytes: int
    #: Where Redis is (one server, Sentinel or Cluster); ``redis_url`` is its URL form.
    redis: RedisTarget

    def __repr__(self) -> str:  # keep credentials in redis_url out of logs and tracebacks
        return (
            f"FairqueueSettings(max_wait_ms={self.max_wait_ms}, "
            f"rebalance_interval_ms={self.rebalance_interval_ms}, "
            f"priority_enabled={self.priority_enabled}, prefix={self.prefix!r}, "
            f"queues={dict(self.queues)!r}, rebalance_window={self.rebalance_window}, "
            f"max_payload_bytes={self.max_payload_bytes})"
        )

    @property
    def redis_location(self) -> str:
        """Where ``redis_url`` points, for logs and messages: never its password."""
        return self.redis.location

    def queue_for(self, job_type: str) -> str:
        """The BullMQ queue name of ``job_type``; ``KeyError`` if it is not registered."""
        return self.queues[job_type]


def _source_name(key: str, from_env: bool) -> str:
    return ENV_VARS[key] if from_env else f"FAIRQUEUE[{key!r}]"


def _raw_values() -> tuple[dict[str, Any], set[str]]:
    user = getattr(django_settings, "FAIRQUEUE", {}) or {}
    if not isinstance(user, Mapping):
        raise ImproperlyConfigured(
            f"FAIRQUEUE={user!r} is not allowed: expected a dict of fairqueue settings"
        )
    unknown = sorted(set(user) - set(DEFAULTS))
    if unknown:
        raise ImproperlyConfigured(
            f"FAIRQUEUE has unknown keys {unknown}: allowed keys are {sorted(DEFAULTS)}"
        )
    values = {**DEFAULTS, **user}
    from_env: set[str] = set()
    for key, env_var in ENV_VARS.items():
        raw = os.environ.get(env_var)
        if raw is not None and raw.strip() != "":
            values[key] = raw.strip()
            from_env.add(key)
    return values, from_env


def _parse_int(key: str, value: Any, from_env: bool) -> int:
    low, high = _INT_RANGES[key]
    name = _source_name(key, from_env)
    parsed = value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        parsed = int(value.strip())
    if isinstance(parsed, bool) or not isinstance(parsed, int) or not low <= parsed <= high:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not allowed: expected an integer in {low}..{high}"
        )
    return parsed


def _parse_bool(key: str, value: Any, from_env: bool) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ImproperlyConfigured(
        f"{_source_name(key, from_env)}={value!r} is not allowed: expected true or false"
    )


def _parse_redis(values: Mapping[str, Any], user: Mapping[str, Any], from_env: bool) -> RedisTarget:
    """FAIRQUEUE_REDIS_URL, else FAIRQUEUE['REDIS'], else FAIRQUEUE['REDIS_URL']."""
    if from_env:
        return parse_redis_target(values["REDIS_URL"], ENV_VARS["REDIS_URL"])
    if values["REDIS"] is not None:
        if "REDIS_URL" in user:
            raise ImproperlyConfigured(
                "FAIRQUEUE sets both 'REDIS' and 'REDIS_URL': set only one ('REDIS' takes "
                "a URL too)"
            )
        return parse_redis_target(values["REDIS"], "FAIRQUEUE['REDIS']")
    return parse_redis_target(values["REDIS_URL"], "FAIRQUEUE['REDIS_URL']")


def _check_cluster_queues(redis: RedisTarget, prefix: str, queues: Mapping[str, str]) -> None:
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


def _parse_queues(value: Any) -> Mapping[str, str]:
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


def _parse_str(key: str, value: Any, from_env: bool = False) -> str:
    if not isinstance(value, str) or not value or ":" in value:
        raise ImproperlyConfigured(
            f"{_source_name(key, from_env)}={value!r} is not allowed: expected a non-empty "
            "string without ':'"
        )
    return value


def load_settings() -> FairqueueSettings:
    """Read and validate settings without caching (used by the system check)."""
    values, from_env = _raw_values()
    user = getattr(django_settings, "FAIRQUEUE", {}) or {}
    redis = _parse_redis(values, user, "REDIS_URL" in from_env)
    prefix = _parse_str("PREFIX", values["PREFIX"], "PREFIX" in from_env)
    queues = _parse_queues(values["QUEUES"])
    _check_cluster_queues(redis, prefix, queues)
    return FairqueueSettings(
        max_wait_ms=_parse_int("MAX_WAIT_MS", values["MAX_WAIT_MS"], "MAX_WAIT_MS" in from_env),
        rebalance_interval_ms=_parse_int(
            "REBALANCE_INTERVAL_MS",
            values["REBALANCE_INTERVAL_MS"],
            "REBALANCE_INTERVAL_MS" in from_env,
        ),
        priority_enabled=_parse_bool(
            "PRIORITY_ENABLED", values["PRIORITY_ENABLED"], "PRIORITY_ENABLED" in from_env
        ),
        redis_url=redis.url,
        prefix=prefix,
        queues=queues,
        rebalance_window=_parse_int(
            "REBALANCE_WINDOW", values["REBALANCE_WINDOW"], "REBALANCE_WINDOW" in from_env
        ),
        cache_alias=_parse_str("CACHE_ALIAS", values["CACHE_ALIAS"]),
        plan_cache_timeout=_parse_int("PLAN_CACHE_TIMEOUT", values["PLAN_CACHE_TIMEOUT"], False),
        max_payload_bytes=_parse_int(
            "MAX_PAYLOAD_BYTES", values["MAX_PAYLOAD_BYTES"], "MAX_PAYLOAD_BYTES" in from_env
        ),
        redis=redis,
    )


@cache
def get_settings() -> FairqueueSettings:
    """The validated settings; raises ``ImproperlyConfigured`` naming the bad value."""
    return load_settings()


def reload_settings() -> None:
    """Forget cached settings, e.g. after changing environment variables in a test."""
    get_settings.cache_clear()


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "FAIRQUEUE":
        reload_settings()
