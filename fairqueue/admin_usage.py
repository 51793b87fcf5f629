"""The usage ledger in the admin: a list with filters, a date drill-down, totals of what
is shown and a CSV export; holds and their audit trail read-only (docs/usage.md)."""

from __future__ import annotations

import csv
from typing import Any

from django.contrib import admin, messages
from django.db.models import Max, QuerySet, Sum
from django.http import HttpRequest, HttpResponse

from fairqueue.usage_models import HoldAudit, TenantHold, TenantUsage

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


@admin.action(description="Export selected usage as CSV")
def export_csv(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="tenant-usage.csv"'
    writer = csv.writer(response)
    writer.writerow(_CSV_FIELDS)
    for row in queryset.order_by("day", "tenant_id", "job_type").values_list(*_CSV_FIELDS):
        writer.writerow(row)
    return response


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
    list_filter = ("job_type", "day")
    search_fields = ("tenant_id",)
    date_hierarchy = "day"
    actions = [export_csv]
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
        response.context_data["subtitle"] = (
            f"Totals of the rows shown: {totals['attempts'] or 0} attempts, "
            f"{totals['completed'] or 0} completed, {totals['failed'] or 0} failed, "
            f"{(totals['worker_ms'] or 0) / 1000:.1f} worker seconds"
        )
        return response


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(TenantHold)
class TenantHoldAdmin(_ReadOnly):
    list_display = ("tenant_id", "job_type", "reason", "action", "state", "created_at", "until")
    list_filter = ("reason", "action", "state")
    search_fields = ("tenant_id",)
    actions = ["close_breakers"]

    def has_close_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("fairqueue.change_tenanthold"))

    @admin.action(description="Close the selected breakers", permissions=["close"])
    def close_breakers(self, request: HttpRequest, queryset: QuerySet[TenantHold]) -> None:
        from fairqueue.breaker import close_breaker

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
class HoldAuditAdmin(_ReadOnly):
    list_display = ("created_at", "tenant_id", "job_type", "reason", "event", "actor", "why")
    list_filter = ("reason", "event")
    search_fields = ("tenant_id",)
    date_hierarchy = "created_at"
