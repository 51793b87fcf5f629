"""The database-backed tenant lookups that ``wire_tenant_plan_lookup()`` wires: a
tenant's plan slug and weight from its ``TenantPlan`` row, in two cache layers.

In this process (``PLAN_LOCAL_CACHE_TIMEOUT``), since a Django-cache round trip per job
cost more producer and Redis CPU than the add itself; then in the Django cache
(``CACHE_ALIAS``, ``PLAN_CACHE_TIMEOUT``), shared by the processes. A change reaches
every producer through a *version* token: ``forget_tenant_plan`` /
``forget_all_tenant_plans`` (called by ``fairqueue.signals``) drop this process's entries
and write a new token to the Django cache, which every process reads at most once per
:data:`VERSION_CHECK_S` (how long each kind of change takes: docs/enqueueing.md).

A tenant's entry also holds its account (id and weight), and its plan slug counts the
account's tier; an account's change forgets every entry (``forget_all_tenant_plans``),
since any number of tenants may inherit from it. An ``account_id`` given explicitly is
looked up in entries of its own (:func:`lookup_account_weight`), absent ones included.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Final, TypeVar

from django.core.cache import caches
from django.core.signals import setting_changed
from django.dispatch import receiver

from fairqueue.conf import get_settings
from fairqueue.models import Account, TenantPlan
from fairqueue.scheduling.levels import DEFAULT_TENANT_WEIGHT
from fairqueue.scheduling.limits import NO_LIMITS, TenantLimits

_CACHE_PREFIX: Final = "fairqueue:plan"
_GENERATION_KEY: Final = f"{_CACHE_PREFIX}:generation"
#: A token rewritten on every change of a plan, weight, classifier or rule.
_VERSION_KEY: Final = f"{_CACHE_PREFIX}:version"
#: Marks a Django-cache entry ``(_ENTRY, generation, value)`` of this shape.
_ENTRY: Final = "v2"
#: How often a process reads the version token, in seconds: the bound within which a
#: change saved in one process reaches the in-process caches of all the others.
VERSION_CHECK_S: Final = 1.0
#: Tenants a process keeps at most (the oldest entry goes first past that).
MAX_LOCAL_TENANTS: Final = 10_000
#: An explicit account's key in the in-process layer: no tenant id holds a line feed,
#: so it never meets a tenant's.
_LOCAL_ACCOUNT: Final = "\naccount\n"

V = TypeVar("V", bound=tuple)
#: A tenant's account as the lookups give it: ``(account_id, account weight)``.
TenantAccount = tuple[str, int]


def _cache():
    return caches[get_settings().cache_alias]


def _tenant_key(tenant_id: str) -> str:
    digest = hashlib.sha256(tenant_id.encode()).hexdigest()[:32]
    return f"{_CACHE_PREFIX}:{digest}"


def _account_key(account_id: str) -> str:
    digest = hashlib.sha256(account_id.encode()).hexdigest()[:32]
    return f"{_CACHE_PREFIX}:account:{digest}"


class _Unseen:
    """The version before this process first read it (differs from any token and from
    ``None``, an absent key)."""


class LocalPlans:
    """One process's copy of tenants' ``(plan slug or None, weight)``, each entry kept
    ``timeout`` seconds, all dropped when the shared version token changes.

    ``clock`` is a monotonic clock in seconds; reads take no lock (a dict lookup is
    atomic), writes and the version check do. ``epoch`` moves on every drop, so a value
    fetched before a drop is not stored after it (:meth:`put` refuses it).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[float, Any]] = {}
        self._version: object = _Unseen
        self._next_check = 0.0
        self._lock = threading.Lock()
        self.epoch = 0

    def get(self, tenant_id: str) -> Any:
        """The cached ``(slug, weight, own limits, account or None)`` (an explicit
        account's key: its weight or ``None``), or ``None`` (absent or expired)."""
        now = self._clock()
        if now >= self._next_check:
            self._check_version(now)
        entry = self._entries.get(tenant_id)
        if entry is None or entry[0] <= now:
            return None
        return entry[1]

    def put(self, key: str, value: Any, timeout: float, epoch: int) -> None:
        """Keep ``value`` under ``key``, fetched when :attr:`epoch` was ``epoch``: unless
        something was dropped since (the value may predate the change that dropped it)."""
        now = self._clock()
        with self._lock:
            if epoch != self.epoch:
                return
            entries = self._entries
            if key not in entries and len(entries) >= MAX_LOCAL_TENANTS:
                for stale in [key for key, entry in entries.items() if entry[0] <= now]:
                    del entries[stale]
                if len(entries) >= MAX_LOCAL_TENANTS:
                    del entries[next(iter(entries))]
            entries[key] = (now + timeout, value)

    def forget(self, tenant_id: str) -> None:
        with self._lock:
            self._entries.pop(tenant_id, None)
            self.epoch += 1

    def clear(self) -> None:
        """Drop every entry and read the version token again on the next lookup."""
        with self._lock:
            self._entries.clear()
            self._version = _Unseen
            self._next_check = 0.0
            self.epoch += 1

    def _check_version(self, now: float) -> None:
        with self._lock:
            if now < self._next_check:
                return  # another thread checked meanwhile
            self._next_check = now + VERSION_CHECK_S
            try:
                version = _cache().get(_VERSION_KEY)
            except Exception:
                # Freshness cannot be confirmed: serve nothing from memory, and let the
                # lookup's own cache call fail (or succeed) as it would without this layer.
                self._entries.clear()
                self._version = _Unseen
                self.epoch += 1
                return
            if version != self._version:
                self._entries.clear()
                self._version = version
                self.epoch += 1

    def _after_fork(self) -> None:
        """A forked child gets a fresh lock (the parent's may have been held)."""
        self._lock = threading.Lock()


