"""System checks: report bad fairqueue settings under ``manage.py check``.

The same validation raises ``ImproperlyConfigured`` when a process first uses the
settings; the check lets ``manage.py check`` (and CI) say so before anything runs, and
reports every problem at once, each under its own id (ids are stable: scripts and
``SILENCED_SYSTEM_CHECKS`` name them). The message is the one first use raises.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from django.core.checks import CheckMessage, Error, Tags, Warning, register
from redis.crc import key_slot

from fairqueue import conf
from fairqueue.conf import Problem
from fairqueue.redis_target import hash_tag, queue_hash_tag

#: The id of an unexpected exception while checking (a bug, or a very odd FAIRQUEUE).
UNEXPECTED_ERROR_ID: Final = "fairqueue.E019"

Check = Callable[..., list[CheckMessage]]


def _sources(key: str) -> str:
    """Where ``key`` is set: its environment variable (which wins) and the setting."""
    setting = f"FAIRQUEUE[{key!r}]"
    env_var = conf.ENV_VARS.get(key)
    return f"{env_var} or {setting} (the variable wins)" if env_var else setting


def _int_hint(key: str, unit: str) -> str:
    low, high = conf.INT_RANGES[key]
    digits = " (ASCII digits in the variable)" if key in conf.ENV_VARS else ""
    return (
        f"Set {_sources(key)} to a number of {unit} in {low}..{high}{digits}, or remove it "
        f"for the default {conf.DEFAULTS[key]}."
    )


def _retention_hint(key: str) -> str:
    count, age = (conf.RETENTION_RANGES[field] for field in ("count", "age"))
    env_count, env_age = (conf.RETENTION_ENV_VARS[(key, field)] for field in ("count", "age"))
    return (
        f"Set FAIRQUEUE[{key!r}] to None (keep every job), a count of jobs in "
        f"{count[0]}..{count[1]}, or a dict with 'count' and/or 'age' (seconds in "
        f"{age[0]}..{age[1]}); {env_count} and {env_age} override one field each."
    )


#: Problem -> (check id, hint). Ids follow DEFAULTS' order, then the problems no single
#: key owns; fairqueue's ids share one number space (E010 is the tasks backend's check,
#: W011 the cluster-slot warning below), a new problem takes the next free number and
#: no number is ever reused.
SETTING_CHECKS: Final[Mapping[Problem, tuple[str, str]]] = MappingProxyType(
    {
        Problem.MAX_WAIT_MS: ("fairqueue.E001", _int_hint("MAX_WAIT_MS", "milliseconds")),
        Problem.REBALANCE_INTERVAL_MS: (
            "fairqueue.E002",
            _int_hint("REBALANCE_INTERVAL_MS", "milliseconds"),
        ),
        Problem.PRIORITY_ENABLED: (
            "fairqueue.E003",
            f"Set {_sources('PRIORITY_ENABLED')} to true or false (or 1/0, yes/no, on/off), "
            "or remove it for the default True.",
        ),
        Problem.REDIS: (
            "fairqueue.E004",
            "Fix the part the message names in FAIRQUEUE_REDIS_URL (it wins), "
            "FAIRQUEUE['REDIS'] or FAIRQUEUE['REDIS_URL']: a redis://host:port/db URL "
            "(or rediss://, unix://), a redis+sentinel:// or redis+cluster:// URL, or a dict "
            "with 'url', 'sentinel' (and 'service') or 'cluster'.",
        ),
        Problem.PREFIX: (
            "fairqueue.E005",
            f"Set {_sources('PREFIX')} to the BullMQ key prefix your workers use, a non-empty "
            "string without ':', or remove it for BullMQ's default 'bull'.",
        ),
        Problem.QUEUES: (
            "fairqueue.E006",
            "Map each job type to its BullMQ queue name, both non-empty strings of at most "
            f"{conf.MAX_QUEUE_NAME_LENGTH} characters without ':', e.g. "
            "FAIRQUEUE['QUEUES'] = {'email': 'email'}.",
        ),
        Problem.REBALANCE_WINDOW: ("fairqueue.E007", _int_hint("REBALANCE_WINDOW", "jobs")),
        Problem.CACHE_ALIAS: (
            "fairqueue.E008",
            "Set FAIRQUEUE['CACHE_ALIAS'] to the alias of a cache in CACHES (a non-empty "
            "string without ':'), or remove it for 'default'.",
        ),
        Problem.PLAN_CACHE_TIMEOUT: (
            "fairqueue.E009",
            _int_hint("PLAN_CACHE_TIMEOUT", "seconds"),
        ),
        Problem.MAX_PAYLOAD_BYTES: ("fairqueue.E012", _int_hint("MAX_PAYLOAD_BYTES", "bytes")),
        Problem.FAIRNESS_BY: (
            "fairqueue.E021",
            "Set FAIRQUEUE['FAIRNESS_BY'] to 'time' (service is the workers' time, the "
            "default) or 'jobs' (service is the number of jobs), or remove it.",
        ),
        Problem.KEEP_COMPLETED: ("fairqueue.E013", _retention_hint("KEEP_COMPLETED")),
        Problem.KEEP_FAILED: ("fairqueue.E014", _retention_hint("KEEP_FAILED")),
        Problem.REDIS_AND_REDIS_URL: (
            "fairqueue.E015",
            "Keep FAIRQUEUE['REDIS'] and remove FAIRQUEUE['REDIS_URL'] (REDIS takes the same "
            "URLs).",
        ),
        Problem.CLUSTER_QUEUE_WITHOUT_HASH_TAG: (
            "fairqueue.E016",
            "Name every queue with a hash tag, e.g. FAIRQUEUE['QUEUES'] = {'email': '{email}'}, "
            "and give workers the same queue name.",
        ),
        Problem.FAIRQUEUE_NOT_A_DICT: (
            "fairqueue.E017",
            "Set FAIRQUEUE to a dict of fairqueue settings, e.g. FAIRQUEUE = {'QUEUES': "
            "{'email': 'email'}}, or remove it for the defaults.",
        ),
        Problem.UNKNOWN_KEYS: (
            "fairqueue.E018",
            "Remove the unknown keys from FAIRQUEUE or correct their spelling.",
        ),
        Problem.AUDIT_EXPLICIT_PRIORITY: (
            "fairqueue.E022",
            "Set FAIRQUEUE['AUDIT_EXPLICIT_PRIORITY'] to True or False, or remove it for the "
            "default False (only priority_override= is audited).",
        ),
        Problem.PLAN_LOCAL_CACHE_TIMEOUT: (
            "fairqueue.E023",
            _int_hint("PLAN_LOCAL_CACHE_TIMEOUT", "seconds"),
        ),
        Problem.TENANT_LIMITS: (
            "fairqueue.E024",
            'Map plan tiers to limits, e.g. {"free": {"max_active": 2, "rate_max": 10, '
            '"rate_duration_ms": 60000}}; each limit a whole number or None.',
        ),
        Problem.USAGE_LEDGER: (
            "fairqueue.E026",
            "Set FAIRQUEUE['USAGE_LEDGER'] to True (count usage, the default) or False.",
        ),
        Problem.QUOTAS: (
            "fairqueue.E027",
            'Map plan tiers to quotas, e.g. {"free": {"worker_seconds": 3600, "period": '
            '"day", "action": "hold"}}; period "day" or "month", action "demote" or "hold".',
        ),
        Problem.BREAKER: (
            "fairqueue.E028",
            'Set FAIRQUEUE[\'BREAKER\'] to a dict such as {"ENABLED": True, "WINDOW_S": 60, '
            '"MIN_JOBS": 20, "FAILURE_RATIO": 0.95, "COOL_OFF_S": 300}, or remove it.',
        ),
    }
)


def _unexpected(exc: Exception) -> Error:
    # The type only: the exception's text may quote a setting, and settings hold passwords.
    return Error(
        f"fairqueue settings could not be checked: {type(exc).__name__} was raised while "
        "reading them",
        hint="Call fairqueue.conf.load_settings() in `manage.py shell` for the traceback; "
        "check FAIRQUEUE and the QUEUE_FAIR_*, JOB_PRIORITY_ENABLED and FAIRQUEUE_* "
        "environment variables.",
        id=UNEXPECTED_ERROR_ID,
    )


def _never_crashes(check: Check) -> Check:
    """A check reports; it never turns `manage.py check` into a traceback."""

    @functools.wraps(check)
    def guarded(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
        try:
            return check(app_configs, **kwargs)
        except Exception as exc:
            return [_unexpected(exc)]

    return guarded


@register(Tags.compatibility)
@_never_crashes
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """fairqueue.E001..E009, E012..E018, E021..E024, E026..E028: every bad setting or
    environment variable, one message per problem (see SETTING_CHECKS); E019 if reading
    them fails unexpectedly."""
    messages: list[CheckMessage] = []
    for error in conf.setting_errors():
        check_id, hint = SETTING_CHECKS[error.problem]
        messages.append(Error(str(error), hint=hint, id=check_id))
    return messages


#: The id of the warning that FAIRQUEUE is not set at all.
NO_SETTING_ID: Final = "fairqueue.W029"


@register(Tags.compatibility)
@_never_crashes
def check_setting_present(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """fairqueue.W029: no ``FAIRQUEUE`` setting, so fairqueue runs on the defaults (Redis
    on 127.0.0.1:6379/0, one job type ``default``); names the look-alike settings found,
    since a typo there is the usual reason and nothing else would report it."""
    lookalikes = conf.lookalike_settings()
    if lookalikes is None:
        return []
    found = f"; found {', '.join(lookalikes)}, which fairqueue does not read" if lookalikes else ""
    rename = f"Rename {lookalikes[0]} to FAIRQUEUE, or add" if lookalikes else "Add"
    return [
        Warning(
            "fairqueue is installed but settings define no FAIRQUEUE: only the defaults and "
            f"environment variables apply (queues {dict(conf.DEFAULTS['QUEUES'])}, Redis at "
            f"{conf.DEFAULTS['REDIS_URL']} unless FAIRQUEUE_REDIS_URL is set){found}",
            hint=f"{rename} FAIRQUEUE = {{'REDIS_URL': ..., 'QUEUES': {{...}}}} to settings "
            "(docs/configuration.md); set FAIRQUEUE = {} to keep the defaults on purpose.",
            id=NO_SETTING_ID,
        )
    ]


@register(Tags.compatibility)
@_never_crashes
def check_cluster_slots(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """fairqueue.W011: on a Redis Cluster, queues that share a slot share a master, so
    they cannot spread over the cluster (the prefix carries the hash tag, or two queues'
    tags hash alike). Correct either way, only not scaled out."""
    try:
        settings = conf.load_settings()
    except Exception:
        return []  # check_settings reports it
    if settings.redis.kind != "cluster":
        return []
    queues = sorted(set(settings.queues.values()))
    if hash_tag(f"{settings.prefix}:") is not None and len(queues) > 1:
        return [
            Warning(
                f"FAIRQUEUE['PREFIX']={settings.prefix!r} carries a hash tag, so every "
                "queue lives on one slot of the cluster",
                hint="Put the hash tag in each queue name instead (e.g. '{email}').",
                id="fairqueue.W011",
            )
        ]
    by_slot: dict[int, list[str]] = {}
    for queue in queues:
        tag = queue_hash_tag(settings.prefix, queue)
        if tag is not None:
            by_slot.setdefault(key_slot(tag.encode()), []).append(queue)
    return [
        Warning(
            f"FAIRQUEUE['QUEUES'] queues {names} hash to the same cluster slot {slot}, so "
            "they always share a master",
            hint="Give one of them a different hash tag to spread them over the cluster.",
            id="fairqueue.W011",
        )
        for slot, names in sorted(by_slot.items())
        if len(names) > 1
    ]


#: The id of the warning about outbox rows no relay will send.
OUTBOX_UNKNOWN_JOB_TYPE_ID: Final = "fairqueue.W020"


@register(Tags.compatibility)
@_never_crashes
def check_outbox_job_types(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """fairqueue.W020: outbox rows of job types no longer in FAIRQUEUE['QUEUES'].

    The relay sends a row to its job type's queue as QUEUES maps it now; a job type that
    was removed has no queue, so its rows wait, untouched, and only this check and the
    outbox gauge show them. Reads the database (one GROUP BY over the outbox): silent
    when the table is not there yet (before ``migrate``) or the database cannot be
    reached, which other commands report."""
    from django.db import DatabaseError, connections
    from django.db.models import Count

    from fairqueue.models import OutboxJob

    try:
        configured = set(conf.load_settings().queues)
    except Exception:
        return []  # check_settings reports it
    messages: list[CheckMessage] = []
    for alias in databases or ["default"]:
        if alias not in connections:
            continue
        try:
            counts = {
                row["job_type"]: row["n"]
                for row in OutboxJob.objects.using(alias)
                .exclude(job_type__in=configured)
                .values("job_type")
                .annotate(n=Count("id"))
                .order_by()
            }
        except (DatabaseError, RuntimeError):  # no table yet, no database (or no access)
            continue
        if counts:
            where = "" if alias == "default" else f" in database {alias!r}"
            messages.append(
                Warning(
                    f"{sum(counts.values())} outbox row(s){where} of job types that "
                    f"FAIRQUEUE['QUEUES'] no longer configures ({sorted(counts)!r}) wait "
                    "and will not be relayed",
                    hint="Map the job types in FAIRQUEUE['QUEUES'] again (the relay sends "
                    "their rows to the queue they map to then), or delete the rows "
                    "(OutboxJob.objects.filter(job_type=...).delete()) if their jobs "
                    "should not run.",
                    id=OUTBOX_UNKNOWN_JOB_TYPE_ID,
                )
            )
    return messages
