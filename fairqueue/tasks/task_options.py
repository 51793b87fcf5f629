"""A task call's options read from ``@task`` and its keyword arguments: the level its
django-tasks priority asks for, and the tenant and account named by the backend's
``TENANT_KWARG`` and ``ACCOUNT_KWARG`` (apart from the backend, which is long enough).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.tasks.jobs import InvalidTaskError


def level_for_task_priority(priority: int) -> PriorityLevel | None:
    """The level a django-tasks priority (−100..100) asks for; ``None`` for 0.

    50..100 critical, 1..49 high, −49..−1 normal, −100..−50 low. 0, django-tasks'
    default, asks for nothing, so the job resolves as ``enqueue_job`` without an
    explicit priority (plan lookup for a tenant's job, else normal).
    """
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise InvalidTaskError(
            f"priority={priority!r} is not allowed: expected an integer in -100..100"
        )
    if priority == 0:
        return None
    if priority >= 50:
        return PriorityLevel.CRITICAL
    if priority >= 1:
        return PriorityLevel.HIGH
    if priority >= -49:
        return PriorityLevel.NORMAL
    return PriorityLevel.LOW


def kwarg_name(where: str, key: str, options: Mapping[str, Any], default: str | None) -> str | None:
    """``OPTIONS[key]``, a keyword argument name (``None`` allowed when it is the default)."""
    name = options.get(key, default)
    if (name is None and default is None) or (isinstance(name, str) and name.isidentifier()):
        return name
    allowed = "None or a keyword argument name" if default is None else "a keyword argument name"
    raise ImproperlyConfigured(f"{where}[{key!r}]={name!r} is not allowed: expected {allowed}")


def id_kwarg(kwargs: Mapping[str, Any], name: str, what: str, key: str) -> str | None:
    """A tenant's or an account's id from a task's keyword argument: a string (checked by
    the enqueue), an integer (a primary key) as its decimal string, or ``None``."""
    value = kwargs[name]
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value is None or isinstance(value, str):
        return value
    raise InvalidTaskError(
        f"{name} of type {type(value).__name__} is not allowed: expected a string, an "
        f"integer or None (the {what} kwarg is TASKS OPTIONS[{key!r}])"
    )
