"""The account page: one customer (docs/design.md, Accounts) and its tenants, per queue.

For one account: its tier and weight, and per configured queue each of its tenants with
the jobs it has waiting (the backlog scan the queue and tenant pages read, so all three
show one number), running (BullMQ's active list, as the noisy table reads it) and its
entitlement now in the levels it uses (its max-min share of the level given who is
asking: :func:`fairqueue.dashboard.overview.entitled_now`, the tenant page's figure), each
linked to its tenant page. At most :data:`ACCOUNT_TENANTS` tenants are listed (their
number is said); one scan, one active-list read and one estimate read per queue,
whatever the number of tenants.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, reverse
from django.utils.http import urlencode

from fairqueue.broker import Broker, get_sync_broker
from fairqueue.conf import get_settings
from fairqueue.dashboard.console_admin import (
    PERM_ACT,
    PERM_VIEW,
    ActionConfirm,
    ConsolePage,
    RedisTrouble,
    redis_trouble,
    require,
)
from fairqueue.dashboard.limited_tenants import limits_in_words
from fairqueue.dashboard.moment import moment, read_checked_backlog
from fairqueue.dashboard.overview import entitled_now
from fairqueue.dashboard.tenant_routes import (
    ACCOUNT_ACTION,
    ACCOUNT_PAGE,
    account_url,
    tenant_url,
)
from fairqueue.enqueue.priority import resolve_priority
from fairqueue.exceptions import BrokerError, InvalidAccountError
from fairqueue.models import Account, TenantPlan
from fairqueue.scheduling.hierarchy import ACCOUNT_MARK
from fairqueue.scheduling.levels import validate_account_id
from fairqueue.scheduling.noisy import FlowWeight
from fairqueue.scheduling.shares import LEVEL_NAMES
from fairqueue.tenants import pause_account, resume_account
from fairqueue.usage.account_quotas import account_usage

#: Tenants of an account the page lists at most (in id order; their number is said).
ACCOUNT_TENANTS: Final = 200
#: The account's actions (confirmed on GET, done on POST, audited on each tenant).
ACCOUNT_ACTIONS: Final = ("pause", "resume")


@dataclass(frozen=True, slots=True)
class TenantShare:
    """A tenant's entitlement now in one level, as a percentage."""

    level: str
    share: str


@dataclass(frozen=True, slots=True)
class AccountTenant:
    """One of its tenants in one queue: its page, the level and weight its jobs get,
    its waiting (``None``: the scan is not ready) and running jobs, and its shares."""

    tenant_id: str
    name: str
    url: str
    level: str
    weight: int
    waiting: int | None
    running: int
    shares: tuple[TenantShare, ...]


@dataclass(frozen=True, slots=True)
class AccountQueue:
    """The account in one queue: its listed tenants, and their sums."""

    job_type: str
    queue: str
    tenants: tuple[AccountTenant, ...]
    waiting: int | None
    running: int
    backlog_note: str
    #: The account's own entitlement now in the levels its tenants use (all of its
    #: tenants asking): its max-min share of each by account weight.
    shares: tuple[TenantShare, ...] = ()


@dataclass(frozen=True, slots=True)
class AccountPage:
    """What the account page shows (its template reads it as ``page``)."""

    account: Account
    tier: str
    #: ``(label, value)`` of each of its limits over all its tenants (``"—"``: none).
    limits: tuple[tuple[str, str], ...]
    #: Its quota over all its tenants, in words (``""``: none).
    quota: str
    tenant_count: int
    listed: int
    queues: tuple[AccountQueue, ...]
    read_at: Mapping[str, Any] | None
    redis_error: RedisTrouble | None
    change_url: str
    tenants_url: str
    can_act: bool
    action_urls: Mapping[str, str]
    #: Its tenants' worker time today and this month, its quota and hold
    #: (:func:`fairqueue.usage.account_quotas.account_usage`).
    usage: Mapping[str, Any] | None = None
    #: The usage ledger's admin list filtered to its tenants.
    usage_url: str = ""


@dataclass(frozen=True, slots=True)
class _Member:
    """A tenant of the account as its jobs resolve now (level and weight by the
    enqueue's own resolution, the estimate's too)."""

    tenant_id: str
    name: str
    level: str
    weight: int


