"""The database-backed tenant lookups that ``wire_tenant_plan_lookup()`` wires: a
tenant's plan slug and weight from its ``TenantPlan`` row, through the Django cache.

``fairqueue.signals`` calls ``forget_tenant_plan``/``forget_all_tenant_plans`` when a
row, a classifier or a rule changes.
"""

from __future__ import annotations

import hashlib
from typing import Final

from django.core.cache import caches

from fairqueue.models import TenantPlan
from fairqueue.scheduling.levels import DEFAULT_TENANT_WEIGHT

_CACHE_PREFIX: Final = "fairqueue:plan"
_GENERATION_KEY: Final = f"{_CACHE_PREFIX}:generation"
_NO_PLAN: Final = ""


def _cache():
    from fairqueue.conf import get_settings

    return caches[get_settings().cache_alias]


def _tenant_key(tenant_id: str) -> str:
    digest = hashlib.sha256(tenant_id.encode()).hexdigest()[:32]
    return f"{_CACHE_PREFIX}:{digest}"


def _cached_tenant(tenant_id: str) -> tuple[str | None, int]:
    """``(plan slug or None, weight)`` of ``tenant_id``, from one cache entry.

    One cache round trip on a hit: the entry and the classifier generation are fetched
    together; an entry computed under an older generation is stale. The entry is
    ``(generation, slug or "", weight)``; anything else (such as the
    ``(generation, slug)`` entries of fairqueue 0.1) is a miss and gets rewritten.
    """
    from fairqueue.conf import get_settings

    cache = _cache()
    key = _tenant_key(tenant_id)
    found = cache.get_many([key, _GENERATION_KEY])
    generation = found.get(_GENERATION_KEY, 0)
    entry = found.get(key)
    if isinstance(entry, tuple) and len(entry) == 3 and entry[0] == generation:
        return entry[1] or None, entry[2]
    plan = TenantPlan.objects.filter(tenant_id=tenant_id).first()
    slug = plan.resolve_plan() if plan is not None else None
    weight = plan.weight if plan is not None else DEFAULT_TENANT_WEIGHT
    cache.set(key, (generation, slug or _NO_PLAN, weight), get_settings().plan_cache_timeout)
    return slug, weight


def lookup_tenant_plan(tenant_id: str) -> str | None:
    """The plan slug of ``tenant_id`` (``None`` if the tenant is unknown), via the cache."""
    return _cached_tenant(tenant_id)[0]


def lookup_tenant_weight(tenant_id: str) -> int:
    """The weight of ``tenant_id`` inside its level (1 if the tenant is unknown), via the
    same cache entry as its plan."""
    return _cached_tenant(tenant_id)[1]


def forget_tenant_plan(tenant_id: str) -> None:
    """Drop one tenant's cached plan and weight (its row changed)."""
    _cache().delete(_tenant_key(tenant_id))


def forget_all_tenant_plans() -> None:
    """Invalidate every cached plan (a classifier or rule changed)."""
    cache = _cache()
    try:
        cache.incr(_GENERATION_KEY)
    except ValueError:
        cache.set(_GENERATION_KEY, 1, None)
