"""The usage ledger in the admin: a list with filters, a date drill-down, totals of what
is shown and a CSV export; holds and their audit trail read-only (docs/usage.md)."""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.db.models import Max, QuerySet, Sum
from django.http import HttpRequest, HttpResponse

from fairqueue.dashboard.admin_readonly import ReadOnlyAdmin
from fairqueue.models.usage_models import HoldAudit, TenantHold, TenantUsage

_CSV_FIELDS = (
    "day",
    "tenant_id",
    "job_type",
    "attempts",
    "completed",
    "failed",
    "worker_ms",
    "wait_ms_total",
    "wait_ms_max",
)


#: Days the tenant plan page's usage chart shows.
CHART_DAYS = 30
#: Tenants the top consumers' list reads at most (the month's heaviest first), and how
#: many it shows per plan tier.
TOP_SCAN = 2_000
TOP_PER_TIER = 5
NO_PLAN = "no plan"
#: Accounts the usage list's account filter offers (the rest by URL).
ACCOUNTS_LISTED = 50


def daily_usage(tenant_id: str, *, days: int = CHART_DAYS) -> list[tuple[str, float]]:
    """The tenant's worker seconds per UTC day over its last ``days`` days (today
    included, every job type summed, days without usage at 0), oldest first."""
    from fairqueue.usage.holds import now

    today = now().astimezone(dt.UTC).date()
    first = today - dt.timedelta(days=days - 1)
    found = dict(
        TenantUsage.objects.filter(tenant_id=tenant_id, day__gte=first, day__lte=today)
        .values("day")
        .annotate(ms=Sum("worker_ms"))
        .values_list("day", "ms")
    )
    return [
        (day.isoformat(), (found.get(day) or 0) / 1000)
        for day in (first + dt.timedelta(days=i) for i in range(days))
    ]


def tiers_of(tenant_ids: Iterable[str]) -> dict[str, str]:
    """Each tenant's plan tier as its jobs get it (its tier, else its account's, else the
    classifier), or :data:`NO_PLAN`: one query for the plans (their accounts joined), one
    for the classifier."""
    from fairqueue.models import SubscriptionClassifier, TenantPlan
    from fairqueue.plans import PlanTier, get_subscription_classifier

    wanted = list(tenant_ids)
    out = dict.fromkeys(wanted, NO_PLAN)
    classifier = get_subscription_classifier()
    active: Any = ...
    for plan in TenantPlan.objects.filter(tenant_id__in=wanted).select_related("account"):
        if plan.plan_tier:
            out[plan.tenant_id] = plan.plan_tier
        elif plan.account is not None and plan.account.plan_tier:
            out[plan.tenant_id] = plan.account.plan_tier
        elif classifier is not None:
            out[plan.tenant_id] = classifier(plan.subscription) or NO_PLAN
        else:
            if active is ...:
                active = SubscriptionClassifier.objects.active()
            if active is None:
                out[plan.tenant_id] = (
                    PlanTier.PRO.value if plan.product_ids() else PlanTier.FREE.value
                )
            else:
                out[plan.tenant_id] = active.classify(plan.product_ids())
    return out


def top_consumers(*, per_tier: int = TOP_PER_TIER, scan: int = TOP_SCAN) -> list[dict[str, Any]]:
    """The heaviest tenants of each plan tier this month (UTC) by worker time: per tier
    (enterprise, pro, free, then tenants without a plan), at most ``per_tier`` rows of
    tenant, worker seconds, attempts and failed; among the ``scan`` heaviest tenants of
    the month."""
    from fairqueue.usage.holds import now
    from fairqueue.usage.quotas import period_bounds

    first, _ = period_bounds(now(), "month")
    rows = list(
        TenantUsage.objects.filter(day__gte=first)
        .values("tenant_id")
        .annotate(ms=Sum("worker_ms"), attempts=Sum("attempts"), failed=Sum("failed"))
        .order_by("-ms", "tenant_id")[:scan]
    )
    tiers = tiers_of(row["tenant_id"] for row in rows)
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        tier = tiers.get(row["tenant_id"], NO_PLAN)
        got = grouped.setdefault(tier, [])
        if len(got) < per_tier:
            got.append(
                {
                    "tenant_id": row["tenant_id"],
                    "worker_seconds": (row["ms"] or 0) / 1000,
                    "attempts": row["attempts"] or 0,
                    "failed": row["failed"] or 0,
                }
            )
    order = ["enterprise", "pro", "free"]
    ranked = sorted(grouped, key=lambda t: (order.index(t) if t in order else len(order), t))
    return [
        {"tier": tier, "month": first.strftime("%Y-%m"), "rows": grouped[tier]} for tier in ranked
    ]


