"""The overview: one row per queue and what needs attention first, from the same
:func:`~fairqueue.dashboard.stats.queue_stats` the queue sections show (no reads of its
own), plus the noisy neighbours of each queue.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fairqueue.broker import Broker, SyncBroker
from fairqueue.conf import get_settings
from fairqueue.dashboard.queue_figures import QueueStats
from fairqueue.dashboard.wording import tenant_words
from fairqueue.enqueue.status import TenantAccount, account_level_share_of, level_share_of
from fairqueue.scheduling.hierarchy import ACCOUNT_MARK
from fairqueue.scheduling.levels import DEFAULT_TENANT, INTERNAL_TENANT, PriorityLevel
from fairqueue.scheduling.noisy import NOISY_MIN, FlowWeight, noisy_accounts, noisy_tenants

#: Attention levels, most urgent first.
RED: Final = "red"
AMBER: Final = "amber"


@dataclass(frozen=True, slots=True)
class AttentionItem:
    """Something to look at in one queue (``level``: red or amber), linking to the
    flows that make it on the queue's page."""

    level: str
    text: str
    url: str


@dataclass(frozen=True, slots=True)
class LevelP99:
    """A level's p99 wait on the overview; ``over``: past the bound; ``held_note``: its
    own limits hold it (said, not shown as starved)."""

    p99: str
    over: bool
    held_note: str


@dataclass(frozen=True, slots=True)
class OverviewRow:
    """One queue's row of the overview."""

    job_type: str
    queue_url: str
    anchor: str
    waiting: int
    active: int
    delayed: int
    held: int
    failed: int
    per_min: float
    p99: Mapping[str, LevelP99]
    overdue: int | None
    last_pass_age: str
    leader: str
    attention: tuple[AttentionItem, ...]
    state: str


@dataclass(frozen=True, slots=True)
class PlansAttention:
    """The tenants near or over quota and the open breakers (rows as the usage reads
    give them, with their links and times as text); ``error``: the read failed."""

    quotas: tuple[Mapping[str, Any], ...] = ()
    breakers: tuple[Mapping[str, Any], ...] = ()
    error: str | None = None


def noisy_figures(job_type: str, *, broker: SyncBroker) -> dict[str, Any]:
    """The queue's noisy tenants (``fairqueue.scheduling.noisy``), for the pages."""
    return broker.run(anoisy_figures, job_type, broker=broker.broker)


async def entitled_now(
    broker: Broker,
    queue: str,
    flows: Mapping[tuple[str, str], FlowWeight],
    accounts: Mapping[str, TenantAccount] | None = None,
    of_accounts: Iterable[tuple[str, TenantAccount]] = (),
) -> dict[tuple[str, str], float | None]:
    """What each of ``flows`` ((level, tenant) -> its counted weight) is entitled to now:
    its max-min share of its level given who is asking, the figure its tenant page shows
    (:func:`fairqueue.enqueue.status.level_share_of`, ``None``: no service rate measured
    yet), in its account (``accounts``: tenant -> (account id, weight), for tenants the
    read finds none); and each of ``of_accounts`` ((level, (account id, weight))), keyed
    (level, ``ACCOUNT_MARK`` + account id): the account's share of its level, all its
    flows asking. One read-only estimate read for them all (who is asking is the same
    whoever asks), then pure arithmetic per flow."""
    wanted = list(of_accounts)
    if not flows and not wanted:
        return {}
    (level, tenant), first = next(iter(flows.items()), (("normal", DEFAULT_TENANT), None))
    raw = await broker.status.estimate(
        queue,
        level=PriorityLevel(level),
        tenant=tenant,
        tenant_weight=first.weight if first else 1,
    )
    found: dict[tuple[str, str], float | None] = {
        (level, tenant): level_share_of(raw, PriorityLevel(level), tenant, flow.weight, accounts)
        for (level, tenant), flow in flows.items()
    }
    for level, account in wanted:
        found[(level, ACCOUNT_MARK + account[0])] = account_level_share_of(
            raw, PriorityLevel(level), account, accounts
        )
    return found