_local = LocalPlans()
os.register_at_fork(after_in_child=_local._after_fork)


def _through_caches(
    local_key: str, name: str, shared_key: Callable[[str], str], load: Callable[[str], V]
) -> V:
    """``load(name)`` (read from the database) through the two layers: this process's
    memory when it has a fresh entry under ``local_key``, else one Django-cache round trip
    for the entry (``shared_key(name)``) and the classifier generation together (an entry
    of an older generation, or of another shape, is a miss and gets rewritten).

    Module-level ``shared_key`` and ``load``, not a key and a closure made by the caller:
    a warm enqueue asks this four times a job, and hashing the key and building the
    closure each time cost it more than the memory lookup itself."""
    timeout = get_settings().plan_local_cache_timeout
    if timeout:
        found = _local.get(local_key)
        if found is not None:
            return found
        epoch = _local.epoch  # after get(), which may have dropped everything
    cache = _cache()
    key = shared_key(name)
    shared = cache.get_many([key, _GENERATION_KEY])
    generation = shared.get(_GENERATION_KEY, 0)
    entry = shared.get(key)
    if isinstance(entry, tuple) and len(entry) == 3 and entry[:2] == (_ENTRY, generation):
        value = entry[2]
    else:
        value = load(name)
        cache.set(key, (_ENTRY, generation, value), get_settings().plan_cache_timeout)
    if timeout:
        _local.put(local_key, value, timeout, epoch)
    return value


def _load_tenant(tenant_id: str) -> tuple[str | None, int, TenantLimits, TenantAccount | None]:
    """``tenant_id``'s entry read from the database (its ``TenantPlan`` and account)."""
    plan = TenantPlan.objects.filter(tenant_id=tenant_id).select_related("account").first()
    if plan is None:
        return None, DEFAULT_TENANT_WEIGHT, NO_LIMITS, None
    account = plan.account
    return (
        plan.resolve_plan(),
        plan.weight,
        plan.own_limits(),
        None if account is None else (account.account_id, account.weight),
    )


def _cached_tenant(tenant_id: str) -> tuple[str | None, int, TenantLimits, TenantAccount | None]:
    """``(plan slug or None, weight, own limits, account or None)`` of ``tenant_id``."""
    return _through_caches(tenant_id, tenant_id, _tenant_key, _load_tenant)


