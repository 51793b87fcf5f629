"""The usage ledger's rows, and the holds and demotions of quotas and the breaker with
their audit trail (imported by ``fairqueue.models``; docs/usage.md)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from fairqueue.scheduling.levels import MAX_TENANT_ID_LENGTH


class TenantUsage(models.Model):
    """What one tenant's jobs of one type consumed on one UTC day.

    Written by the rebalance loop from the day's cumulative counters in Redis, as
    absolute values per epoch (a Redis lifetime of the day's counters): writing a row
    again changes nothing, so a loop killed between Redis and the database never counts
    an attempt twice. ``segments`` keeps each epoch's counters; the columns are their
    totals."""

    tenant_id = models.CharField(max_length=MAX_TENANT_ID_LENGTH)
    job_type = models.CharField(max_length=200)
    day = models.DateField(help_text=_("The UTC day."))
    attempts = models.PositiveBigIntegerField(default=0, help_text=_("Attempts started."))
    completed = models.PositiveBigIntegerField(default=0)
    failed = models.PositiveBigIntegerField(
        default=0, help_text=_("Attempts that failed, retried ones included.")
    )
    worker_ms = models.PositiveBigIntegerField(
        default=0, help_text=_("Worker time of the attempts that ended, in milliseconds.")
    )
    wait_ms_total = models.PositiveBigIntegerField(
        default=0, help_text=_("Total wait of first attempts, ready to start (ms).")
    )
    wait_ms_max = models.PositiveBigIntegerField(default=0, help_text=_("Longest wait (ms)."))
    #: epoch -> [attempts, completed, failed, worker ms, wait ms total, wait ms max]
    segments = models.JSONField(default=dict, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-day", "tenant_id", "job_type"]
        verbose_name = _("tenant usage")
        verbose_name_plural = _("tenant usage")
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "job_type", "day"], name="fairqueue_usage_unique_day"
            )
        ]
        indexes = [models.Index(fields=["day", "tenant_id"], name="fairqueue_usage_day")]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.job_type} {self.day}"

    @property
    def worker_seconds(self) -> float:
        return self.worker_ms / 1000


class TenantHold(models.Model):
    """A quota's demotion or hold, or an open breaker, while it is in force (``lifted_at``
    empty). Quotas apply to every job type (``job_type`` empty); a breaker to one."""

    QUOTA = "quota"
    BREAKER = "breaker"
    DEMOTE = "demote"
    HOLD = "hold"
    OPEN = "open"
    PROBE = "probe"
    REASONS: ClassVar = [(QUOTA, "Quota"), (BREAKER, "Breaker")]

    tenant_id = models.CharField(max_length=MAX_TENANT_ID_LENGTH, db_index=True)
    job_type = models.CharField(max_length=200, blank=True)
    reason = models.CharField(max_length=10, choices=REASONS)
    action = models.CharField(max_length=10, choices=[(DEMOTE, "Demote"), (HOLD, "Hold")])
    #: A breaker: open (held), or probe (one job released to try).
    state = models.CharField(max_length=10, default=OPEN)
    created_at = models.DateTimeField()
    #: A quota: when its period ends. A breaker: when its cool-off ends (then a probe).
    until = models.DateTimeField(null=True, blank=True)
    lifted_at = models.DateTimeField(null=True, blank=True)
    #: A breaker probing: the job released as its probe, and its attempts made then.
    probe_job_id = models.CharField(max_length=200, blank=True)
    probe_attempts = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "job_type", "reason"],
                condition=models.Q(lifted_at__isnull=True),
                name="fairqueue_hold_one_active",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.reason} {self.action}"


class HoldAudit(models.Model):
    """Every transition of a quota or a breaker: who or what, when, why. Written with the
    transition; read-only in the admin."""

    created_at = models.DateTimeField(db_index=True)
    tenant_id = models.CharField(max_length=MAX_TENANT_ID_LENGTH, db_index=True)
    job_type = models.CharField(max_length=200, blank=True)
    reason = models.CharField(max_length=10, choices=TenantHold.REASONS)
    #: exceeded, period_ended, lifted, opened, probe, closed, reopened
    event = models.CharField(max_length=20)
    action = models.CharField(max_length=10, blank=True)
    actor = models.CharField(max_length=200, blank=True)
    why = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = _("quota and breaker audit record")

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.reason} {self.event}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ValueError("HoldAudit records are immutable")
        super().save(*args, **kwargs)