async def anoisy_figures(job_type: str, *, broker: Broker) -> dict[str, Any]:
    """:func:`noisy_figures` on ``broker``'s event loop: each running tenant's share of
    its level's running jobs against what it is entitled to now (:func:`entitled_now`),
    and each running account's (its tenants' together) against the account's."""
    queue = get_settings().queue_for(job_type)
    now = await broker.console.in_flight(queue)
    asking = {
        key: now.flows.get(key, FlowWeight(1, False))
        for key, count in now.running.items()
        if count >= NOISY_MIN
    }
    weights = {account: flow.weight for (_, account), flow in now.account_flows.items()}
    accounts = {
        tenant: (account, weights.get(account, 1)) for tenant, account in now.accounts.items()
    }
    entitled = await entitled_now(
        broker,
        queue,
        asking,
        accounts,
        [(level, (account, weights[account])) for level, account in now.account_flows],
    )
    worked = None
    if get_settings().fairness_by == "time":  # judged by worker time too (scheduling/noisy)
        worked = await broker.history.recent_worker_shares(
            queue, list(asking), now_s=int(time.time()), running_ms=now.ran_ms
        )
    found = noisy_tenants(now.running, now.level_weights, now.flows, entitled, worked)
    loud = noisy_accounts(
        now.running,
        now.level_weights,
        now.accounts,
        now.account_flows,
        {(lv, key[1:]): share for (lv, key), share in entitled.items() if key[:1] == ACCOUNT_MARK},
    )
    return {
        "count": len(found),
        # accounts running jobs now, and noisy ones (counted: no id leaves for /metrics)
        "accounts_running": now.accounts_running,
        "accounts_count": len(loud),
        "tenants": [
            {
                "level": n.level,
                # no tenant page for the default bucket or internal work: not linked
                "tenant": None if n.tenant in (DEFAULT_TENANT, INTERNAL_TENANT) else n.tenant,
                "display": tenant_words(None if n.tenant == DEFAULT_TENANT else n.tenant),
                "running": n.running,
                "level_running": n.level_running,
                "share": f"{100 * n.share:.0f}%",
                # by weight alone until a service rate is measured: said, not passed off
                "entitled": f"{100 * n.entitled:.0f}%" + ("" if n.measured else " by weight"),
                "factor": f"{n.share / n.entitled:.1f}" if n.entitled else "—",
            }
            for n in found[:10]
        ],
        "accounts": [
            {
                "level": n.level,
                "account": n.account,
                "tenants": n.tenants,
                "running": n.running,
                "level_running": n.level_running,
                "share": f"{100 * n.share:.0f}%",
                "entitled": f"{100 * n.entitled:.0f}%" + ("" if n.measured else " by weight"),
                "factor": f"{n.share / n.entitled:.1f}" if n.entitled else "—",
            }
            for n in loud[:10]
        ],
    }


#: Tenants the overview lists near or over quota, and open breakers, at most.
PLANS_LISTED: Final = 20


def _when(at: dt.datetime | None) -> str:
    return at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC") if at is not None else ""


def plans_attention(
    tenant_url: Callable[[str], str], account_url: Callable[[str], str] | None = None
) -> PlansAttention:
    """The tenants and accounts near or over quota
    (:func:`fairqueue.usage.quotas.quota_status`,
    :func:`fairqueue.usage.account_quotas.account_quota_status`; an account's row has
    ``account_id`` and its page's ``url``) and the open breakers
    (:func:`fairqueue.usage.breaker.breaker_status`), from the database, for the
    overview. Never raises: a failed read shows as ``error`` (the exception's class)."""
    from fairqueue.usage.account_quotas import account_quota_status
    from fairqueue.usage.breaker import breaker_status
    from fairqueue.usage.quotas import quota_status

    try:
        quotas = quota_status(limit=PLANS_LISTED)
        accounts = account_quota_status(limit=PLANS_LISTED)
        breakers = breaker_status(limit=PLANS_LISTED)
    except Exception as exc:  # the overview shows the queues whatever the database does
        return PlansAttention(error=type(exc).__name__)
    return PlansAttention(
        quotas=tuple(
            {
                **row,
                "url": tenant_url(row["tenant_id"])
                if "tenant_id" in row
                else (account_url(row["account_id"]) if account_url else ""),
                "share_pct": f"{100 * row['share']:.0f}%",
                "until_text": _when(row["until"]),
            }
            for row in sorted([*quotas, *accounts], key=lambda r: -r["share"])[:PLANS_LISTED]
        ),
        breakers=tuple(
            {
                **row,
                "url": tenant_url(row["tenant_id"]),
                "since_text": _when(row["since"]),
                "probe_text": _when(row["probe_at"]),
            }
            for row in breakers
        ),
    )


