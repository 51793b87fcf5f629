"""Admin for accounts, tenant plans, the subscription classifier and the override audit
log."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from fairqueue.conf import get_settings
from fairqueue.dashboard.admin_readonly import ReadOnlyAdmin
from fairqueue.dashboard.crumbs import trail
from fairqueue.dashboard.tenant_page import effective_level
from fairqueue.dashboard.tenant_routes import account_url, tenant_url
from fairqueue.dashboard.views import DashboardAdmin
from fairqueue.models import (
    PLAN_CHOICES,
    Account,
    ClassifierRule,
    Dashboard,
    OutboxJob,
    PriorityOverrideAudit,
    SubscriptionClassifier,
    TenantPauseAudit,
    TenantPlan,
)
from fairqueue.scheduling.limits import LIMIT_FIELDS, LIMIT_RANGES
from fairqueue.tenants import (
    pause_account,
    pause_tenant,
    resume_account,
    resume_tenant,
    retry_failed,
)


@admin.display(description="tenant", ordering="tenant_id")
def tenant_link(row: Any) -> str:
    """An audit row's tenant id, linked to its console page."""
    if not row.tenant_id:
        return "—"
    return format_html('<a href="{}">{}</a>', tenant_url(row.tenant_id), row.tenant_id)


def to_the_second(at: dt.datetime | None) -> str:
    """A time as the console shows times: UTC, to the second (the admin's own format
    stops at the minute, which hides the order of an audit's rows)."""
    return at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if at else "—"


class SetTierForm(forms.Form):
    plan_tier = forms.ChoiceField(choices=PLAN_CHOICES, label="New plan tier")


class LimitFormFields(admin.ModelAdmin):
    """A limit's form field takes the range the scripts accept (``LIMIT_RANGES``), and a
    value outside it is refused naming the field, the range and what empty means (a
    positive-integer field's own form said ">= 0")."""

    #: What an empty limit means on this model.
    empty_limit = "no limit"

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name in LIMIT_RANGES:
            low, high = LIMIT_RANGES[db_field.name]
            message = (
                f"{db_field.name} must be a whole number in {low:,}..{high:,}, or empty for "
                f"{self.empty_limit}"
            )
            kwargs.update(
                min_value=low,
                max_value=high,
                error_messages={"min_value": message, "max_value": message, "invalid": message},
            )
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    @admin.display(description="updated at", ordering="updated_at")
    def updated_to_the_second(self, row: Any) -> str:
        return to_the_second(row.updated_at)


@admin.register(Account)
class AccountAdmin(LimitFormFields):
    """Customers and their tenants. Changes are logged in the admin's history like a
    plan's; the id is fixed once saved (tenants name their account by it)."""

    list_display = (
        "account_id",
        "paused",
        "display_name",
        "plan_tier",
        "weight",
        *LIMIT_FIELDS,
        "quota_worker_seconds",
        "tenants_link",
        "console_link",
        "updated_to_the_second",
    )
    list_filter = ("plan_tier", "weight", "paused")
    search_fields = ("account_id", "display_name")
    readonly_fields = ("paused", "created_at", "updated_at")
    actions = ("pause", "resume")

    @admin.action(
        description="Pause selected accounts (no job of their tenants starts)",
        permissions=["change"],
    )
    def pause(self, request: HttpRequest, queryset: QuerySet[Account]) -> None:
        """POSTed with CSRF; audited on each tenant with this user."""
        for account in queryset:
            pause_account(account.account_id, actor=request.user, source="admin")
        self.message_user(request, f"Paused {queryset.count()} account(s).", level=messages.SUCCESS)

    @admin.action(description="Resume selected accounts", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Account]) -> None:
        for account in queryset:
            resume_account(account.account_id, actor=request.user, source="admin")
        self.message_user(
            request, f"Resumed {queryset.count()} account(s).", level=messages.SUCCESS
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Account]:
        return super().get_queryset(request).annotate(tenant_count=Count("tenants"))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None:
            return ("account_id", *self.readonly_fields)
        return self.readonly_fields

    @admin.display(description="tenants", ordering="tenant_count")
    def tenants_link(self, account: Any) -> str:
        """Its tenants, as the tenant plans' list filtered to it."""
        url = (
            reverse("admin:fairqueue_tenantplan_changelist")
            + "?"
            + urlencode({"account__exact": account.account_id})
        )
        return format_html('<a href="{}">{}</a>', url, account.tenant_count)

    @admin.display(description="console")
    def console_link(self, account: Account) -> str:
        """Its console page: its tenants' waiting and running jobs and shares."""
        return format_html('<a href="{}">its page</a>', account_url(account.account_id))


