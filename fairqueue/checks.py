"""System checks: report bad fairqueue settings under ``manage.py check``.

The same validation raises ``ImproperlyConfigured`` when a process first uses the
settings; the check lets ``manage.py check`` (and CI) say so before anything runs.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from redis.crc import key_slot

from fairqueue import conf
from fairqueue.redis_target import hash_tag, queue_hash_tag


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """fairqueue.E001: a setting or environment variable is out of range or malformed."""
    try:
        conf.load_settings()
    except ImproperlyConfigured as exc:
        return [
            Error(
                str(exc),
                hint="Fix the environment variable or the FAIRQUEUE setting it names.",
                id="fairqueue.E001",
            )
        ]
    except Exception as exc:  # a check reports, it never crashes `manage.py check`
        return [
            Error(
                f"fairqueue settings could not be read ({type(exc).__name__})",
                hint="Check the FAIRQUEUE setting and the QUEUE_FAIR_*/FAIRQUEUE_* variables.",
                id="fairqueue.E001",
            )
        ]
    return []


@register(Tags.compatibility)
def check_cluster_slots(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """fairqueue.W011: on a Redis Cluster, queues that share a slot share a master, so
    they cannot spread over the cluster (the prefix carries the hash tag, or two queues'
    tags hash alike). Correct either way, only not scaled out."""
    try:
        settings = conf.load_settings()
    except ImproperlyConfigured:
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