def attention(stats: QueueStats, queue_url: str = "") -> list[AttentionItem]:
    """What an operator should look at first in one queue: red, then amber; each item
    links (``url``) to the flows that make it, on the queue's page."""
    jt = stats.job_type

    def item(level: str, text: str, anchor: str) -> AttentionItem:
        return AttentionItem(level, text, f"{queue_url}#{anchor}-{jt}")

    items: list[AttentionItem] = []
    memory = stats.redis_memory
    if memory and memory["refuses_writes"]:
        items.append(item(RED, "Redis is out of memory and refuses writes", "queue"))
    last = stats.last_pass
    stale = last is None or (last["age_ms"] or 0) > 3 * stats.interval_ms
    if stats.waiting_total and stale:
        items.append(item(RED, "no recent rebalance pass", "queue"))
    if stats.overdue_total:
        items.append(item(RED, f"{stats.overdue_total} job(s) past the wait bound", "overdue"))
    failing = (stats.failures or {}).get("failing") or []
    if failing:
        items.append(item(RED, f"{len(failing)} tenant(s) failing", "failing"))
    if stats.paused:
        items.append(item(AMBER, "the queue is paused", "queue"))
    noisy = stats.noisy or {}
    if noisy.get("count"):
        items.append(item(AMBER, f"{noisy['count']} noisy tenant(s)", "noisy"))
    if noisy.get("accounts_count"):
        items.append(item(AMBER, f"{noisy['accounts_count']} noisy account(s)", "noisy"))
    if stats.limits["paused"]:
        items.append(item(AMBER, f"{stats.limits['paused']} tenant(s) paused", "limits"))
    held = stats.limits["held_total"]
    if held:
        items.append(
            item(AMBER, f"{held} job(s) held by {stats.limits['holding']} tenant(s)", "limits")
        )
    if stats.order["drift_count"]:
        items.append(item(AMBER, f"{stats.order['drift_count']} job(s) not placed yet", "order"))
    return items


def overview_rows(sections: Sequence[tuple[QueueStats, str]]) -> list[OverviewRow]:
    """One row per queue (``sections``: each queue's stats and its page's URL), the
    queues needing attention first: red, the most red first, then amber."""
    rows = []
    for stats, queue_url in sections:
        history = stats.history
        # over the span recorded: the first minutes after the loop starts are not 15
        window_s = history.get("observed_s") or history["window_s"] or 1
        items = attention(stats, queue_url)
        p99 = {
            level: LevelP99(
                p99=data["p99"],
                over=bool(data["p99_ms"] and data["p99_ms"] > stats.max_wait_ms),
                held_note=data.get("held_note", ""),
            )
            for level, data in history["levels"].items()
        }
        rows.append(
            OverviewRow(
                job_type=stats.job_type,
                queue_url=queue_url,
                anchor=f"queue-{stats.job_type}",
                waiting=stats.waiting_total,
                active=stats.counts["active"],
                delayed=stats.counts["delayed"] - stats.limits["held_total"],
                held=stats.limits["held_total"],
                failed=stats.counts["failed"],
                per_min=round(60 * history["served_total"] / window_s, 1),
                p99=p99,
                overdue=stats.overdue_total,
                last_pass_age=(stats.last_pass or {}).get("age") or "never",
                leader=stats.lock["holder"] or "none",
                attention=tuple(items),
                state=items[0].level if items else "ok",
            )
        )
    order = {RED: 0, AMBER: 1, "ok": 2}

    def urgency(row: OverviewRow) -> tuple[int, int, int]:
        reds = sum(1 for item in row.attention if item.level == RED)
        return order[row.state], -reds, -len(row.attention)

    return sorted(rows, key=urgency)
