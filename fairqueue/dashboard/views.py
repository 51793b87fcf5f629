"""The fair queue dashboard, inside Django admin (django-rq's layout).

``DashboardAdmin`` is registered for the unmanaged :class:`~fairqueue.models.Dashboard`
model, so the admin index links to it under fairqueue for users who may see it; its
``get_urls()`` replaces the model's add/change pages with the dashboard's own views, each
wrapped in ``admin_site.admin_view`` (staff login, ``never_cache``, CSRF).

Permissions (on the ``Dashboard`` model):

* ``fairqueue.view_dashboard``: the page, the per-queue page, the JSON endpoint and job
  metadata;
* ``fairqueue.run_rebalance``: the "run one pass now" action (POST only, CSRF, confirmed
  on GET, recorded in the admin log);
* ``fairqueue.view_job_payload``: a job's payload on its detail page.

Every number comes from :func:`fairqueue.dashboard.queue_stats`, the one function the
page, the JSON endpoint and other consumers share. When Redis is down the views answer
with a "Redis unreachable" banner naming the error class (the JSON endpoint with HTTP
503), never a 500.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Final

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern

from fairqueue.broker import (
    MAX_JOB_ID_LENGTH,
    STATUS_TENANTS,
    get_sync_broker,
    job_tenant_id,
    pending_from_job,
)
from fairqueue.conf import get_settings
from fairqueue.dashboard.admin_readonly import ReadOnlyAdmin
from fairqueue.dashboard.console_admin import ConsoleAdmin
from fairqueue.dashboard.expected import job_expected_start
from fairqueue.dashboard.job_page import JobViews, job_facts, job_wait
from fairqueue.dashboard.links import link_stats
from fairqueue.dashboard.moment import moment
from fairqueue.dashboard.overview import overview_rows, plans_attention
from fairqueue.dashboard.stats import clamp_page, queues_stats
from fairqueue.dashboard.tenant_routes import tenant_url
from fairqueue.dashboard.tenant_views import TenantViews
from fairqueue.dashboard.wording import format_duration, format_time
from fairqueue.exceptions import BrokerError, BrokerUnavailableError
from fairqueue.rebalance.passes import LAST_RUN_RECORD, rebalance_queue
from fairqueue.scheduling.shares import LEVEL_NAMES, clamp_window_min

logger = logging.getLogger("fairqueue.views")

PERM_VIEW: Final = "fairqueue.view_dashboard"
PERM_REBALANCE: Final = "fairqueue.run_rebalance"
PERM_PAYLOAD: Final = "fairqueue.view_job_payload"
#: How often the page refreshes its numbers; ``?refresh_ms=`` may change it per page.
REFRESH_MS: Final = 5_000
MIN_REFRESH_MS: Final = 1_000
MAX_REFRESH_MS: Final = 60_000
#: The history windows the page links to, in minutes (``?history_minutes=`` takes any
#: 1..60).
HISTORY_CHOICES: Final = (5, 15, 60)
#: Limited tenants each queue's section of the overview lists (its own page lists more).
OVERVIEW_LISTED: Final = 10


def _require(request: HttpRequest, *perms: str) -> None:
    if not request.user.has_perms(perms):
        raise PermissionDenied


def _job_type_or_404(job_type: str) -> str:
    queues = get_settings().queues
    if job_type not in queues:
        raise Http404("No such job type")
    return queues[job_type]


def _listed(job_types: list[str]) -> int:
    """Limited tenants a queue's section lists: every one up to ``STATUS_TENANTS`` on a
    queue's own page (and its JSON), the first ``OVERVIEW_LISTED`` on the overview (and
    the JSON it polls), whose queue names link to the rest."""
    return STATUS_TENANTS if len(job_types) == 1 else OVERVIEW_LISTED


def _refresh_ms(request: HttpRequest) -> int:
    try:
        value = int(request.GET.get("refresh_ms", REFRESH_MS))
    except ValueError:
        value = REFRESH_MS
    return min(MAX_REFRESH_MS, max(MIN_REFRESH_MS, value))


def _unreachable(exc: BrokerError, where: str) -> dict[str, str]:
    """What the banner says about a broker error: "Redis unreachable" when Redis did not
    answer, "Redis refused the request" for an error reply (out of memory, a read-only
    replica...). The class name and fairqueue's own sanitized message only: never a URL,
    a password or job data."""
    down = isinstance(exc, BrokerUnavailableError)
    title = "Redis unreachable" if down else "Redis refused the request"
    logger.warning("dashboard %s: %s (%s)", where, title, type(exc).__name__)
    return {"error": type(exc).__name__, "message": str(exc), "title": title}


def _expected_start(job_type: str, job_id: str) -> dict[str, Any] | None:
    """The job's expected start for its page (docs/design.md, "When a job will start");
    ``None`` when Redis did not answer: the rest of the page still shows."""
    try:
        return job_expected_start(job_type, job_id)
    except BrokerError:
        return None


class DashboardAdmin(ReadOnlyAdmin, ConsoleAdmin):
    """The dashboard's views. The model has no table: nothing here reads or writes it."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_VIEW)

    def get_urls(self) -> list[URLPattern]:
        return [
            *TenantViews(self).urls(),
            *JobViews(self).urls(),
            self._page("", self.dashboard_view, "changelist"),
            self._page("stats.json", self.stats_view, "stats"),
            self._page("queue/<str:job_type>/", self.queue_view, "queue"),
            self._page("queue/<str:job_type>/rebalance/", self.rebalance_view, "rebalance"),
            self._page("queue/<str:job_type>/jobs/<path:job_id>/", self.job_view, "job"),
        ]

    # -- helpers ----------------------------------------------------------------------

    def _sections(
        self, request: HttpRequest, job_types: list[str], *, page: int, per_page: int
    ) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
        """Stats of each queue, read at once; a "Redis unreachable" answer instead."""
        can_rebalance = request.user.has_perm(PERM_REBALANCE)
        minutes = clamp_window_min(request.GET.get("history_minutes"))
        try:
            found = queues_stats(
                job_types,
                page=page,
                per_page=per_page,
                history_minutes=minutes,
                listed=_listed(job_types),
            )
        except BrokerError as exc:
            return [], _unreachable(exc, "page")
        sections = [
            {
                "stats": link_stats(stats),
                "queue_url": self._url("queue", stats["job_type"]),
                "rebalance_url": (
                    self._url("rebalance", stats["job_type"]) if can_rebalance else ""
                ),
            }
            for stats in found
        ]
        return sections, None

    def _render_dashboard(
        self, request: HttpRequest, job_types: list[str], *, single: str | None
    ) -> TemplateResponse:
        page, per_page = clamp_page(request.GET.get("page"), request.GET.get("per_page"))
        sections, error = self._sections(request, job_types, page=page, per_page=per_page)
        minutes = clamp_window_min(request.GET.get("history_minutes"))
        stats_url = (
            self._url("stats") + f"?page={page}&per_page={per_page}&history_minutes={minutes}"
        )
        if single:
            stats_url += f"&queue={single}"
        title = f"Fair queue: {single}" if single else "Fair queue dashboard"
        overview = [] if single else overview_rows(sections)
        site = self.admin_site.name
        plans = None if single else plans_attention(lambda t: tenant_url(t, site=site))
        return TemplateResponse(
            request,
            "fairqueue/dashboard.html",
            self._context(
                request,
                title,
                *([(single, None)] if single else []),
                sections=sections,
                overview=overview,
                plans=plans,
                overview_read_at=sections[0]["stats"]["read_at"]["at"] if sections else "",
                level_names=LEVEL_NAMES,
                max_wait=format_duration(get_settings().max_wait_ms),
                tenants_url=self._url("tenants"),
                jobs_url=self._url("jobs"),
                redis_error=error,
                single=single,
                page=page,
                per_page=per_page,
                history_minutes=minutes,
                history_choices=HISTORY_CHOICES,
                stats_url=stats_url,
                refresh_ms=_refresh_ms(request),
                # JavaScript fills in the job type and id (URL-encoded).
                job_url_template=self._url("job", "__type__", "__id__"),
            ),
        )

    # -- views ------------------------------------------------------------------------

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """Every configured queue, each with the first page of its waiting order."""
        _require(request, PERM_VIEW)
        return self._render_dashboard(request, list(get_settings().queues), single=None)

    def queue_view(self, request: HttpRequest, job_type: str) -> HttpResponse:
        """One queue, with its waiting order paginated (``?page=&per_page=``)."""
        _require(request, PERM_VIEW)
        _job_type_or_404(job_type)
        return self._render_dashboard(request, [job_type], single=job_type)

    def stats_view(self, request: HttpRequest) -> JsonResponse:
        """The page's numbers as JSON: ``?queue=`` (else every queue), ``page``,
        ``per_page``, ``history_minutes`` (each queue's ``history``: served shares,
        entitlements, waits and top tenants over that window, with the charts' geometry).
        HTTP 503 with ``{"redis": "unreachable", "error": ...}`` when Redis is down."""
        _require(request, PERM_VIEW)
        page, per_page = clamp_page(request.GET.get("page"), request.GET.get("per_page"))
        minutes = clamp_window_min(request.GET.get("history_minutes"))
        job_type = request.GET.get("queue")
        if job_type:
            _job_type_or_404(job_type)
            job_types = [job_type]
        else:
            job_types = list(get_settings().queues)
        try:
            queues = queues_stats(
                job_types,
                page=page,
                per_page=per_page,
                history_minutes=minutes,
                listed=_listed([job_type] if job_type else job_types),
            )
        except BrokerError as exc:
            error = _unreachable(exc, "json")
            state = "unreachable" if isinstance(exc, BrokerUnavailableError) else "error"
            return JsonResponse({"redis": state, **error}, status=503)
        return JsonResponse(
            {
                "redis": "ok",
                "generated_at_ms": int(time.time() * 1000),
                "queues": [link_stats(stats) for stats in queues],
            }
        )

    def rebalance_view(self, request: HttpRequest, job_type: str) -> HttpResponse:
        """Run one rebalance pass now: a confirmation on GET, the pass on POST.

        The pass takes the queue's leader lock when it is free, so a loop that comes
        back meanwhile waits for it. When a running loop holds the lock the pass runs
        anyway (the operator asked for it) and may interleave its writes with the
        loop's; both write the same policy's order, and the loop's next pass re-orders
        whatever either wrote, so the worst case is one interval of a slightly stale
        order. The message says when that happened.
        """
        _require(request, PERM_VIEW, PERM_REBALANCE)
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        queue = _job_type_or_404(job_type)
        queue_url = self._url("queue", job_type)
        if request.method == "POST":
            return self._run_pass(request, job_type, queue, queue_url)
        holder, last_pass, error = None, None, None
        sync = get_sync_broker()
        try:
            holder, _ = sync.run(
                sync.broker.lock.lock_holder, sync.broker.fair_key(queue, "leader")
            )
            last_pass = sync.run(sync.broker.passes.read_status, queue, LAST_RUN_RECORD)
        except BrokerError as exc:
            error = _unreachable(exc, "confirm")
        at_ms = (last_pass or {}).get("at_ms")
        return TemplateResponse(
            request,
            "fairqueue/confirm.html",
            self._context(
                request,
                f"Run one rebalance pass over {job_type}?",
                (job_type, queue_url),
                ("run one pass", None),
                job_type=job_type,
                queue=queue,
                queue_url=queue_url,
                holder=holder,
                last_pass_at=format_time(at_ms) if isinstance(at_ms, int) else None,
                last_pass_by=(last_pass or {}).get("by"),
                redis_error=error,
            ),
        )

    def _run_pass(
        self, request: HttpRequest, job_type: str, queue: str, queue_url: str
    ) -> HttpResponse:
        sync = get_sync_broker()
        lock_key = sync.broker.fair_key(queue, "leader")
        try:
            result = rebalance_queue(job_type, by=f"admin:{request.user.get_username()}")
            holder = (
                sync.run(sync.broker.lock.lock_holder, lock_key)[0] if result.lock_lost else None
            )
        except BrokerError as exc:
            error = _unreachable(exc, "rebalance")
            self._log(
                request, job_type, f"Rebalance pass failed: {error['title']} ({error['error']})"
            )
            messages.error(request, f"{error['title']} ({error['error']}): the pass did not run.")
            return HttpResponseRedirect(queue_url)
        self._log(
            request, job_type, f"Ran one rebalance pass from the dashboard: {result.summary()}"
        )
        if result.lock_lost:
            messages.warning(
                request,
                f"{holder or 'Another rebalancer'} holds the leader lock and runs this "
                "queue's passes, so this one wrote nothing.",
            )
        else:
            messages.success(request, f"Ran one pass: {result.summary()}.")
        return HttpResponseRedirect(queue_url)

    def job_view(self, request: HttpRequest, job_type: str, job_id: str) -> HttpResponse:
        """One job's metadata; its payload only with ``fairqueue.view_job_payload``."""
        _require(request, PERM_VIEW)
        queue = _job_type_or_404(job_type)
        if not job_id or len(job_id) > MAX_JOB_ID_LENGTH or ":" in job_id:
            raise Http404("No such job")
        error: dict[str, str] | None
        try:
            sync = get_sync_broker()
            detail = sync.run(sync.broker.dashboard.read_job_detail, queue, job_id)
        except BrokerError as exc:
            detail, error = None, _unreachable(exc, "job")
        else:
            error = None
            if detail is None:
                raise Http404("No such job")
        context = self._context(
            request,
            f"Job {job_id} of {job_type}",
            (job_type, self._url("queue", job_type)),
            (f"job {job_id}", None),
            job_type=job_type,
            job_id=job_id,
            queue=queue,
            queue_url=self._url("queue", job_type),
            redis_error=error,
            can_view_payload=request.user.has_perm(PERM_PAYLOAD),
        )
        if detail is not None:
            job = detail.job
            pending = pending_from_job(job)
            now_ms = int(time.time() * 1000)
            context["read_at"] = moment(now_ms)
            facts = job_facts(queue, detail)
            wait = job_wait(detail, now_ms=now_ms, held=facts["held"], due_ms=facts["due_ms"])
            context.update(
                detail=detail,
                level=pending.priority_level.value if pending else None,
                tenant=pending.tenant_id if pending else None,
                enqueued_at=format_time(job.timestamp_ms),
                wait=wait,
                # Only a job still waiting can be overdue.
                overdue=detail.state in ("waiting", "prioritized")
                and wait.waited_ms is not None
                and wait.waited_ms > get_settings().max_wait_ms,
                max_attempts=max(1, detail.max_attempts or 0),
                **facts,
                tenant_url=(
                    tenant_url(pending.tenant_id, site=self.admin_site.name)
                    if pending and job_tenant_id(job) is not None
                    else ""
                ),
                can_remove=request.user.has_perm("fairqueue.change_tenantplan"),
                remove_url=self._url("job_remove", job_type, job_id),
                # this job back in line as a fair turn of its flow, within its limits
                retry_url=(
                    self._url("job_retry", job_type, job_id) if detail.state == "failed" else ""
                ),
                tenant_retry_url=(
                    tenant_url(pending.tenant_id, "retry", site=self.admin_site.name)
                    if detail.state == "failed" and pending and job_tenant_id(job) is not None
                    else ""
                ),
                processed_on=format_time(detail.processed_on_ms),
                finished_on=format_time(detail.finished_on_ms),
                expected=_expected_start(job_type, job_id),
            )
            if context["can_view_payload"]:
                context["payload"] = (
                    json.dumps(job.data, indent=2, sort_keys=True, ensure_ascii=False)
                    if job.data is not None
                    else None
                )
        return TemplateResponse(request, "fairqueue/job_detail.html", context)
