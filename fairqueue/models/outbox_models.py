"""The outbox: jobs written in the caller's transaction by a durable enqueue, waiting
for the relay to add them to BullMQ (``fairqueue.enqueue.outbox``)."""

from __future__ import annotations

import secrets
from typing import Final

from django.db import models
from django.utils.translation import gettext_lazy as _

from fairqueue.models.core_models import LEVEL_CHOICES
from fairqueue.scheduling.levels import DEFAULT_TENANT_WEIGHT, MAX_TENANT_ID_LENGTH

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