@admin.register(TenantPlan)
class TenantPlanAdmin(LimitFormFields):
    empty_limit = "no limit (or the plan tier's default)"
    # Paused right after the id: a wide list scrolls, and a paused tenant must not look
    # normal because its column is off screen.
    list_display = (
        "tenant_id",
        "paused",
        "display_name",
        "account",
        "plan_tier",
        "jobs_level",
        "weight",
        *LIMIT_FIELDS,
        "updated_to_the_second",
    )
    list_filter = ("plan_tier", "weight", "paused")
    search_fields = ("tenant_id", "display_name", "account__account_id")
    readonly_fields = ("paused", "created_at", "updated_at")
    # a search box, not a select of every customer; the list's tier column reads it
    autocomplete_fields = ("account",)
    list_select_related = ("account",)
    actions = ("set_tier", "pause", "resume", "retry_failed_jobs")
    change_form_template = "admin/fairqueue/tenantplan/change_form.html"

    @admin.display(description="level of its jobs")
    def jobs_level(self, plan: TenantPlan) -> str:
        """The level its jobs get by its plan, the classifier included (a tier-less
        tenant may be enterprise by its subscription)."""
        found = effective_level(plan)
        return format_html('<span title="{}">{}</span>', found.why, found.level)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        """Its console page and pause or resume (confirmed there, audited) beside the form."""
        plan = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if plan is not None:
            extra["console_url"] = tenant_url(plan.tenant_id, site=self.admin_site.name)
            action = "resume" if plan.paused else "pause"
            extra["pause_action"] = action
            # confirmed there, then back here
            extra["pause_url"] = (
                tenant_url(plan.tenant_id, action, site=self.admin_site.name)
                + "?"
                + urlencode({"next": request.get_full_path()})
            )
            from fairqueue.admin.usage_admin import CHART_DAYS, daily_usage
            from fairqueue.dashboard.charts import usage_chart

            days = daily_usage(plan.tenant_id)
            extra["usage_chart"] = usage_chart(days)
            extra["usage_days"] = CHART_DAYS
            extra["usage_total_s"] = sum(seconds for _, seconds in days)
            extra["usage_url"] = (
                reverse("admin:fairqueue_tenantusage_changelist")
                + "?"
                + urlencode({"q": plan.tenant_id})
            )
        return super().change_view(request, object_id, form_url, extra_context=extra)

    @admin.action(
        description="Pause selected tenants (no job of theirs starts)", permissions=["change"]
    )
    def pause(self, request: HttpRequest, queryset: QuerySet[TenantPlan]) -> None:
        """Admin actions are POSTed with CSRF; each pause is audited with this user."""
        for plan in queryset:
            pause_tenant(plan.tenant_id, actor=request.user, source="admin")
        self.message_user(request, f"Paused {queryset.count()} tenant(s).", level=messages.SUCCESS)

    @admin.action(description="Resume selected tenants", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[TenantPlan]) -> None:
        for plan in queryset:
            resume_tenant(plan.tenant_id, actor=request.user, source="admin")
        self.message_user(request, f"Resumed {queryset.count()} tenant(s).", level=messages.SUCCESS)

    @admin.action(
        description="Retry failed jobs of selected tenants (as fair turns, within limits)",
        permissions=["change"],
    )
    def retry_failed_jobs(self, request: HttpRequest, queryset: QuerySet[TenantPlan]) -> None:
        """``retry_failed`` for each selected tenant in every configured job type's
        queue (a queue shared by several job types is retried once)."""
        queues: dict[str, str] = {}
        for job_type, queue in get_settings().queues.items():
            queues.setdefault(queue, job_type)
        retried = sum(
            retry_failed(job_type, tenant_id=plan.tenant_id)
            for plan in queryset
            for job_type in queues.values()
        )
        self.message_user(
            request,
            f"Retried {retried} failed job(s) of {queryset.count()} tenant(s).",
            level=messages.SUCCESS,
        )

    @admin.action(description="Set plan tier of selected tenants", permissions=["change"])
    def set_tier(self, request: HttpRequest, queryset: QuerySet[TenantPlan]) -> Any:
        """Asks for the tier on a confirmation page (GET never changes anything)."""
        if "apply" in request.POST:
            form = SetTierForm(request.POST)
            if form.is_valid():
                tier = form.cleaned_data["plan_tier"]
                count = 0
                for plan in queryset:
                    plan.plan_tier = tier
                    # save() rather than update() so the cached plan is invalidated.
                    plan.save(update_fields=["plan_tier", "updated_at"])
                    count += 1
                self.message_user(
                    request, f"Set {count} tenant(s) to {tier}.", level=messages.SUCCESS
                )
                return None
        else:
            form = SetTierForm()
        return TemplateResponse(
            request,
            "admin/fairqueue/tenantplan/set_tier.html",
            {
                **self.admin_site.each_context(request),
                "title": "Set plan tier",
                "opts": self.model._meta,
                "queryset": queryset,
                "form": form,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
                # the admin's breadcrumbs in the markup the running Django styles
                **trail(
                    self.model._meta,
                    (
                        str(self.model._meta.verbose_name_plural).capitalize(),
                        reverse("admin:fairqueue_tenantplan_changelist"),
                    ),
                    ("Set plan tier", None),
                ),
            },
        )