async def aaccount_queue(
    broker: Broker,
    job_type: str,
    members: tuple[_Member, ...],
    *,
    now_ms: int,
    site: str,
    account: tuple[str, float] = ("", 1.0),
) -> AccountQueue:
    """What the account page shows of ``members`` (the tenants of ``account``, its id and
    weight) in ``job_type``'s queue."""
    settings = get_settings()
    queue = settings.queue_for(job_type)
    counts = await broker.passes.counts(queue)
    scan, backlog = await read_checked_backlog(
        broker, queue, counts, now_ms=now_ms, max_wait_ms=settings.max_wait_ms
    )
    now = await broker.console.in_flight(queue)
    running = now.running
    uses: dict[str, list[str]] = {}
    for member in members:
        used = {member.level}
        used |= {lv for lv in LEVEL_NAMES if running.get((lv, member.tenant_id))}
        if scan is not None:
            used |= {lv for lv in LEVEL_NAMES if scan.tenants.get(lv, {}).get(member.tenant_id)}
        uses[member.tenant_id] = [lv for lv in LEVEL_NAMES if lv in used]
    flows = {
        (level, m.tenant_id): FlowWeight(m.weight, True)
        for m in members
        for level in uses[m.tenant_id]
    }
    levels = [lv for lv in LEVEL_NAMES if any(lv in uses[m.tenant_id] for m in members)]
    entitled = await entitled_now(
        broker,
        queue,
        flows,
        {m.tenant_id: account for m in members},
        [(lv, account) for lv in levels] if account[0] else [],
    )
    rows = []
    for m in members:
        waiting = (
            None
            if scan is None
            else sum(scan.tenants.get(lv, {}).get(m.tenant_id, 0) for lv in LEVEL_NAMES)
        )
        rows.append(
            AccountTenant(
                tenant_id=m.tenant_id,
                name=m.name,
                url=tenant_url(m.tenant_id, site=site),
                level=m.level,
                weight=m.weight,
                waiting=waiting,
                running=sum(running.get((lv, m.tenant_id), 0) for lv in LEVEL_NAMES),
                shares=tuple(
                    TenantShare(level=lv, share=f"{100 * share:.0f}%")
                    for lv in uses[m.tenant_id]
                    if (share := entitled.get((lv, m.tenant_id))) is not None
                ),
            )
        )
    return AccountQueue(
        job_type=job_type,
        queue=queue,
        tenants=tuple(rows),
        waiting=None if scan is None else sum(r.waiting or 0 for r in rows),
        running=sum(r.running for r in rows),
        backlog_note=backlog["note"],
        shares=tuple(
            TenantShare(level=lv, share=f"{100 * share:.0f}%")
            for lv in levels
            if (share := entitled.get((lv, ACCOUNT_MARK + account[0]))) is not None
        ),
    )


def _members(account: Account) -> tuple[int, tuple[_Member, ...]]:
    """How many tenants ``account`` has, and the first :data:`ACCOUNT_TENANTS` of them."""
    plans = TenantPlan.objects.filter(account=account).order_by("tenant_id")
    listed = []
    for plan in plans[:ACCOUNT_TENANTS]:
        resolved = resolve_priority(tenant_id=plan.tenant_id)
        listed.append(
            _Member(
                tenant_id=plan.tenant_id,
                name=plan.display_name,
                level=resolved.level.value,
                weight=resolved.tenant_weight,
            )
        )
    return plans.count(), tuple(listed)


def account_queues(
    members: tuple[_Member, ...], *, site: str = "admin", account: tuple[str, float] = ("", 1.0)
) -> tuple[Mapping[str, Any], tuple[AccountQueue, ...]]:
    """When the numbers were read, and ``members`` (of ``account``) in every configured
    queue (sync).

    Raises:
        BrokerError: Redis failed.
    """
    sync = get_sync_broker()
    now_ms = int(time.time() * 1000)

    async def read_all() -> list[AccountQueue]:
        return list(
            await asyncio.gather(
                *(
                    aaccount_queue(
                        sync.broker, job_type, members, now_ms=now_ms, site=site, account=account
                    )
                    for job_type in get_settings().queues
                )
            )
        )

    return moment(now_ms), tuple(sync.run(read_all))


