"""Accounts, tenant plans, the subscription classifier, the override audit log, and the
dashboard's permission holder (the outbox is in ``outbox_models``). The enqueue path
reads plans through :mod:`fairqueue.enqueue.lookups`' caches, never these rows directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from django.core.exceptions import ValidationError
from django.db import models
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from fairqueue.exceptions import InvalidAccountError, InvalidPlanError, InvalidTenantError
from fairqueue.models.limit_fields import (
    check_rate_pair,
    clean_limit_fields,
    limit_field,
    quota_period_field,
    quota_seconds_field,
    weight_field,
    weight_range,
)
from fairqueue.plans import PlanTier, get_subscription_classifier, parse_plan
from fairqueue.scheduling.levels import (
    MAX_TENANT_ID_LENGTH,
    MAX_TENANT_WEIGHT,
    MIN_TENANT_WEIGHT,
    validate_account_id,
    validate_tenant_id,
)
from fairqueue.scheduling.limits import LIMIT_FIELDS, TenantLimits

PLAN_CHOICES: Final = [(tier.value, tier.value.title()) for tier in PlanTier]
LEVEL_CHOICES: Final = [
    ("critical", "Critical"),
    ("high", "High"),
    ("normal", "Normal"),
    ("low", "Low"),
]


class Account(models.Model):
    """A customer: the unit that pays, owning any number of tenants (workspaces,
    projects, stores). Its tier is its tenants' unless a tenant's own plan names one;
    its limits hold over all its tenants together, beside each tenant's own
    (docs/concepts.md#accounts)."""

    account_id = models.CharField(max_length=MAX_TENANT_ID_LENGTH, unique=True)
    display_name = models.CharField(max_length=200, blank=True)
    plan_tier = models.CharField(
        max_length=20,
        choices=PLAN_CHOICES,
        blank=True,
        help_text=_(
            "The tier of its tenants that set none of their own; empty: each tenant's own "
            "plan or subscription decides."
        ),
    )
    weight = weight_field(
        format_lazy(
            _(
                "Its weight among the accounts of a level, {low} to {high}, for the fair "
                "order by account (docs/design.md, Accounts)."
            ),
            low=MIN_TENANT_WEIGHT,
            high=MAX_TENANT_WEIGHT,
        )
    )
    paused = models.BooleanField(
        default=False,
        editable=False,
        help_text=_(
            "Set by pause_account / resume_account (audited on each of its tenants): none "
            "of its tenants' jobs starts while it is paused."
        ),
    )
    # Limits over all its tenants together, per queue (empty: none); each tenant's own
    # limits hold as well.
    max_active = limit_field(
        "max_active", _("At most this many jobs of all its tenants running at once, per queue.")
    )
    rate_max = limit_field(
        "rate_max", _("At most this many jobs of all its tenants started per rate duration.")
    )
    rate_duration_ms = limit_field(
        "rate_duration_ms",
        _("The rate limit's window in milliseconds (1000: rate_max per second)."),
    )
    max_waiting = limit_field(
        "max_waiting",
        _("An enqueue that would put more jobs of all its tenants waiting is refused."),
    )
    quota_worker_seconds = quota_seconds_field(
        _("Worker seconds per quota period over all its tenants; empty for none.")
    )
    quota_period = quota_period_field(_("The quota's period; empty for a day."))
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["account_id"]
        constraints = [weight_range("account")]

    def __str__(self) -> str:
        return self.display_name or self.account_id

    def clean_fields(self, exclude: Any = None) -> None:
        clean_limit_fields(self, exclude, super().clean_fields, empty="no limit")

    def clean(self) -> None:
        try:
            validate_account_id(self.account_id)
        except InvalidAccountError as exc:
            raise ValidationError({"account_id": str(exc)}) from None
        if self.plan_tier:
            try:
                parse_plan(self.plan_tier, argument="plan_tier")
            except InvalidPlanError as exc:
                raise ValidationError({"plan_tier": str(exc)}) from None
        check_rate_pair(self)

    def limits(self) -> TenantLimits:
        """Its limits over all its tenants (its pause is each tenant's, not these)."""
        return TenantLimits(**{name: getattr(self, name) for name in LIMIT_FIELDS})


class TenantPlan(models.Model):
    """A tenant's plan tier, set by hand, inherited from its account or derived from its
    subscription."""

    tenant_id = models.CharField(max_length=MAX_TENANT_ID_LENGTH, unique=True)
    display_name = models.CharField(max_length=200, blank=True)
    plan_tier = models.CharField(
        max_length=20,
        choices=PLAN_CHOICES,
        blank=True,
        help_text=_("Leave empty to classify the tenant by its subscription."),
    )
    subscription = models.JSONField(
        default=dict,
        blank=True,
        help_text=_('Billing data, e.g. {"products": [{"subscriptionProductId": "prod_x"}]}.'),
    )
    weight = weight_field(
        format_lazy(
            _(
                "Share of turns inside the tenant's priority level, {low} to {high}: a "
                "tenant of weight 3 is served 3 jobs per round for every job of a weight-1 "
                "tenant on the same level. It does not change the level."
            ),
            low=MIN_TENANT_WEIGHT,
            high=MAX_TENANT_WEIGHT,
        )
    )
    # PROTECT: deleting a customer must not silently change its tenants' tier; the
    # string id is the column, so the lookups read it without a join.
    account = models.ForeignKey(
        Account,
        to_field="account_id",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="tenants",
        help_text=_("The customer this tenant belongs to (at most one); empty: none."),
    )
    # Limits (empty: the plan tier's default from FAIRQUEUE['TENANT_LIMITS'], else none).
    max_active = limit_field(
        "max_active", _("At most this many of the tenant's jobs running at once, per queue.")
    )
    rate_max = limit_field(
        "rate_max", _("At most this many of its jobs started per rate duration (with it).")
    )
    rate_duration_ms = limit_field(
        "rate_duration_ms",
        _("The rate limit's window in milliseconds (1000: rate_max per second)."),
    )
    max_waiting = limit_field(
        "max_waiting", _("An enqueue that would put more of its jobs waiting is refused.")
    )
    # Quota (empty: the plan tier's FAIRQUEUE['QUOTAS'], docs/usage.md).
    quota_worker_seconds = quota_seconds_field(
        _("Worker seconds per quota period; empty for the plan tier's quota.")
    )
    quota_period = quota_period_field(
        _("The quota's period; empty for the plan tier's (else a day).")
    )
    paused = models.BooleanField(
        default=False,
        editable=False,
        help_text=_("Set by pause_tenant / resume_tenant (audited), not edited directly."),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant_id"]
        constraints = [weight_range("tenantplan")]

    def __str__(self) -> str:
        return self.display_name or self.tenant_id

    def clean_fields(self, exclude: Any = None) -> None:
        clean_limit_fields(
            self, exclude, super().clean_fields, empty="no limit (or the plan tier's default)"
        )

    def clean(self) -> None:
        try:
            validate_tenant_id(self.tenant_id, none_allowed=False)
        except InvalidTenantError as exc:
            raise ValidationError({"tenant_id": str(exc)}) from None
        if self.plan_tier:
            try:
                parse_plan(self.plan_tier, argument="plan_tier")
            except InvalidPlanError as exc:
                raise ValidationError({"plan_tier": str(exc)}) from None
        if not isinstance(self.subscription, dict):
            raise ValidationError({"subscription": _("Expected a JSON object.")})
        check_rate_pair(self)

    def own_limits(self) -> TenantLimits:
        """The limits set on this row (empty fields: the plan tier's default applies)."""
        return TenantLimits(
            **{name: getattr(self, name) for name in LIMIT_FIELDS},
            # its account's pause holds it too (docs/limits.md#accounts)
            paused=self.paused or self.account_paused,
        )

    @property
    def account_paused(self) -> bool:
        """Whether its account is paused (``pause_account``)."""
        return self.account_id is not None and self.account is not None and self.account.paused

    def product_ids(self) -> list[str]:
        """Product ids of the subscription, in the order billing lists them."""
        products = (self.subscription or {}).get("products") or []
        return [
            str(product.get("subscriptionProductId"))
            for product in products
            if isinstance(product, dict) and product.get("subscriptionProductId")
        ]

    def resolve_plan(self) -> str | None:
        """The explicit tier, else its account's, else the code-level classifier, else
        the database rules. The account's tier comes before the classifier: the default
        rules classify every tenant (free without products), so after them an account's
        tier would never apply."""
        if self.plan_tier:
            return self.plan_tier
        if self.account_id is not None and self.account is not None and self.account.plan_tier:
            return self.account.plan_tier
        classifier = get_subscription_classifier()
        if classifier is not None:
            return classifier(self.subscription)
        active = SubscriptionClassifier.objects.active()
        if active is None:
            return PlanTier.PRO.value if self.product_ids() else PlanTier.FREE.value
        return active.classify(self.product_ids())


class SubscriptionClassifierQuerySet(models.QuerySet):
    def active(self) -> SubscriptionClassifier | None:
        return self.filter(is_active=True).prefetch_related("rules").order_by("-updated_at").first()


class SubscriptionClassifier(models.Model):
    """Ordered rules that turn a subscription's products into a plan tier.

    The first rule whose product id appears in the subscription wins; a rule with an
    empty product id matches any subscription that has at least one product. With no
    match the default tier applies. The newest active classifier is used.
    """

    name = models.CharField(max_length=100, unique=True)
    default_tier = models.CharField(max_length=20, choices=PLAN_CHOICES, default="free")
    is_active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SubscriptionClassifierQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def classify(self, product_ids: Sequence[str]) -> str:
        products = set(product_ids)
        for rule in self.rules.all():
            if (rule.product_id and rule.product_id in products) or (
                not rule.product_id and products
            ):
                return rule.plan_tier
        return self.default_tier


class ClassifierRule(models.Model):
    classifier = models.ForeignKey(
        SubscriptionClassifier, on_delete=models.CASCADE, related_name="rules"
    )
    position = models.PositiveIntegerField(default=0, help_text=_("Lower runs first."))
    product_id = models.CharField(
        max_length=255, blank=True, help_text=_("Empty matches any subscription with products.")
    )
    plan_tier = models.CharField(max_length=20, choices=PLAN_CHOICES)

    class Meta:
        ordering = ["position", "id"]

    def __str__(self) -> str:
        return f"{self.product_id or '*'} -> {self.plan_tier}"


class PriorityOverrideAudit(models.Model):
    """One enqueue that chose its priority by hand; never changed or deleted afterwards.

    Written by the enqueue service in the same transaction as the job's outbox row
    (durable enqueue), or before the job is added to Redis and rolled back if the add
    fails (direct enqueue)."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    job_type = models.CharField(max_length=200)
    queue = models.CharField(max_length=200)
    job_id = models.CharField(max_length=255, blank=True)
    tenant_id = models.CharField(
        max_length=MAX_TENANT_ID_LENGTH, blank=True, help_text=_("Empty for internal jobs.")
    )
    requested_override = models.CharField(max_length=20, choices=LEVEL_CHOICES, blank=True)
    requested_level = models.CharField(max_length=20, choices=LEVEL_CHOICES, blank=True)
    requested_priority = models.IntegerField(null=True, blank=True)
    resolved_level = models.CharField(max_length=20, choices=LEVEL_CHOICES)
    numeric_priority = models.PositiveIntegerField()
    rule = models.CharField(max_length=40)
    source = models.CharField(max_length=200, blank=True)
    actor = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = _("priority override audit record")

    def __str__(self) -> str:
        return f"{self.job_type}#{self.job_id} -> {self.resolved_level}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ValueError("PriorityOverrideAudit records are immutable")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("PriorityOverrideAudit records are immutable")


class Dashboard(models.Model):
    """Holds the dashboard's permissions; no table (like django-rq's ``Dashboard``)."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_dashboard", "Can view the fair queue dashboard"),
            ("run_rebalance", "Can run a rebalance pass from the dashboard"),
            ("view_job_payload", "Can view job payloads on the dashboard"),
        ]

    def __str__(self) -> str:
        return "Fair queue dashboard"


class TenantPauseAudit(models.Model):
    """Who paused or resumed a tenant, and when: a pause stops a customer's work, so it
    is recorded like a priority override. Written by ``pause_tenant`` / ``resume_tenant``
    only; read-only in the admin."""

    PAUSED = "paused"
    RESUMED = "resumed"

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    tenant_id = models.CharField(max_length=MAX_TENANT_ID_LENGTH, db_index=True)
    action = models.CharField(max_length=10, choices=[(PAUSED, "Paused"), (RESUMED, "Resumed")])
    actor = models.CharField(max_length=200, blank=True)
    source = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.action} by {self.actor or '?'}"
