"""fairqueue's settings, read in one place.

Settings come from ``settings.FAIRQUEUE`` (a dict) with the environment variables of
docs/configuration.md taking precedence, so operators can flip ``JOB_PRIORITY_ENABLED`` or the wait
bound without a deploy. Values are validated once, on first use, and cached; the cache
is cleared on Django's ``setting_changed`` so ``override_settings`` works in tests.

Nothing here is read at import time.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any, Final, TypeVar, cast

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from fairqueue.conf.usage_settings import BreakerSettings, QuotaRule, parse_breaker, parse_quotas

# The queue name's bound, where callers of the settings have always found it.
from fairqueue.conf.values import MAX_QUEUE_NAME_LENGTH as MAX_QUEUE_NAME_LENGTH
from fairqueue.conf.values import (
    check_cluster_queues,
    int_in,
    parse_bool,
    parse_fairness_by,
    parse_queues,
    parse_str,
    parse_tenant_limits,
)
from fairqueue.exceptions import Problem, SettingError, UnknownJobTypeError
from fairqueue.redis_target import RedisTarget, parse_redis_target, redis_location
from fairqueue.scheduling.limits import TenantLimits

__all__ = [
    "DEFAULTS",
    "ENV_VARS",
    "INT_RANGES",
    "FairqueueSettings",
    "Problem",
    "RedisTarget",
    "SettingError",
    "get_settings",
    "load_settings",
    "redis_location",
    "reload_settings",
    "setting_errors",
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
        # How long a process keeps a tenant's plan and weight in its own memory (seconds;
        # 0: ask the Django cache every time). Changes saved through the ORM reach every
        # process within PLAN_VERSION_CHECK_S anyway (fairqueue/enqueue/lookups.py).
        "PLAN_LOCAL_CACHE_TIMEOUT": 10,
        # Largest job payload accepted, in bytes of its JSON as BullMQ stores it (1 MiB).
        "MAX_PAYLOAD_BYTES": 1_048_576,
        # How many finished jobs BullMQ keeps, and for how long (seconds): every job
        # fairqueue adds carries them as BullMQ's removeOnComplete / removeOnFail, so
        # workers (Python or Node) trim finished jobs as they finish them. None keeps all.
        "KEEP_COMPLETED": {"count": 1_000, "age": 86_400},
        "KEEP_FAILED": {"count": 5_000, "age": 604_800},
        # What "service proportional to weight" counts (docs/design.md, "Service is worker
        # time"): "time", the workers' time on a flow's attempts; "jobs", the job count.
        "FAIRNESS_BY": "time",
        # Whether an explicit priority_level= / priority= on a tenant's job writes a
        # PriorityOverrideAudit row (priority_override= always does).
        "AUDIT_EXPLICIT_PRIORITY": False,
        # Plan tier -> default per-tenant limits, e.g. {"free": {"max_active": 2}}; a
        # tenant's own TenantPlan value wins (docs/limits.md).
        "TENANT_LIMITS": {},
        # The usage ledger, quotas per plan tier and the breaker (docs/usage.md).
        "USAGE_LEDGER": True,
        "QUOTAS": {},
        "BREAKER": {},
    }
)

#: Where Redis is said to be when nothing sets it (named by "Redis is unavailable").
DEFAULT_REDIS_SOURCE: Final = (
    "the default; none of FAIRQUEUE_REDIS_URL, FAIRQUEUE['REDIS'], FAIRQUEUE['REDIS_URL'] is set"
)

#: Setting key -> environment variable that overrides it (docs/configuration.md).
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

#: Allowed values of the integer settings (inclusive).
INT_RANGES: Final[Mapping[str, tuple[int, int]]] = MappingProxyType(
    {
        "MAX_WAIT_MS": (1, 86_400_000),
        "REBALANCE_INTERVAL_MS": (1, 3_600_000),
        "REBALANCE_WINDOW": (1, 100_000),
        "PLAN_CACHE_TIMEOUT": (0, 86_400),
        "PLAN_LOCAL_CACHE_TIMEOUT": (0, 3_600),
        "MAX_PAYLOAD_BYTES": (1_024, 536_870_912),  # 1 KiB .. 512 MiB (Redis's string limit)
    }
)

#: (setting, field) -> environment variable that overrides that field of a retention.
RETENTION_ENV_VARS: Final[Mapping[tuple[str, str], str]] = MappingProxyType(
    {
        ("KEEP_COMPLETED", "count"): "FAIRQUEUE_KEEP_COMPLETED_COUNT",
        ("KEEP_COMPLETED", "age"): "FAIRQUEUE_KEEP_COMPLETED_AGE_S",
        ("KEEP_FAILED", "count"): "FAIRQUEUE_KEEP_FAILED_COUNT",
        ("KEEP_FAILED", "age"): "FAIRQUEUE_KEEP_FAILED_AGE_S",
    }
)
#: Allowed values of a retention's fields: jobs kept (0: none), age in seconds (10 years).
RETENTION_RANGES: Final[Mapping[str, tuple[int, int]]] = MappingProxyType(
    {"count": (0, 100_000_000), "age": (1, 315_360_000)}
)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Retention:
    """How many finished jobs of a kind BullMQ keeps (``count``) and for how long
    (``age_s``); ``None`` for no limit of that kind."""

    count: int | None
    age_s: int | None

    def bullmq_option(self) -> dict[str, int] | bool:
        """BullMQ's ``removeOnComplete`` / ``removeOnFail`` value (``{count, age}``;
        ``False``: keep every job)."""
        option = {}
        if self.count is not None:
            option["count"] = self.count
        if self.age_s is not None:
            option["age"] = self.age_s
        return option or False


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
    keep_completed: Retention = Retention(1_000, 86_400)
    keep_failed: Retention = Retention(5_000, 604_800)
    fairness_by: str = "time"
    audit_explicit_priority: bool = False
    plan_local_cache_timeout: int = 10
    #: Plan tier -> its tenants' default limits (tiers without limits are absent).
    tenant_limits: Mapping[str, TenantLimits] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    usage_ledger: bool = True
    #: Plan tier -> its quota (tiers without one are absent).
    quotas: Mapping[str, QuotaRule] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    breaker: BreakerSettings = BreakerSettings()

    def __repr__(self) -> str:  # keep credentials in redis_url out of logs and tracebacks
        return (
            f"FairqueueSettings(max_wait_ms={self.max_wait_ms}, "
            f"rebalance_interval_ms={self.rebalance_interval_ms}, "
            f"priority_enabled={self.priority_enabled}, prefix={self.prefix!r}, "
            f"queues={dict(self.queues)!r}, rebalance_window={self.rebalance_window}, "
            f"max_payload_bytes={self.max_payload_bytes}, keep_completed={self.keep_completed}, "
            f"keep_failed={self.keep_failed}, fairness_by={self.fairness_by!r})"
        )

    def queue_for(self, job_type: object) -> str:
        """The BullMQ queue of ``job_type``; every entry point (enqueue, pass, dashboard)
        refuses an unknown one with the same message."""
        if not isinstance(job_type, str) or job_type not in self.queues:
            raise UnknownJobTypeError(
                f"job_type={job_type!r} is not allowed: expected one of {sorted(self.queues)} "
                "(register job types in FAIRQUEUE['QUEUES'])"
            )
        return self.queues[job_type]

    @property
    def redis_location(self) -> str:
        """Where ``redis_url`` points, for logs and messages: never its password."""
        return self.redis.location


def _source_name(key: str, from_env: bool) -> str:
    return ENV_VARS[key] if from_env else f"FAIRQUEUE[{key!r}]"


def _user_settings(errors: list[SettingError]) -> Mapping[str, Any]:
    """``settings.FAIRQUEUE``'s known keys; a non-dict or unknown keys are recorded in
    ``errors`` and the rest is still read, so one check run reports every problem."""
    user = getattr(django_settings, "FAIRQUEUE", {}) or {}
    if not isinstance(user, Mapping):
        errors.append(
            SettingError(
                Problem.FAIRQUEUE_NOT_A_DICT,
                f"FAIRQUEUE={user!r} is not allowed: expected a dict of fairqueue settings",
            )
        )
        return {}
    unknown = sorted(set(user) - set(DEFAULTS))
    if unknown:
        errors.append(
            SettingError(
                Problem.UNKNOWN_KEYS,
                f"FAIRQUEUE has unknown keys {unknown}: allowed keys are {sorted(DEFAULTS)}",
            )
        )
    return {key: value for key, value in user.items() if key in DEFAULTS}


def _raw_values(user: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    values = {**DEFAULTS, **user}
    from_env: set[str] = set()
    for key, env_var in ENV_VARS.items():
        raw = os.environ.get(env_var)
        # Set but empty is an error, not the default: ``VAR=`` in a deploy is a mistake
        # more often than a wish for the default (unset the variable for that).
        if raw is not None:
            values[key] = raw.strip()
            from_env.add(key)
    return values, from_env


def _parse_int(key: str, value: Any, from_env: bool) -> int:
    low, high = INT_RANGES[key]
    return int_in(_source_name(key, from_env), value, low, high)


def _parse_retention(key: str, value: Any) -> Retention:
    """``None`` (keep all), a count, or ``{"count": n, "age": seconds}`` (either or both,
    BullMQ's ``removeOnComplete``/``removeOnFail`` form); fields overridden by
    :data:`RETENTION_ENV_VARS`."""
    name = f"FAIRQUEUE[{key!r}]"
    if value is None:
        fields: dict[str, Any] = {}
    elif isinstance(value, int) and not isinstance(value, bool):
        fields = {"count": value}
    elif isinstance(value, Mapping) and value and set(value) <= set(RETENTION_RANGES):
        fields = dict(value)
    else:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not allowed: expected None (keep every job), a count of "
            'jobs, or a dict with "count" and/or "age" (seconds)'
        )
    parsed: dict[str, int | None] = {}
    for field, (low, high) in RETENTION_RANGES.items():
        env_var = RETENTION_ENV_VARS[(key, field)]
        raw = os.environ.get(env_var)
        if raw is not None:
            parsed[field] = int_in(env_var, raw.strip(), low, high)
        elif fields.get(field) is not None:
            parsed[field] = int_in(f"{name}[{field!r}]", fields[field], low, high)
        else:
            parsed[field] = None
    return Retention(count=parsed["count"], age_s=parsed["age"])


def _check_one_redis_setting(
    values: Mapping[str, Any], user: Mapping[str, Any], from_env: bool
) -> None:
    """Two places for one location are a mistake waiting to happen (which one wins?),
    unless the environment variable overrides both."""
    if not from_env and values["REDIS"] is not None and "REDIS_URL" in user:
        raise ImproperlyConfigured(
            "FAIRQUEUE sets both 'REDIS' and 'REDIS_URL': set only one ('REDIS' takes a URL too)"
        )


def _parse_redis(values: Mapping[str, Any], from_env: bool, url_set: bool) -> RedisTarget:
    """FAIRQUEUE_REDIS_URL, else FAIRQUEUE['REDIS'], else FAIRQUEUE['REDIS_URL']."""
    if from_env:
        return parse_redis_target(values["REDIS_URL"], ENV_VARS["REDIS_URL"])
    if values["REDIS"] is not None:
        return parse_redis_target(values["REDIS"], "FAIRQUEUE['REDIS']")
    if not url_set:  # nothing set: say so rather than name a setting nobody wrote
        return parse_redis_target(values["REDIS_URL"], DEFAULT_REDIS_SOURCE)
    return parse_redis_target(values["REDIS_URL"], "FAIRQUEUE['REDIS_URL']")


def _validate() -> tuple[FairqueueSettings | None, list[SettingError]]:
    """The settings, or ``None`` and every problem found, in the order first use reports
    them (the first one is what ``load_settings`` raises)."""
    errors: list[SettingError] = []
    user = _user_settings(errors)
    values, from_env = _raw_values(user)

    def read(problem: Problem, parse: Callable[..., _T], *args: Any) -> _T | None:
        """``parse(*args)``, or ``None`` with its error recorded as ``problem``, so the
        next setting is still checked."""
        try:
            return parse(*args)
        except ImproperlyConfigured as exc:
            errors.append(SettingError(problem, str(exc)))
            return None

    def number(key: str) -> int | None:
        return read(Problem(key), _parse_int, key, values[key], key in from_env)

    def flag(key: str) -> bool | None:
        return read(Problem(key), parse_bool, source(key), values[key])

    def retention(key: str) -> Retention | None:
        return read(Problem(key), _parse_retention, key, values[key])

    redis_from_env = "REDIS_URL" in from_env
    read(Problem.REDIS_AND_REDIS_URL, _check_one_redis_setting, values, user, redis_from_env)
    redis = read(Problem.REDIS, _parse_redis, values, redis_from_env, "REDIS_URL" in user)

    def source(key: str) -> str:
        return _source_name(key, key in from_env)

    prefix = read(Problem.PREFIX, parse_str, source("PREFIX"), values["PREFIX"])
    queues = read(Problem.QUEUES, parse_queues, values["QUEUES"])
    if redis is not None and prefix is not None and queues is not None:
        read(Problem.CLUSTER_QUEUE_WITHOUT_HASH_TAG, check_cluster_queues, redis, prefix, queues)
    fields: dict[str, Any] = {
        "max_wait_ms": number("MAX_WAIT_MS"),
        "rebalance_interval_ms": number("REBALANCE_INTERVAL_MS"),
        "priority_enabled": flag("PRIORITY_ENABLED"),
        "rebalance_window": number("REBALANCE_WINDOW"),
        "cache_alias": read(
            Problem.CACHE_ALIAS, parse_str, source("CACHE_ALIAS"), values["CACHE_ALIAS"]
        ),
        "plan_cache_timeout": number("PLAN_CACHE_TIMEOUT"),
        "max_payload_bytes": number("MAX_PAYLOAD_BYTES"),
        "keep_completed": retention("KEEP_COMPLETED"),
        "keep_failed": retention("KEEP_FAILED"),
        "fairness_by": read(Problem.FAIRNESS_BY, parse_fairness_by, values["FAIRNESS_BY"]),
        "audit_explicit_priority": flag("AUDIT_EXPLICIT_PRIORITY"),
        "plan_local_cache_timeout": number("PLAN_LOCAL_CACHE_TIMEOUT"),
        "tenant_limits": read(Problem.TENANT_LIMITS, parse_tenant_limits, values["TENANT_LIMITS"]),
        "usage_ledger": flag("USAGE_LEDGER"),
        "quotas": read(Problem.QUOTAS, parse_quotas, values["QUOTAS"]),
        "breaker": read(Problem.BREAKER, parse_breaker, values["BREAKER"]),
    }
    if errors or redis is None:
        return None, errors
    settings = FairqueueSettings(
        **fields,
        redis_url=redis.url,
        prefix=cast(str, prefix),  # read without error: set
        queues=cast("Mapping[str, str]", queues),
        redis=redis,
    )
    return settings, []


def lookalike_settings() -> list[str] | None:
    """``None`` when ``settings.FAIRQUEUE`` exists; else the settings whose names look
    like a misspelt one (``FAIRQEUE``, ``FAIR_QUEUE``, ``FAIRQUEUES``) or like an
    environment variable written into settings.py (``FAIRQUEUE_REDIS_URL``): fairqueue
    reads none of them, and without a warning it would run on the defaults in silence."""
    if hasattr(django_settings, "FAIRQUEUE"):
        return None
    names = [name for name in dir(django_settings) if name.isupper()]
    squashed = {name: re.sub(r"[^A-Z]", "", name) for name in names}
    close = set(difflib.get_close_matches("FAIRQUEUE", squashed.values(), n=10, cutoff=0.75))
    return sorted(
        name
        for name in names
        if squashed[name] in close or name.startswith(("FAIRQUEUE", "FAIR_QUEUE", "QUEUE_FAIR"))
    )


def setting_errors() -> list[SettingError]:
    """Every problem with the settings, not only the first (the system check reports
    them all, each under its own id)."""
    return _validate()[1]


def load_settings() -> FairqueueSettings:
    """Read and validate settings without caching.

    Raises:
        SettingError: the first problem found (an ``ImproperlyConfigured``).
    """
    settings, errors = _validate()
    if settings is None:
        raise errors[0]
    return settings


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
