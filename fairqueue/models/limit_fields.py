"""The fields a tenant plan and an account share: weight, limits and quota, each built
from the one declaration the scripts read (``scheduling.limits.LIMITS``), and the checks
that refuse a value outside it with a message naming the field, the value and the range."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from fairqueue.scheduling.levels import (
    DEFAULT_TENANT_WEIGHT,
    MAX_TENANT_WEIGHT,
    MIN_TENANT_WEIGHT,
)
from fairqueue.scheduling.limits import LIMIT_RANGES

#: A quota's worker seconds per period, at most.
MAX_QUOTA_WORKER_SECONDS = 1_000_000_000
QUOTA_PERIOD_CHOICES = [("day", "Day"), ("month", "Month")]


def limit_field(name: str, help_text: Any) -> models.PositiveIntegerField:
    """A limit: empty for the plan tier's default (tenants) or none, else within the
    range the scripts accept (``LIMIT_RANGES``)."""
    return models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(LIMIT_RANGES[name][1])],
        help_text=help_text,
    )


def weight_field(help_text: Any) -> models.PositiveSmallIntegerField:
    return models.PositiveSmallIntegerField(
        default=DEFAULT_TENANT_WEIGHT,
        validators=[MinValueValidator(MIN_TENANT_WEIGHT), MaxValueValidator(MAX_TENANT_WEIGHT)],
        help_text=help_text,
    )


def weight_range(table: str) -> models.CheckConstraint:
    """Also for rows written around full_clean() (update(), bulk_create, raw SQL): a
    weight of 0 would mean a tenant or an account that is never served."""
    return models.CheckConstraint(
        condition=models.Q(weight__gte=MIN_TENANT_WEIGHT) & models.Q(weight__lte=MAX_TENANT_WEIGHT),
        name=f"fairqueue_{table}_weight_range",
    )


def quota_seconds_field(help_text: Any) -> models.PositiveIntegerField:
    return models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_QUOTA_WORKER_SECONDS)],
        help_text=help_text,
    )


def quota_period_field(help_text: Any) -> models.CharField:
    return models.CharField(
        max_length=5, blank=True, choices=QUOTA_PERIOD_CHOICES, help_text=help_text
    )


def limit_errors(row: models.Model, exclude: set[str], *, empty: str) -> dict[str, list[str]]:
    """The limits of ``row`` outside ``LIMIT_RANGES``, each refused by a message that
    names the limit, the value and the whole allowed range (``empty``: what an empty
    field means on this model)."""
    errors: dict[str, list[str]] = {}
    for name, (low, high) in LIMIT_RANGES.items():
        value = getattr(row, name)
        if name in exclude or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            errors[name] = [
                f"{name}={value!r} is not allowed: expected a whole number in "
                f"{low}..{high}, or empty for {empty}"
            ]
    return errors


def clean_limit_fields(
    row: models.Model, exclude: Any, parent_clean_fields: Any, *, empty: str
) -> None:
    """``clean_fields`` for a model with limits: Django's checks (``parent_clean_fields``),
    with the limit checks' messages in place of its own for those fields."""
    excluded = set(exclude or ())
    errors = limit_errors(row, excluded, empty=empty)
    try:
        parent_clean_fields(exclude=excluded | set(errors))
    except ValidationError as exc:
        errors.update(exc.message_dict)
    if errors:
        raise ValidationError(errors)


def check_rate_pair(row: models.Model) -> None:
    """A rate limit needs both its count and its window."""
    if (row.rate_max is None) != (row.rate_duration_ms is None):
        raise ValidationError(
            {"rate_duration_ms": _("Set both rate_max and rate_duration_ms, or neither.")}
        )