def lookup_tenant_plan(tenant_id: str) -> str | None:
    """The plan slug of ``tenant_id`` (``None`` if the tenant is unknown), via the caches."""
    return _cached_tenant(tenant_id)[0]


def lookup_tenant_weight(tenant_id: str) -> int:
    """The weight of ``tenant_id`` inside its level (1 if the tenant is unknown), via the
    same cache entries as its plan."""
    return _cached_tenant(tenant_id)[1]


def lookup_tenant_limits(tenant_id: str, slug: str | None = None) -> TenantLimits:
    """The limits of ``tenant_id``: its own ``TenantPlan`` values, the fields it leaves
    empty filled from its plan tier's ``FAIRQUEUE['TENANT_LIMITS']``, via the same cache
    entries as its plan and weight (no extra cache or database call)."""
    cached_slug, _weight, own, _account = _cached_tenant(tenant_id)
    return with_tier_defaults(own, slug or cached_slug)


def lookup_tenant_account(tenant_id: str) -> TenantAccount | None:
    """The account ``tenant_id`` belongs to, ``(account_id, weight)``, or ``None``, via
    the same cache entries as its plan and weight (no extra cache or database call)."""
    return _cached_tenant(tenant_id)[3]


def _load_account(account_id: str) -> tuple[int | None, TenantLimits]:
    """``account_id``'s entry read from the database: its weight (``None``: no such
    account) and its limits."""
    account = Account.objects.filter(account_id=account_id).first()
    return (None, NO_LIMITS) if account is None else (account.weight, account.limits())


def _cached_account(account_id: str) -> tuple[int | None, TenantLimits]:
    """The weight of account ``account_id`` (``None``: no such account) and its limits;
    an absent account is kept too, so a caller repeating a wrong id does not reach the
    database each time."""
    return _through_caches(_LOCAL_ACCOUNT + account_id, account_id, _account_key, _load_account)


def lookup_account_weight(account_id: str) -> int | None:
    """The weight of the account ``account_id``, or ``None`` when it does not exist, via
    the two cache layers (a new account forgets every entry, so its absence is not kept
    past its creation)."""
    return _cached_account(account_id)[0]


def lookup_account_limits(account_id: str) -> TenantLimits:
    """The limits of the account ``account_id`` over all its tenants (none when it does
    not exist), via the same cache entries as its weight."""
    return _cached_account(account_id)[1]


def with_tier_defaults(own: TenantLimits, plan: str | None) -> TenantLimits:
    """A tenant's own limits with its plan tier's ``FAIRQUEUE['TENANT_LIMITS']`` filling
    the fields it leaves empty (its own value wins)."""
    defaults = get_settings().tenant_limits.get(plan or "")
    return own if defaults is None else own.over(defaults)


def _bump_version(cache: Any) -> None:
    # A fresh random token rather than a counter: a counter the cache evicted and
    # restarted could come back to the very value a process saw last.
    cache.set(_VERSION_KEY, uuid.uuid4().hex, None)


def forget_tenant_plan(tenant_id: str) -> None:
    """Drop one tenant's cached plan and weight (its row changed): here at once, in the
    Django cache, and in every other process within ``VERSION_CHECK_S``."""
    _local.forget(tenant_id)
    cache = _cache()
    cache.delete(_tenant_key(tenant_id))
    _bump_version(cache)


def forget_all_tenant_plans() -> None:
    """Invalidate every cached plan (a classifier or rule changed), in every process."""
    _local.clear()
    cache = _cache()
    try:
        cache.incr(_GENERATION_KEY)
    except ValueError:
        cache.set(_GENERATION_KEY, 1, None)
    _bump_version(cache)


def clear_local_plans() -> None:
    """Forget this process's in-memory entries only (tests; settings changes)."""
    _local.clear()


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("FAIRQUEUE", "CACHES"):
        clear_local_plans()
