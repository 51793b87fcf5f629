"""Tenant plans, the subscription classifier, the override audit log, and the
dashboard's permission holder.

The plan and weight lookups used on the enqueue hot path (:func:`lookup_tenant_plan`,
:func:`lookup_tenant_weight`) read one cache entry per tenant through the Django cache:
one cache round trip per lookup, no database query, and entries are invalidated by the
signal receivers in ``fairqueue.signals`` when a plan, a weight or a rule changes.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, Final

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from fairqueue.exceptions import InvalidAccountError, InvalidPlanError, InvalidTenantError
from fairqueue.plans import PlanTier, get_subscription_classifier, parse_plan
from fairqueue.scheduling.levels import (
    DEFAULT_TENANT_WEIGHT,
    MAX_TENANT_ID_LENGTH,
    MAX_TENANT_WEIGHT,
    MIN_TENANT_WEIGHT,
    validate_account_id,
    validate_tenant_id,
)
from fairqueue.scheduling.limits import LIMIT_FIELDS, LIMIT_RANGES, TenantLimits

PLAN_CHOICES: Final = [(tier.value, tier.value.title()) for tier in PlanTier]
LEVEL_CHOICES: Final = [
    ("critical", "Critical"),
    ("high", "High"),
    ("normal", "Normal"),
    ("low", "Low"),
]


def _limit_field(name: str, help_text: Any) -> models.PositiveIntegerField:
    """A tenant limit: empty for the plan tier's default (``FAIRQUEUE['TENANT_LIMITS']``)
    or none, else within the range the scripts accept (``LIMIT_RANGES``)."""
    return models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(LIMIT_RANGES[name][1])],
        help_text=help_text,
    )


def _weight_field(help_text: Any) -> models.PositiveSmallIntegerField:
    return models.PositiveSmallIntegerField(
        default=DEFAULT_TENANT_WEIGHT,
        validators=[MinValueValidator(MIN_TENANT_WEIGHT), MaxValueValidator(MAX_TENANT_WEIGHT)],
        help_text=help_text,
    )


def _weight_range(table: str) -> models.CheckConstraint:
    """Also for rows written around full_clean() (update(), bulk_create, raw SQL): a
    weight of 0 would mean a tenant or an account that is never served."""
    return models.CheckConstraint(
        condition=models.Q(weight__gte=MIN_TENANT_WEIGHT) & models.Q(weight__lte=MAX_TENANT_WEIGHT),
        name=f"fairqueue_{table}_weight_range",
    )


class Account(models.Model):
    """A customer: the unit that pays, owning any number of tenants (workspaces,
    projects, stores). Its tier is its tenants' unless a tenant's own plan names one
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
    weight = _weight_field(
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
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["account_id"]
        constraints = [_weight_range("account")]

    def __str__(self) -> str:
        return self.display_name or self.account_id

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
    weight = _weight_field(
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
    max_active = _limit_field(
        "max_active", _("At most this many of the tenant's jobs running at once, per queue.")
    )
    rate_max = _limit_field(
        "rate_max", _("At most this many of its jobs started per rate duration (with it).")
    )
    rate_duration_ms = _limit_field(
        "rate_duration_ms",
        _("The rate limit's window in milliseconds (1000: rate_max per second)."),
    )
    max_waiting = _limit_field(
        "max_waiting", _("An enqueue that would put more of its jobs waiting is refused.")
    )
    # Quota (empty: the plan tier's FAIRQUEUE['QUOTAS'], docs/usage.md).
    quota_worker_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(1_000_000_000)],
        help_text=_("Worker seconds per quota period; empty for the plan tier's quota."),
    )
    quota_period = models.CharField(
        max_length=5,
        blank=True,
        choices=[("day", "Day"), ("month", "Month")],
        help_text=_("The quota's period; empty for the plan tier's (else a day)."),
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
        constraints = [_weight_range("tenantplan")]

    def __str__(self) -> str:
        return self.display_name or self.tenant_id

    def clean_fields(self, exclude: Any = None) -> None:
        """Django's checks, with a limit outside ``LIMIT_RANGES`` refused by a message that
        names the limit, the value and the whole allowed range."""
        exclude = set(exclude or ())
        errors: dict[str, list[str]] = {}
        for name, (low, high) in LIMIT_RANGES.items():
            value = getattr(self, name)
            if name in exclude or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                errors[name] = [
                    f"{name}={value!r} is not allowed: expected a whole number in "
                    f"{low}..{high}, or empty for no limit (or the plan tier's default)"
                ]
        try:
            super().clean_fields(exclude=exclude | set(errors))
        except ValidationError as exc:
            errors.update(exc.message_dict)
        if errors:
            raise ValidationError(errors)

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
        if (self.rate_max is None) != (self.rate_duration_ms is None):
            raise ValidationError(
                {"rate_duration_ms": _("Set both rate_max and rate_duration_ms, or neither.")}
            )

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


#: BullMQ job id of an outbox row without a caller's ``job_id`` (never all digits, which
#: BullMQ reserves for its own counter).
OUTBOX_JOB_ID_PREFIX: Final = "fq-outbox-"
#: Random bytes of such an id (hex): 128 bits, so no two rows ever share one.
OUTBOX_JOB_ID_BYTES: Final = 16


def new_outbox_job_id() -> str:
    """A fresh BullMQ job id for an outbox row without a caller's ``job_id``.

    Random, not the row's primary key: a primary key comes back after ``manage.py
    flush`` (which resets sequences), a point-in-time restore, or on another database
    (``using=``), while BullMQ keeps finished jobs for a day; an id that came back would
    make the relay take the earlier job for this row's and drop this one.
    """
    return f"{OUTBOX_JOB_ID_PREFIX}{secrets.token_hex(OUTBOX_JOB_ID_BYTES)}"


class OutboxJob(models.Model):
    """A job waiting to be added to BullMQ: written in the caller's transaction by a
    durable enqueue, moved to Redis by the relay (``fairqueue.enqueue.outbox``) and deleted only
    once Redis has it.

    The row holds the job exactly as the direct path would add it (payload with
    ``tenantId`` and ``priorityLevel`` merged in, level, tenant bucket and weight), so
    the relay places it with the same add script. Its BullMQ job id is the caller's
    ``job_id`` or a random ``fq-outbox-<hex>`` chosen at enqueue (rows written before
    migration 0005 have none stored and use ``fq-outbox-<pk>``): a relay that crashed
    after the add and retries adds nothing twice (BullMQ keeps the existing job of an
    existing id, and the relay checks that it is this row's job).
    """

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    job_type = models.CharField(max_length=200)
    queue = models.CharField(max_length=200)
    job_id = models.CharField(
        max_length=255,
        blank=True,
        help_text=_(
            "The BullMQ job id: the caller's, or fq-outbox-<random hex> chosen at enqueue "
            "(empty on rows written before 0005: fq-outbox-<id>)."
        ),
    )
    #: The payload's JSON, ASCII-escaped (as json.dumps writes it), so any database
    #: stores it unchanged.
    data = models.TextField()
    level = models.CharField(max_length=20, choices=LEVEL_CHOICES)
    tenant = models.CharField(max_length=MAX_TENANT_ID_LENGTH)
    tenant_weight = models.PositiveSmallIntegerField(default=DEFAULT_TENANT_WEIGHT)
    delay_ms = models.BigIntegerField(null=True, blank=True)
    attempts = models.PositiveIntegerField(null=True, blank=True)
    #: BullMQ's backoff option (``{"type": ..., "delay": ms}``), or null.
    backoff = models.JSONField(null=True, blank=True)
    #: The caller's cost= (expected worker time, ms), or null.
    cost_ms = models.PositiveIntegerField(null=True, blank=True)
    #: Relay attempts that Redis refused (not outages); such rows go behind the others.
    tries = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=200, blank=True)
    #: A refused row is not tried again before this time (its own backoff, doubling
    #: with its tries: fairqueue.enqueue.outbox.retry_delay); null: at the next relay.
    retry_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tries", "id"]
        indexes = [
            models.Index(fields=["tries", "id"], name="fairqueue_outbox_order"),
            # Admission and max_waiting count a flow's rows on every durable enqueue.
            models.Index(fields=["queue", "tenant"], name="fairqueue_outbox_flow"),
        ]
        verbose_name = _("outbox job")

    def __str__(self) -> str:
        return f"{self.job_type}#{self.bullmq_job_id}"

    @property
    def bullmq_job_id(self) -> str:
        """The id the relay adds this job under."""
        return self.job_id or f"{OUTBOX_JOB_ID_PREFIX}{self.pk}"


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
