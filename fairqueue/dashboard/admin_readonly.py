"""The admin base of what nobody may add, change or delete by hand: the audit logs (they
are evidence), the outbox (deleting a row would lose its job), the holds and their
audit, and the console's dashboard (its model has no table)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class ReadOnlyAdmin(admin.ModelAdmin):
    """A ModelAdmin that refuses add, change and delete to everyone."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
