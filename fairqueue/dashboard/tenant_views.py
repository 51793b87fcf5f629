"""The console's tenant views: search, the tenant page and its actions.

Actions reuse fairqueue's own verbs (``pause_tenant``, ``resume_tenant``,
``retry_failed``; limits and weight through a ``TenantPlan`` save, whose signal brings
them to Redis), confirm on GET, act on POST, report what they did with ``messages`` and
leave an audit row (the pause audit, or the admin log). Viewing needs
``fairqueue.view_dashboard``; acting also ``fairqueue.change_tenantplan``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from django import forms
from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode

from fairqueue.broker import get_sync_broker
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
from fairqueue.dashboard.tenant_page import (
    SEARCH_LIMIT,
    EffectiveLevel,
    TenantData,
    effective_level,
    tenant_page_data,
)
from fairqueue.dashboard.tenant_routes import (
    TENANT_ACTION,
    TENANT_LIMITS,
    TENANT_PAGE,
    account_url,
    tenant_url,
)
from fairqueue.dashboard.wording import format_duration
from fairqueue.exceptions import BrokerError, InvalidTenantError
from fairqueue.models import TenantPauseAudit, TenantPlan
from fairqueue.scheduling.levels import validate_tenant_id
from fairqueue.scheduling.limits import LIMIT_FIELDS
from fairqueue.tenants import pause_tenant, resume_tenant, retry_failed

logger = logging.getLogger("fairqueue.console")

ACTIONS: Final = ("pause", "resume", "retry", "remove")


@dataclass(frozen=True, slots=True)
class TenantRow:
    """A tenant the search found: its id, name, page and the level of its jobs."""

    tenant_id: str
    name: str
    url: str
    level: str


@dataclass(frozen=True, slots=True)
class TenantSearch:
    """The tenant search: the query, the plan rows whose id starts with it (at most
    ``limit``), and the page of the exact id (a tenant needs no plan row)."""

    query: str
    rows: tuple[TenantRow, ...]
    limit: int
    exact_url: str


@dataclass(frozen=True, slots=True)
class TenantPage:
    """What the tenant page shows (its template reads it as ``page``): the tenant's
    plan and the level it gives, what each queue holds of it (``data``: ``None`` when
    Redis did not answer), its last pauses, and the links to act."""

    tenant_id: str
    plan: TenantPlan | None
    #: its row's own limits in words, ``(label, value)`` (empty: no row)
    plan_limits: tuple[tuple[str, str], ...]
    level: EffectiveLevel
    data: TenantData | None
    redis_error: RedisTrouble | None
    audits: tuple[TenantPauseAudit, ...]
    paused: bool
    can_act: bool
    plan_url: str
    #: its account's console page ("": it has none)
    account_url: str
    add_plan_url: str
    action_urls: Mapping[str, str]
    limits_url: str
    job_url_template: str
    max_wait_ms: int
    max_wait: str


@dataclass(frozen=True, slots=True)
class LimitsPage:
    """The weight and limits form of a tenant's plan."""

    tenant_id: str
    form: LimitsForm
    tenant_url: str


class LimitsForm(forms.ModelForm):
    class Meta:
        model = TenantPlan
        fields = ("weight", *LIMIT_FIELDS)


def _tenant_or_404(tenant_id: str) -> str:
    try:
        return validate_tenant_id(tenant_id, none_allowed=False)
    except InvalidTenantError:
        raise Http404("No such tenant") from None


