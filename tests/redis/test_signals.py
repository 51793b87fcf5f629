"""The demo project's post_save + enqueue_on_commit example."""

import json

import pytest
from django.db import transaction

from project.models import Invoice

pytestmark = pytest.mark.django_db(transaction=True)


def test_saved_invoice_enqueues_its_email_after_commit(fq_prefix, redis_client):
    with transaction.atomic():
        invoice = Invoice.objects.create(tenant_id="acme", number="INV-1")
        assert redis_client.zcard(f"{fq_prefix}:email:prioritized") == 0
    ids = redis_client.zrange(f"{fq_prefix}:email:prioritized", 0, -1)
    assert len(ids) == 1
    data = json.loads(redis_client.hget(f"{fq_prefix}:email:{ids[0]}", "data"))
    assert data == {
        "invoice_id": invoice.pk,
        "template": "invoice",
        "tenantId": "acme",
        "priorityLevel": "normal",
    }


def test_rolled_back_invoice_enqueues_nothing(fq_prefix, redis_client):
    with pytest.raises(RuntimeError), transaction.atomic():
        Invoice.objects.create(tenant_id="acme", number="INV-2")
        raise RuntimeError("rollback")
    assert redis_client.zcard(f"{fq_prefix}:email:prioritized") == 0