@admin.action(description="Export selected usage as CSV")
def export_csv(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="tenant-usage.csv"'
    writer = csv.writer(response)
    writer.writerow(_CSV_FIELDS)
    for row in queryset.order_by("day", "tenant_id", "job_type").values_list(*_CSV_FIELDS):
        writer.writerow(row)
    return response


class AccountFilter(admin.SimpleListFilter):
    """The rows of one account's tenants (those it owns now), so the totals shown are
    the account's: ``?account=<account id>``; the first :data:`ACCOUNTS_LISTED` accounts
    by id are offered, any other is reached by its URL."""

    title = "account"
    parameter_name = "account"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        from fairqueue.models import Account

        ids = Account.objects.order_by("account_id").values_list("account_id", flat=True)
        return [(a, a) for a in ids[:ACCOUNTS_LISTED]]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        from fairqueue.models import TenantPlan

        account = self.value()
        if not account:
            return queryset
        tenants = TenantPlan.objects.filter(account__account_id=account).values("tenant_id")
        return queryset.filter(tenant_id__in=tenants)


@admin.register(TenantUsage)
class TenantUsageAdmin(admin.ModelAdmin):
    list_display = (
        "day",
        "tenant_id",
        "job_type",
        "attempts",
        "completed",
        "failed",
        "worker_seconds_shown",
        "wait_ms_max",
    )
    list_filter = ("job_type", "day", AccountFilter)
    search_fields = ("tenant_id",)
    date_hierarchy = "day"
    actions = [export_csv]
    change_list_template = "admin/fairqueue/tenantusage/change_list.html"
    readonly_fields = [field for field in _CSV_FIELDS] + ["updated_at"]
    exclude = ("segments",)

    @admin.display(description="worker seconds", ordering="worker_ms")
    def worker_seconds_shown(self, obj: TenantUsage) -> str:
        return f"{obj.worker_ms / 1000:.1f}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        response = super().changelist_view(request, extra_context)
        try:
            shown = response.context_data["cl"].queryset
        except (AttributeError, KeyError):  # a redirect, or an error page
            return response
        totals = shown.aggregate(
            attempts=Sum("attempts"),
            completed=Sum("completed"),
            failed=Sum("failed"),
            worker_ms=Sum("worker_ms"),
            wait_ms_max=Max("wait_ms_max"),
        )
        response.context_data["usage_totals"] = totals
        response.context_data["top_consumers"] = top_consumers()
        response.context_data["subtitle"] = (
            f"Totals of the rows shown: {totals['attempts'] or 0} attempts, "
            f"{totals['completed'] or 0} completed, {totals['failed'] or 0} failed, "
            f"{(totals['worker_ms'] or 0) / 1000:.1f} worker seconds"
        )
        return response


@admin.register(TenantHold)
class TenantHoldAdmin(ReadOnlyAdmin):
    list_display = ("tenant_id", "job_type", "reason", "action", "state", "created_at", "until")
    list_filter = ("reason", "action", "state")
    search_fields = ("tenant_id",)
    actions = ["close_breakers"]

    def has_close_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("fairqueue.change_tenanthold"))

    @admin.action(description="Close the selected breakers", permissions=["close"])
    def close_breakers(self, request: HttpRequest, queryset: QuerySet[TenantHold]) -> None:
        from fairqueue.usage.breaker import close_breaker

        rows = queryset.filter(reason=TenantHold.BREAKER, lifted_at__isnull=True)
        closed = 0
        for tenant_id, job_type in rows.values_list("tenant_id", "job_type").distinct():
            closed += close_breaker(tenant_id, job_type, actor=request.user, source="admin")
        skipped = queryset.count() - closed
        message = f"{closed} breaker(s) closed"
        if skipped:
            message += f"; {skipped} selected row(s) were not open breakers"
        self.message_user(request, message, messages.SUCCESS if closed else messages.WARNING)


@admin.register(HoldAudit)
class HoldAuditAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "tenant_id", "job_type", "reason", "event", "actor", "why")
    list_filter = ("reason", "event")
    search_fields = ("tenant_id",)
    date_hierarchy = "created_at"
