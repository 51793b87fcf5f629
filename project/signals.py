"""The pattern for enqueuing from a model signal.

Use ``enqueue_on_commit`` so the job is added only if the transaction that saved the
row commits: a rolled-back save leaves no job pointing at a row that never existed, and
a worker never picks up the job before the row is visible to it.
"""

from typing import Any

from django.db.models.signals import post_save
from django.dispatch import receiver

from fairqueue.enqueue.api import enqueue_on_commit

from .models import Invoice


@receiver(post_save, sender=Invoice)
def send_invoice_email(sender: type, instance: Invoice, created: bool, **kwargs: Any) -> None:
    if created:
        enqueue_on_commit(
            "email",
            {"invoice_id": instance.pk, "template": "invoice"},
            tenant_id=instance.tenant_id,
            source="Invoice post_save",
        )
