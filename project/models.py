from django.db import models


class Invoice(models.Model):
    """A demo model: saving a new invoice enqueues its e-mail (see project/signals.py)."""

    tenant_id = models.CharField(max_length=255)
    number = models.CharField(max_length=50)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.number
