"""The admin base of the console's pages: their URLs, their context (breadcrumbs) and
their admin log rows. ``views.DashboardAdmin`` is one; the pages it hands to
``job_page`` and ``tenant_views`` take it as this, so neither imports ``views``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse

from fairqueue.dashboard.crumbs import trail
from fairqueue.dashboard.moment import moment


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


class ConsoleViews:
    """Pages one :class:`ConsoleAdmin` serves beside its own (its site, URLs, context)."""

    def __init__(self, admin: ConsoleAdmin) -> None:
        self.admin = admin
