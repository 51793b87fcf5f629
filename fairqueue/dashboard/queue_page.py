"""The overview and the queue pages: every configured queue (or one, its waiting order
paginated) with its numbers, the JSON endpoint the pages poll for them, and the "run
one pass now" action.

Every number comes from :func:`fairqueue.dashboard.stats.queues_stats`, the one read the
pages and the JSON endpoint share, so the JSON keeps the stats' keys. When Redis is down
the pages answer with a banner naming the error class (the JSON endpoint with HTTP 503),
never a 500.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Final

from django.contrib import messages
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.urls import URLPattern

from fairqueue.broker import STATUS_TENANTS, get_sync_broker
from fairqueue.conf import get_settings
from fairqueue.dashboard.account_rows import AccountServed, top_accounts
from fairqueue.dashboard.console_admin import (
    PERM_VIEW,
    ConsolePage,
    RedisTrouble,
    job_type_or_404,
    redis_trouble,
    require,
)
from fairqueue.dashboard.links import link_stats
from fairqueue.dashboard.overview import (
    OverviewRow,
    PlansAttention,
    overview_rows,
    plans_attention,
)
from fairqueue.dashboard.queue_figures import QueueStats
from fairqueue.dashboard.stats import StatsAsk, clamp_page, queues_stats
from fairqueue.dashboard.tenant_routes import account_url, tenant_url
from fairqueue.dashboard.wording import format_duration, format_time
from fairqueue.exceptions import BrokerError, BrokerUnavailableError
from fairqueue.rebalance.pass_result import LAST_RUN_RECORD
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.scheduling.shares import clamp_window_min

PERM_REBALANCE: Final = "fairqueue.run_rebalance"
#: How often the page refreshes its numbers; ``?refresh_ms=`` may change it per page.
REFRESH_MS: Final = 5_000
MIN_REFRESH_MS: Final = 1_000
MAX_REFRESH_MS: Final = 60_000
#: The history windows the page links to, in minutes (``?history_minutes=`` takes any
#: 1..60).
HISTORY_CHOICES: Final = (5, 15, 60)
#: Limited tenants each queue's section of the overview lists (its own page lists more).
OVERVIEW_LISTED: Final = 10


@dataclass(frozen=True, slots=True)
class QueueSection:
    """One queue's section: its numbers (the JSON endpoint's, key for key), its page and
    its "run one pass now" link (``""`` without the permission)."""

    stats: QueueStats
    queue_url: str
    rebalance_url: str


@dataclass(frozen=True, slots=True)
class QueuePage:
    """What the overview (``single`` empty) or a queue's page shows; its template reads
    it as ``page``."""

    sections: tuple[QueueSection, ...]
    overview: tuple[OverviewRow, ...]
    #: the overview's top consumers by account, over every queue's history window
    accounts: tuple[AccountServed, ...]
    plans: PlansAttention | None
    overview_read_at: str
    max_wait: str
    tenants_url: str
    jobs_url: str
    redis_error: RedisTrouble | None
    single: str
    page_number: int
    per_page: int
    history_minutes: int
    history_choices: tuple[int, ...]
    stats_url: str
    refresh_ms: int
    #: the job page's URL; JavaScript fills in the job type and id (URL-encoded)
    job_url_template: str


@dataclass(frozen=True, slots=True)
class RebalanceConfirm:
    """The confirmation of one pass: who holds the leader lock and the last pass."""

    job_type: str
    queue: str
    queue_url: str
    holder: str | None
    last_pass_at: str | None
    last_pass_by: str | None
    redis_error: RedisTrouble | None


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


class QueueViews(ConsolePage):
    """The overview, each queue's page, their JSON and the rebalance action."""

    def urls(self) -> list[URLPattern]:
        page = self.admin._page
        return [
            page("", self.dashboard_view, "changelist"),
            page("stats.json", self.stats_view, "stats"),
            page("queue/<str:job_type>/", self.queue_view, "queue"),
            page("queue/<str:job_type>/rebalance/", self.rebalance_view, "rebalance"),
        ]

    def _sections(
        self, request: HttpRequest, job_types: list[str], *, page: int, per_page: int
    ) -> tuple[tuple[QueueSection, ...], RedisTrouble | None]:
        """Stats of each queue, read at once; a "Redis unreachable" answer instead."""
        can_rebalance = request.user.has_perm(PERM_REBALANCE)
        minutes = clamp_window_min(request.GET.get("history_minutes"))
        try:
            ask = StatsAsk(page, per_page, history_minutes=minutes, listed=_listed(job_types))
            found = queues_stats(job_types, ask)
        except BrokerError as exc:
            return (), redis_trouble(exc, "page")
        url = self.admin._url
        return tuple(
            QueueSection(
                stats=QueueStats.of(link_stats(stats)),
                queue_url=url("queue", stats["job_type"]),
                rebalance_url=url("rebalance", stats["job_type"]) if can_rebalance else "",
            )
            for stats in found
        ), None

    def _render(self, request: HttpRequest, job_types: list[str], *, single: str) -> HttpResponse:
        page, per_page = clamp_page(request.GET.get("page"), request.GET.get("per_page"))
        sections, error = self._sections(request, job_types, page=page, per_page=per_page)
        minutes = clamp_window_min(request.GET.get("history_minutes"))
        url = self.admin._url
        stats_url = url("stats") + f"?page={page}&per_page={per_page}&history_minutes={minutes}"
        if single:
            stats_url += f"&queue={single}"
        site = self.admin.admin_site.name
        overview = (
            () if single else tuple(overview_rows([(s.stats, s.queue_url) for s in sections]))
        )
        shown = QueuePage(
            sections=sections,
            overview=overview,
            accounts=(
                ()
                if single
                else top_accounts(
                    [(s.stats.history["served_total"], s.stats.accounts) for s in sections]
                )
            ),
            plans=None
            if single
            else plans_attention(
                lambda t: tenant_url(t, site=site), lambda a: account_url(a, site=site)
            ),
            overview_read_at=sections[0].stats.read_at["at"] if sections else "",
            max_wait=format_duration(get_settings().max_wait_ms),
            tenants_url=url("tenants"),
            jobs_url=url("jobs"),
            redis_error=error,
            single=single,
            page_number=page,
            per_page=per_page,
            history_minutes=minutes,
            history_choices=HISTORY_CHOICES,
            stats_url=stats_url,
            refresh_ms=_refresh_ms(request),
            job_url_template=url("job", "__type__", "__id__"),
        )
        title = f"Fair queue: {single}" if single else "Fair queue dashboard"
        steps = [(single, None)] if single else []
        return self.admin._show(request, "fairqueue/dashboard.html", title, *steps, page=shown)

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """Every configured queue, each with the first page of its waiting order."""
        require(request, PERM_VIEW)
        return self._render(request, list(get_settings().queues), single="")

    def queue_view(self, request: HttpRequest, job_type: str) -> HttpResponse:
        """One queue, with its waiting order paginated (``?page=&per_page=``)."""
        require(request, PERM_VIEW)
        job_type_or_404(job_type)
        return self._render(request, [job_type], single=job_type)

    def stats_view(self, request: HttpRequest) -> JsonResponse:
        """The page's numbers as JSON: ``?queue=`` (else every queue), ``page``,
        ``per_page``, ``history_minutes`` (each queue's ``history``: served shares,
        entitlements, waits and top tenants over that window, with the charts' geometry).
        HTTP 503 with ``{"redis": "unreachable", "error": ...}`` when Redis is down."""
        require(request, PERM_VIEW)
        page, per_page = clamp_page(request.GET.get("page"), request.GET.get("per_page"))
        minutes = clamp_window_min(request.GET.get("history_minutes"))
        job_type = request.GET.get("queue")
        if job_type:
            job_type_or_404(job_type)
            job_types = [job_type]
        else:
            job_types = list(get_settings().queues)
        try:
            listed = _listed([job_type] if job_type else job_types)
            ask = StatsAsk(page, per_page, history_minutes=minutes, listed=listed)
            queues = queues_stats(job_types, ask)
        except BrokerError as exc:
            error = redis_trouble(exc, "json")
            state = "unreachable" if isinstance(exc, BrokerUnavailableError) else "error"
            return JsonResponse({"redis": state, **asdict(error)}, status=503)
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
        require(request, PERM_VIEW, PERM_REBALANCE)
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        queue = job_type_or_404(job_type)
        queue_url = self.admin._url("queue", job_type)
        if request.method == "POST":
            return self._run_pass(request, job_type, queue_url)
        holder, last_pass, error = None, None, None
        sync = get_sync_broker()
        try:
            holder, _ = sync.run(
                sync.broker.lock.lock_holder, sync.broker.fair_key(queue, "leader")
            )
            last_pass = sync.run(sync.broker.passes.read_status, queue, LAST_RUN_RECORD)
        except BrokerError as exc:
            error = redis_trouble(exc, "confirm")
        at_ms = (last_pass or {}).get("at_ms")
        shown = RebalanceConfirm(
            job_type=job_type,
            queue=queue,
            queue_url=queue_url,
            holder=holder,
            last_pass_at=format_time(at_ms) if isinstance(at_ms, int) else None,
            last_pass_by=(last_pass or {}).get("by"),
            redis_error=error,
        )
        return self.admin._show(
            request,
            "fairqueue/confirm.html",
            f"Run one rebalance pass over {job_type}?",
            (job_type, queue_url),
            ("run one pass", None),
            page=shown,
        )

    def _run_pass(self, request: HttpRequest, job_type: str, queue_url: str) -> HttpResponse:
        sync = get_sync_broker()
        lock_key = sync.broker.fair_key(get_settings().queue_for(job_type), "leader")
        try:
            result = rebalance_queue(job_type, by=f"admin:{request.user.get_username()}")
            holder = (
                sync.run(sync.broker.lock.lock_holder, lock_key)[0] if result.lock_lost else None
            )
        except BrokerError as exc:
            error = redis_trouble(exc, "rebalance")
            self.admin._log(
                request, job_type, f"Rebalance pass failed: {error.title} ({error.error})"
            )
            messages.error(request, f"{error.title} ({error.error}): the pass did not run.")
            return HttpResponseRedirect(queue_url)
        self.admin._log(
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
