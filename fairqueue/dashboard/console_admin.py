"""The one shape of a console page, and the admin base that serves them.

A page is a module (as a django-debug-toolbar panel is a class): its
:class:`ConsolePage` subclass holds its routes (:meth:`ConsolePage.urls`) and its
views, and what it shows is a frozen dataclass its template reads as ``page`` (and
nothing else of the page's own: ``tests/unit/test_house.py`` checks it). One part
stays a mapping on purpose: a queue section's stats, which are the JSON endpoint's,
key for key. ``views.DashboardAdmin``
serves every page of its ``PAGES``; a page takes the admin as a :class:`ConsoleAdmin`,
so no page imports ``views``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from fairqueue.conf import get_settings
from fairqueue.dashboard.crumbs import trail
from fairqueue.dashboard.moment import moment
from fairqueue.exceptions import BrokerError, BrokerUnavailableError

logger = logging.getLogger("fairqueue.views")

PERM_VIEW = "fairqueue.view_dashboard"
#: Acting on tenants and jobs (pause, limits, retry, remove).
PERM_ACT = "fairqueue.change_tenantplan"


@dataclass(frozen=True, slots=True)
class RedisTrouble:
    """What a page's banner says about a broker error: "Redis unreachable" when Redis
    did not answer, "Redis refused the request" for an error reply (out of memory, a
    read-only replica...). The class name and fairqueue's own sanitized message only:
    never a URL, a password or job data."""

    title: str
    error: str
    message: str


@dataclass(frozen=True, slots=True)
class ActionConfirm:
    """The confirmation page of an action on a tenant or a job (GET never acts): what
    it will touch, the action, what it acts on, and where "No" goes back to."""

    touches: str
    action: str
    tenant_id: str
    tenant_url: str


def redis_trouble(exc: BrokerError, where: str) -> RedisTrouble:
    """The banner of ``exc``, logged (its class only) with the page it hit."""
    down = isinstance(exc, BrokerUnavailableError)
    title = "Redis unreachable" if down else "Redis refused the request"
    logger.warning("dashboard %s: %s (%s)", where, title, type(exc).__name__)
    return RedisTrouble(title=title, error=type(exc).__name__, message=str(exc))


def require(request: HttpRequest, *perms: str) -> None:
    """``PermissionDenied`` unless the user holds every one of ``perms``."""
    if not request.user.has_perms(perms):
        raise PermissionDenied


def job_type_or_404(job_type: str) -> str:
    """The queue of a configured job type; 404 for any other."""
    queues = get_settings().queues
    if job_type not in queues:
        raise Http404("No such job type")
    return queues[job_type]


class ConsoleAdmin(admin.ModelAdmin):
    """What every page of the console asks of its admin."""

    def _page(self, route: str, view: Callable[..., HttpResponse], suffix: str) -> URLPattern:
        """``view`` at ``route``, behind the admin site's login (``admin_view``), named
        for :meth:`_url`'s ``suffix``."""
        name = f"{self.opts.app_label}_{self.opts.model_name}_{suffix}"
        return path(route, self.admin_site.admin_view(view), name=name)

    def _url(self, suffix: str, *args: str) -> str:
        return reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_{suffix}",
            args=args,
        )

    def _context(
        self,
        request: HttpRequest,
        title: str,
        *steps: tuple[str, str | None],
        **extra: Any,
    ) -> dict[str, Any]:
        """The admin's context, with breadcrumbs: the dashboard, then ``steps``."""
        dashboard_url = self._url("changelist")
        first = ("Fair queue dashboard", dashboard_url if steps else None)
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "dashboard_url": dashboard_url,
            # every page says when it was read (pages with Redis numbers say their own)
            "page_read_at": moment(int(time.time() * 1000))["at"],
            **trail(self.opts, first, *steps),
            **extra,
        }

    def _show(
        self,
        request: HttpRequest,
        template: str,
        title: str,
        *steps: tuple[str, str | None],
        page: Any,
    ) -> TemplateResponse:
        """``template`` with :meth:`_context`, its data the frozen dataclass ``page``."""
        return TemplateResponse(request, template, self._context(request, title, *steps, page=page))

    def _log(self, request: HttpRequest, job_type: str, message: str) -> None:
        """One admin log row per use of an action (no model row exists to point at)."""
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type=ContentType.objects.get_for_model(self.model, for_concrete_model=False),
            object_id=job_type,
            object_repr=f"{job_type} queue"[:200],
            action_flag=CHANGE,
            change_message=message,
        )


class ConsolePage:
    """One page of the console (with its actions), served by one :class:`ConsoleAdmin`
    (its site, URLs, context and log). A subclass says its routes in :meth:`urls`."""

    def __init__(self, admin: ConsoleAdmin) -> None:
        self.admin = admin

    def urls(self) -> list[URLPattern]:
        """The page's routes, each through ``self.admin._page`` (login, permission)."""
        raise NotImplementedError