class AccountViews(ConsolePage):
    """The account page of one :class:`.ConsoleAdmin`."""

    def urls(self) -> list[URLPattern]:
        # fq_tenant: an account id follows a tenant id's rules, escaped the same way
        page = self.admin._page
        return [
            page("accounts/<fq_tenant:account_id>/", self.account_view, ACCOUNT_PAGE),
            page(
                "accounts/<fq_tenant:account_id>/do/<str:action>/",
                self.action_view,
                ACCOUNT_ACTION,
            ),
        ]

    def _url(self, account_id: str, action: str = "") -> str:
        return account_url(account_id, action, site=self.admin.admin_site.name)

    def account_view(self, request: HttpRequest, account_id: str) -> HttpResponse:
        require(request, PERM_VIEW)
        account = _account_or_404(account_id)
        count, members = _members(account)
        read_at: Mapping[str, Any] | None = None
        queues: tuple[AccountQueue, ...] = ()
        error = None
        try:
            read_at, queues = account_queues(
                members,
                site=self.admin.admin_site.name,
                account=(account.account_id, float(account.weight)),
            )
        except BrokerError as exc:
            error = redis_trouble(exc, "account")
        return TemplateResponse(
            request,
            "fairqueue/account.html",
            self.admin._context(
                request,
                f"Account {account.account_id}",
                ("accounts", reverse("admin:fairqueue_account_changelist")),
                (account.account_id, None),
                page=AccountPage(
                    account=account,
                    tier=account.plan_tier or "(each tenant's own)",
                    limits=limits_in_words(account.limits()),
                    quota=(
                        f"{account.quota_worker_seconds:,} worker seconds a "
                        f"{account.quota_period or 'day'}"
                        if account.quota_worker_seconds
                        else ""
                    ),
                    tenant_count=count,
                    listed=len(members),
                    queues=queues,
                    read_at=read_at,
                    redis_error=error,
                    change_url=reverse("admin:fairqueue_account_change", args=[account.pk]),
                    tenants_url=reverse("admin:fairqueue_tenantplan_changelist")
                    + "?"
                    + urlencode({"account__exact": account.account_id}),
                    can_act=request.user.has_perm(PERM_ACT),
                    action_urls={a: self._url(account.account_id, a) for a in ACCOUNT_ACTIONS},
                    usage=account_usage(account),
                    usage_url=reverse("admin:fairqueue_tenantusage_changelist")
                    + "?"
                    + urlencode({"account": account.account_id}),
                ),
            ),
        )

    def action_view(self, request: HttpRequest, account_id: str, action: str) -> HttpResponse:
        """Pause or resume the account: confirmed on GET, done on POST (audited on each
        of its tenants, with this user and "console")."""
        require(request, PERM_VIEW, PERM_ACT)
        account = _account_or_404(account_id)
        if action not in ACCOUNT_ACTIONS:
            raise Http404("No such action")
        account_id = account.account_id
        page_url = self._url(account_id)
        if request.method == "POST":
            try:
                if action == "pause":
                    moved = pause_account(account_id, actor=request.user, source="console")
                    done = f"Paused account {account_id}: {moved} job(s) taken back from the line."
                else:
                    released = resume_account(account_id, actor=request.user, source="console")
                    done = (
                        f"Resumed account {account_id}: {released} held job(s) released at "
                        "once (a tenant's own pause, quota or breaker still holds it)."
                    )
            except BrokerError as exc:
                messages.error(request, f"Redis failed ({type(exc).__name__}): nothing more done.")
                return HttpResponseRedirect(page_url)
            messages.success(request, done)
            return HttpResponseRedirect(page_url)
        touches = (
            "None of its tenants' jobs starts once this returns, in every queue; tenants "
            "that join it are paused too. Running jobs finish."
            if action == "pause"
            else "Each of its tenants is resumed where nothing else holds it."
        )
        return TemplateResponse(
            request,
            "fairqueue/tenant_confirm.html",
            self.admin._context(
                request,
                f"{action.capitalize()} account {account_id}?",
                ("accounts", reverse("admin:fairqueue_account_changelist")),
                (account_id, page_url),
                (action, None),
                page=ActionConfirm(
                    touches=touches, action=action, tenant_id=account_id, tenant_url=page_url
                ),
            ),
        )


def _account_or_404(account_id: str) -> Account:
    try:
        return Account.objects.get(account_id=validate_account_id(account_id))
    except (InvalidAccountError, Account.DoesNotExist):
        raise Http404("No such account") from None