class ClassifierRuleInline(admin.TabularInline):
    model = ClassifierRule
    extra = 1
    fields = ("position", "product_id", "plan_tier")
    ordering = ("position", "id")


@admin.register(SubscriptionClassifier)
class SubscriptionClassifierAdmin(admin.ModelAdmin):
    list_display = ("name", "default_tier", "is_active", "updated_at")
    list_filter = ("is_active",)
    inlines = (ClassifierRuleInline,)


class AuditAdmin(ReadOnlyAdmin):
    """An audit log: every field shown read-only, its time to the second."""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in self.model._meta.fields]

    @admin.display(description="at", ordering="created_at")
    def at_to_the_second(self, row: Any) -> str:
        return to_the_second(row.created_at)


@admin.register(PriorityOverrideAudit)
class PriorityOverrideAuditAdmin(AuditAdmin):
    """System-owned records: readable, never added, changed or deleted by anyone."""

    list_display = (
        "at_to_the_second",
        "source",
        "actor",
        "job_type",
        "job_link",
        tenant_link,
        "requested_override",
        "resolved_level",
        "rule",
    )
    list_filter = ("requested_override", "resolved_level", "rule", "job_type", "created_at")
    search_fields = ("tenant_id", "job_id", "source", "actor")
    date_hierarchy = "created_at"

    @admin.display(description="job id", ordering="job_id")
    def job_link(self, row: PriorityOverrideAudit) -> str:
        """The job's console page, while its job type is configured."""
        if not row.job_id or row.job_type not in get_settings().queues:
            return row.job_id or "—"
        url = reverse("admin:fairqueue_dashboard_job", args=[row.job_type, row.job_id])
        return format_html('<a href="{}">{}</a>', url, row.job_id)


@admin.register(TenantPauseAudit)
class TenantPauseAuditAdmin(AuditAdmin):
    """Who paused or resumed a tenant, and when: evidence, read-only."""

    list_display = ("at_to_the_second", tenant_link, "action", "actor", "source")
    list_filter = ("action", "created_at")
    search_fields = ("tenant_id", "actor", "source")


@admin.register(OutboxJob)
class OutboxJobAdmin(ReadOnlyAdmin):
    """Durable jobs waiting for the relay: readable (without the payload, which is user
    data), never added, changed or deleted by hand (deleting one would lose its job)."""

    list_display = ("created_at", "job_type", "bullmq_job_id", "level", "tries", "last_error")
    list_filter = ("job_type", "level", "tries")
    fields = (
        "created_at",
        "job_type",
        "queue",
        "job_id",
        "level",
        "tenant_weight",
        "delay_ms",
        "attempts",
        "tries",
        "last_error",
    )
    readonly_fields = fields


# The fair queue dashboard (views in fairqueue.dashboard.views), linked from the admin index.
admin.site.register(Dashboard, DashboardAdmin)
