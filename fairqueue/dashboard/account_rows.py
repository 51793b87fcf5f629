"""Jobs started by account: each queue's history summed per account (docs/design.md,
Accounts), and the overview's top consumers by account over every queue.

A tenant without an account counts as an account of its own (as the fair order counts
it), shown by its tenant id; jobs without a tenant and internal work are left out. The
history keeps the most served tenants of each 10 s bucket (``TENANTS_PER_BUCKET``), and
at most :data:`SERVED_TENANTS` of a queue's are mapped to accounts: the starts of the
others count in the total, not in any account's row (the page says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fairqueue.dashboard.tenant_routes import account_url, tenant_url
from fairqueue.scheduling.levels import DEFAULT_TENANT, INTERNAL_TENANT

#: A queue's most served tenants (over the history window) mapped to their accounts.
SERVED_TENANTS: Final = 500
#: Accounts the overview lists.
TOP_ACCOUNTS: Final = 5


def served_by_account(
    served: Iterable[Mapping[str, Any]], total: int, owners: Mapping[str, str]
) -> list[dict[str, Any]]:
    """``served`` (the history's rows: ``tenant``, ``served``, per level) summed per
    account, the most first: ``account`` (``None`` for a tenant of no account, an account
    of its own: ``tenant`` names it), ``served``, ``tenants`` (its tenants that started
    jobs) and ``share`` of ``total`` (every start of the window). ``owners``: tenant ->
    account id, for the tenants that have one."""
    rows: dict[tuple[str | None, str | None], dict[str, Any]] = {}
    for row in served:
        tenant = row["tenant"]
        if not tenant or tenant in (DEFAULT_TENANT, INTERNAL_TENANT):
            continue
        account = owners.get(tenant)
        key = (account, None) if account is not None else (None, tenant)
        found = rows.setdefault(
            key, {"account": account, "tenant": key[1], "served": 0, "tenants": set()}
        )
        found["served"] += row["served"]
        found["tenants"].add(tenant)
    shown = sorted(rows.values(), key=lambda r: (-r["served"], r["account"] or r["tenant"]))
    return [
        {**row, "tenants": len(row["tenants"]), "share": row["served"] / total if total else None}
        for row in shown
    ]


def owners_of(served: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The account of each tenant of ``served`` that has one (one database query)."""
    from fairqueue.models import TenantPlan

    tenants = {row["tenant"] for row in served if row["tenant"]}
    if not tenants:
        return {}
    found = TenantPlan.objects.filter(tenant_id__in=tenants, account__isnull=False)
    return {tenant: account for tenant, account in found.values_list("tenant_id", "account_id")}


def queue_accounts(served: Sequence[Mapping[str, Any]], total: int) -> list[dict[str, Any]]:
    """A queue's starts by account, from its history's most served tenants."""
    return served_by_account(served, total, owners_of(served))


def link_accounts(rows: Iterable[dict[str, Any]]) -> None:
    """Each row's console page: its account's, or its lone tenant's."""
    for row in rows:
        row["url"] = account_url(row["account"]) if row["account"] else tenant_url(row["tenant"])


@dataclass(frozen=True, slots=True)
class AccountServed:
    """One account (or a tenant of none) among the overview's top consumers."""

    account: str | None
    tenant: str | None
    url: str
    served: int
    share: str


def top_accounts(
    queues: Sequence[tuple[int, Sequence[Mapping[str, Any]]]], *, listed: int = TOP_ACCOUNTS
) -> tuple[AccountServed, ...]:
    """The accounts that started the most jobs over every queue's history window
    (``queues``: each queue's starts in all and its ``accounts`` rows), the most first."""
    total = sum(served for served, _ in queues)
    summed: dict[tuple[str | None, str | None], dict[str, Any]] = {}
    for _, rows in queues:
        for row in rows:
            key = (row["account"], row["tenant"])
            found = summed.setdefault(key, {**row, "served": 0})
            found["served"] += row["served"]
    shown = sorted(summed.values(), key=lambda r: (-r["served"], r["account"] or r["tenant"]))
    return tuple(
        AccountServed(
            account=row["account"],
            tenant=row["tenant"],
            url=row["url"],
            served=row["served"],
            share=f"{100 * row['served'] / total:.0f}%" if total else "—",
        )
        for row in shown[:listed]
    )
