"""Accounts in the fair clock: a level's flows grouped by account, each account's weight
and split, and a flow's hierarchical share (docs/design.md, "Accounts"). Plain data, as
``FairClock`` keeps it: flows keyed by (level, tenant)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Final, TypeVar

K = TypeVar("K", bound=Hashable)

#: What starts an account's key among the flows' tenants' (no tenant id holds a line
#: feed): its catch-up state lives beside a tenant's, which is its own account's.
ACCOUNT_MARK: Final = "\n"


def group_of(tenant: str, account: str | None) -> str:
    """A flow's account key: its tenant's own without an account."""
    return tenant if account is None else ACCOUNT_MARK + account


def level_groups(
    counted: Mapping[tuple[K, str], int],
    accounts: Mapping[tuple[K, str], str],
    account_weights: Mapping[tuple[K, str], int],
    level: K,
    but: tuple[K, str] | None = None,
) -> dict[str, tuple[int, int]]:
    """The accounts of ``level``'s flows with work (``but`` left out): each one's weight
    and the sum of its flows' tenant weights; a flow without an account is an account of
    its own, of its weight."""
    groups: dict[str, tuple[int, int]] = {}
    for key, weight in counted.items():
        if key[0] != level or key == but:
            continue
        account = accounts.get(key)
        if account is None:
            groups[key[1]] = (weight, weight)
        else:
            own, total = groups.get(ACCOUNT_MARK + account, (account_weights[(level, account)], 0))
            groups[ACCOUNT_MARK + account] = (own, total + weight)
    return groups


def flow_share(groups: Mapping[str, tuple[int, int]], group: str) -> float:
    """A flow's share past any catch-up: its level's split over its account's weight times
    its account's split (without accounts: the level's total of tenant weights)."""
    weight, mates = groups[group]
    return sum(w for w, _ in groups.values()) * mates / weight
