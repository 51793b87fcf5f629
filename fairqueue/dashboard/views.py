"""The fair queue dashboard, inside Django admin (django-rq's layout).

``DashboardAdmin`` is registered for the unmanaged :class:`~fairqueue.models.Dashboard`
model, so the admin index links to it under fairqueue for users who may see it; its
``get_urls()`` replaces the model's add/change pages with the console's pages (each a
module of one shape: :class:`~fairqueue.dashboard.console_admin.ConsolePage`), each
view wrapped in ``admin_site.admin_view`` (staff login, ``never_cache``, CSRF).
Its permissions (``view_dashboard``, ``run_rebalance``, ``view_job_payload``, and
``change_tenantplan`` to act on tenants and jobs): docs/dashboard.md.
"""

from __future__ import annotations

from typing import Any, Final

from django.http import HttpRequest
from django.urls import URLPattern

from fairqueue.dashboard.account_page import AccountViews
from fairqueue.dashboard.admin_readonly import ReadOnlyAdmin
from fairqueue.dashboard.console_admin import PERM_VIEW, ConsoleAdmin, ConsolePage
from fairqueue.dashboard.job_page import JobViews
from fairqueue.dashboard.queue_page import QueueViews
from fairqueue.dashboard.tenant_views import TenantViews

#: The console's pages, in the order their routes are tried (a page's own routes come
#: before a more general one of another page). A new page is a module and a line here.
PAGES: Final[tuple[type[ConsolePage], ...]] = (TenantViews, AccountViews, JobViews, QueueViews)


class DashboardAdmin(ReadOnlyAdmin, ConsoleAdmin):
    """The console's pages. The model has no table: nothing here reads or writes it."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_VIEW)

    def get_urls(self) -> list[URLPattern]:
        return [route for page in PAGES for route in page(self).urls()]