class TenantViews(ConsolePage):
    """The tenant views of one :class:`.ConsoleAdmin`."""

    def urls(self) -> list[URLPattern]:
        page = self.admin._page
        return [
            page("tenants/", self.search_view, "tenants"),
            # fq_tenant: the id escaped into one segment (tenant_routes), so no id
            # reaches another route or another tenant
            page("tenants/<fq_tenant:tenant_id>/", self.tenant_view, TENANT_PAGE),
            page("tenants/<fq_tenant:tenant_id>/limits/", self.limits_view, TENANT_LIMITS),
            page("tenants/<fq_tenant:tenant_id>/do/<str:action>/", self.action_view, TENANT_ACTION),
        ]

    def _tenant_url(self, tenant_id: str, action: str = "") -> str:
        return tenant_url(tenant_id, action, site=self.admin.admin_site.name)

    # -- search -----------------------------------------------------------------------

    def search_view(self, request: HttpRequest) -> HttpResponse:
        """``?q=``: an exact tenant id goes to its page; otherwise the tenants whose id
        starts with it (plan rows), at most :data:`SEARCH_LIMIT`."""
        require(request, PERM_VIEW)
        query = request.GET.get("q", "").strip()
        found: list[TenantPlan] = []
        if query:
            if TenantPlan.objects.filter(tenant_id=query).exists():
                return HttpResponseRedirect(self._tenant_url(query))
            found = list(TenantPlan.objects.filter(tenant_id__startswith=query)[:SEARCH_LIMIT])
        rows = tuple(
            TenantRow(
                tenant_id=plan.tenant_id,
                name=plan.display_name,
                url=self._tenant_url(plan.tenant_id),
                level=effective_level(plan).level,
            )
            for plan in found
        )
        exact_url = ""
        if query:
            try:
                exact_url = self._tenant_url(validate_tenant_id(query, none_allowed=False))
            except InvalidTenantError:
                exact_url = ""
        return self.admin._show(
            request,
            "fairqueue/tenant_search.html",
            "Find a tenant",
            ("tenants", None),
            page=TenantSearch(query=query, rows=rows, limit=SEARCH_LIMIT, exact_url=exact_url),
        )

    # -- the page ---------------------------------------------------------------------

    def tenant_view(self, request: HttpRequest, tenant_id: str) -> HttpResponse:
        require(request, PERM_VIEW)
        tenant_id = _tenant_or_404(tenant_id)
        plan = TenantPlan.objects.filter(tenant_id=tenant_id).first()
        data, error = None, None
        try:
            data = tenant_page_data(tenant_id)
        except BrokerError as exc:
            error = redis_trouble(exc, "tenant")
        audits = tuple(TenantPauseAudit.objects.filter(tenant_id=tenant_id)[:5])
        return self.admin._show(
            request,
            "fairqueue/tenant.html",
            f"Tenant {tenant_id}",
            ("tenants", self.admin._url("tenants")),
            (tenant_id, None),
            page=TenantPage(
                tenant_id=tenant_id,
                plan=plan,
                plan_limits=limits_in_words(plan.own_limits()) if plan else (),
                level=effective_level(plan),
                data=data,
                redis_error=error,
                audits=audits,
                # Redis's word when it answered (a tenant may be paused without a row).
                paused=(any(q.paused for q in data.queues) if data else bool(plan and plan.paused)),
                can_act=request.user.has_perm(PERM_ACT),
                plan_url=(
                    reverse("admin:fairqueue_tenantplan_change", args=[plan.pk]) if plan else ""
                ),
                account_url=(
                    account_url(plan.account_id, site=self.admin.admin_site.name)
                    if plan and plan.account_id
                    else ""
                ),
                add_plan_url=reverse("admin:fairqueue_tenantplan_add")
                + "?"
                + urlencode({"tenant_id": tenant_id}),
                action_urls={a: self._tenant_url(tenant_id, a) for a in ACTIONS},
                limits_url=self._tenant_url(tenant_id, "limits"),
                job_url_template=self.admin._url("job", "__type__", "__id__"),
                max_wait_ms=get_settings().max_wait_ms,
                max_wait=format_duration(get_settings().max_wait_ms),
            ),
        )

    # -- limits and weight --------------------------------------------------------------

    def limits_view(self, request: HttpRequest, tenant_id: str) -> HttpResponse:
        """Weight and limits, saved on the tenant's ``TenantPlan`` (its save signal
        stores them in Redis and releases or holds its jobs under them at once)."""
        require(request, PERM_VIEW, PERM_ACT)
        tenant_id = _tenant_or_404(tenant_id)
        plan = TenantPlan.objects.filter(tenant_id=tenant_id).first()
        if plan is None:
            messages.warning(
                request,
                "This tenant has no plan row: add one first (a row gives it a plan tier, "
                "which may change its jobs' level).",
            )
            return HttpResponseRedirect(self._tenant_url(tenant_id))
        form = LimitsForm(request.POST or None, instance=plan)
        if request.method == "POST" and form.is_valid():
            changed = list(form.changed_data)
            if changed:
                plan = form.save(commit=False)
                plan.full_clean()
                plan.save(update_fields=[*changed, "updated_at"])
                self._log(request, tenant_id, f"Changed {', '.join(changed)} from the console.")
                messages.success(
                    request,
                    f"Saved {', '.join(changed)}: its held jobs are released as the "
                    "limits allow now (a first limit holds its jobs in line too, a lowered "
                    "one its next jobs only); the weight counts at once for its level's "
                    "share and places its waiting jobs again.",
                )
            return HttpResponseRedirect(self._tenant_url(tenant_id))
        return self.admin._show(
            request,
            "fairqueue/tenant_limits.html",
            f"Weight and limits of {tenant_id}",
            ("tenants", self.admin._url("tenants")),
            (tenant_id, self._tenant_url(tenant_id)),
            ("weight and limits", None),
            page=LimitsPage(tenant_id=tenant_id, form=form, tenant_url=self._tenant_url(tenant_id)),
        )

    # -- actions ------------------------------------------------------------------------

    def action_view(self, request: HttpRequest, tenant_id: str, action: str) -> HttpResponse:
        require(request, PERM_VIEW, PERM_ACT)
        tenant_id = _tenant_or_404(tenant_id)
        if action not in ACTIONS:
            raise Http404("No such action")
        page_url = self._tenant_url(tenant_id)
        # back where the operator came from (the plan's admin page), else its page
        back = request.GET.get("next", "")
        if not url_has_allowed_host_and_scheme(
            back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            back = page_url
        if request.method == "POST":
            try:
                done = self._act(request, tenant_id, action)
            except BrokerError as exc:
                messages.error(request, f"Redis failed ({type(exc).__name__}): nothing more done.")
                return HttpResponseRedirect(back)
            messages.success(request, done)
            return HttpResponseRedirect(back)
        touches = self._touches(tenant_id, action)
        return self.admin._show(
            request,
            "fairqueue/tenant_confirm.html",
            f"{action.capitalize()} {tenant_id}?",
            ("tenants", self.admin._url("tenants")),
            (tenant_id, page_url),
            (action, None),
            page=ActionConfirm(
                touches=touches, action=action, tenant_id=tenant_id, tenant_url=back
            ),
        )

    def _touches(self, tenant_id: str, action: str) -> str:
        """What the action will touch, said on its confirmation page."""
        if action == "pause":
            return (
                "None of its jobs starts once this returns, in every queue: those no worker "
                "has taken go back to its held jobs, in their order; running jobs finish."
            )
        if action == "resume":
            return "Its held jobs are released in their order, as its other limits allow."
        sync = get_sync_broker()
        reads = sync.broker.console
        lines = []
        for job_type, queue in get_settings().queues.items():
            if action == "retry":
                jobs = sync.run(reads.tenant_jobs, queue, tenant_id)
                lines.append(
                    f"{job_type}: {jobs.failed_count} failed job(s) among the last "
                    f"{jobs.failed_read} failures"
                )
            else:
                ids = sync.run(reads.waiting_ids_of, queue, tenant_id)
                lines.append(f"{job_type}: {len(ids)} waiting or held job(s)")
        verb = (
            "Retry its failed jobs, each as a fair turn of its flow and within its limits"
            if action == "retry"
            else "Remove its jobs no worker has taken (waiting and held); running jobs finish"
        )
        return f"{verb}: " + "; ".join(lines) + "."

    def _act(self, request: HttpRequest, tenant_id: str, action: str) -> str:
        actor = request.user
        if action == "pause":
            moved = pause_tenant(tenant_id, actor=actor, source="console")
            return f"Paused {tenant_id}: {moved} of its job(s) taken back from the line."
        if action == "resume":
            released = resume_tenant(tenant_id, actor=actor, source="console")
            plan = TenantPlan.objects.filter(tenant_id=tenant_id).select_related("account").first()
            if plan is not None and plan.account_paused:
                return (
                    f"Resumed {tenant_id}'s own pause; its account {plan.account_id} is "
                    "paused, so its jobs stay held until the account is resumed."
                )
            return f"Resumed {tenant_id}: {released} held job(s) released at once."
        if action == "retry":
            queues: dict[str, str] = {}
            for job_type, queue in get_settings().queues.items():
                queues.setdefault(queue, job_type)
            retried = sum(retry_failed(jt, tenant_id=tenant_id) for jt in queues.values())
            self._log(request, tenant_id, f"Retried {retried} failed job(s) from the console.")
            return f"Retried {retried} failed job(s) of {tenant_id}, as fair turns."
        sync = get_sync_broker()
        reads = sync.broker.console
        removed = started = 0
        for queue in sorted(set(get_settings().queues.values())):
            ids = sync.run(reads.waiting_ids_of, queue, tenant_id)
            # each checked and removed in one script step: a job a worker took since it
            # was listed (running or ended) is left, counted as started
            done = sync.run(reads.remove_waiting, queue, tenant_id, ids)
            removed += done.removed
            started += done.started
        self._log(
            request,
            tenant_id,
            f"Removed {removed} waiting job(s) from the console ({started} had started).",
        )
        message = f"Removed {removed} waiting or held job(s) of {tenant_id}"
        if started:
            message += f"; {started} had already started (left to finish, or finished)"
        return message + "."

    def _log(self, request: HttpRequest, tenant_id: str, message: str) -> None:
        """An admin log row on the tenant's plan row, or on the dashboard when it has none."""
        plan = TenantPlan.objects.filter(tenant_id=tenant_id).first()
        model: Any = TenantPlan if plan else self.admin.model
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type=ContentType.objects.get_for_model(model, for_concrete_model=False),
            object_id=str(plan.pk) if plan else tenant_id[:200],
            object_repr=f"tenant {tenant_id}"[:200],
            action_flag=CHANGE,
            change_message=message,
        )
