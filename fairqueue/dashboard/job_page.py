"""The job page's additions: where a waiting job stands and why, its failure, a search
by job id across the configured queues, and removing a job (confirmed, audited).

"Why" is what fairqueue can say and other dashboards cannot: a waiting job stands at its
flow's turn (its level's weight and its tenant's weight decide how often its flow is
served), behind its own flow's earlier jobs and the other flows' turns that come first;
a held job waits for its tenant's limit; a delayed one for its time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern

from fairqueue.broker import (
    MAX_JOB_ID_LENGTH,
    JobDetail,
    Place,
    get_sync_broker,
    job_tenant_id,
    pending_from_job,
)
from fairqueue.conf import get_settings
from fairqueue.dashboard.console_admin import ConsoleViews
from fairqueue.dashboard.links import tenant_url
from fairqueue.dashboard.wording import format_duration, format_time, tenant_words
from fairqueue.exceptions import BrokerError
from fairqueue.tenants import retry_failed_job

PERM_VIEW = "fairqueue.view_dashboard"
PERM_REMOVE = "fairqueue.change_tenantplan"
#: Held jobs sit in BullMQ's delayed set this far out (the year 9999).
HELD_AFTER_MS = 200_000_000_000_000


def why_it_waits(detail: JobDetail, place: Place | None, delayed_until_ms: int | None) -> str:
    """One sentence on why the job is where it is."""
    state = detail.state
    if state in ("waiting", "prioritized") and place is not None:
        pending = pending_from_job(detail.job)
        if detail.job.in_wait_list:
            return (
                "It waits outside the fair order (another producer's job, or a promoted "
                "delayed one): the next pass places it at its flow's turn."
            )
        flow = (
            f"its flow (level {pending.priority_level.value}, tenant "
            f"{tenant_words(job_tenant_id(detail.job))})"
            if pending
            else "its flow"
        )
        ahead = place.ahead
        if not ahead:
            return "It is next: a worker takes it first."
        return (
            f"It stands at {flow}'s next turn: {ahead} job(s) come first, "
            f"{place.same_flow_ahead} of them its own flow's earlier jobs; the rest are "
            "other flows' turns, which the levels' weights (4:3:2:1) and the tenants' "
            "weights inside a level put before it."
        )
    if state == "delayed":
        if delayed_until_ms is not None and delayed_until_ms >= HELD_AFTER_MS:
            return (
                "It is held by its tenant's limits (paused, at its limit of jobs at once, "
                "or its rate): BullMQ shows it as delayed to the year 9999; the loop "
                "releases it to its fair place when its tenant has room."
            )
        return "It is delayed until its time comes, then takes its flow's turn."
    if state == "active":
        return "A worker is running it."
    if state == "failed":
        return (
            "It failed; retrying its tenant's failed jobs puts it back in line as a fair "
            "turn of its flow, within its tenant's limits."
        )
    if state == "completed":
        return "It finished."
    return "BullMQ does not list it in any state."


def job_facts(queue: str, detail: JobDetail) -> dict[str, Any]:
    """What the job page adds: its place in line, why, its failure."""
    sync = get_sync_broker()
    reads = sync.broker.console
    place = sync.run(reads.place, queue, detail.job, detail.state)
    delayed_until = None
    if detail.state == "delayed":
        delayed_until = sync.run(reads.delayed_until, queue, detail.job.job_id)
    error_class, message = ("", "")
    if detail.state == "failed":
        error_class, message = sync.run(reads.failure, queue, detail.job.job_id)
    tenant = job_tenant_id(detail.job)
    held = delayed_until is not None and delayed_until >= HELD_AFTER_MS
    return {
        "place": place,
        "ahead_by_tenant": [
            {"tenant": tenant_words(t), "count": n, "url": tenant_url(t)}
            for t, n in (place.ahead_by_tenant if place else [])
        ],
        "due_ms": None if held else delayed_until,
        "due_at": "" if held or delayed_until is None else format_time(delayed_until),
        "why": why_it_waits(detail, place, delayed_until),
        "error_class": error_class,
        "error_message": message,
        "tenant_id": tenant,
        "tenant_display": tenant_words(tenant),
        "held": held,
    }


@dataclass(frozen=True, slots=True)
class JobWait:
    """How long a job waited: from ready (its first release when held, its due time
    when delayed, else its enqueue) to its start, or to now while it still waits."""

    waited_ms: int | None
    text: str


def job_wait(detail: JobDetail, *, now_ms: int, held: bool, due_ms: int | None) -> JobWait:
    """The job page's wait, ending where the job's wait ended: its start when a worker
    took it (a job processed the second it was added waited 0 s, not the time since)."""
    job = detail.job
    if held:
        return JobWait(None, "not counted yet: held by its tenant's limits")
    if due_ms is not None and due_ms > now_ms:
        return JobWait(None, f"not counted yet: delayed until {format_time(due_ms)}")
    ready_ms = job.ready_ms if job.ready_ms is not None else job.timestamp_ms
    if ready_ms is None:
        return JobWait(None, "—")
    started_ms = detail.processed_on_ms
    if started_ms is not None:
        waited = max(0, started_ms - ready_ms)
        return JobWait(waited, f"{format_duration(waited)} from ready to its start")
    if detail.state in ("waiting", "prioritized"):
        waited = max(0, now_ms - ready_ms)
        return JobWait(waited, f"{format_duration(waited)} so far (it still waits)")
    return JobWait(None, "— (no start recorded)")


class JobViews(ConsoleViews):
    """Job search and removal for one :class:`.ConsoleAdmin`."""

    def urls(self) -> list[URLPattern]:
        page = self.admin._page
        return [
            page("jobs/", self.search_view, "jobs"),
            page("queue/<str:job_type>/jobs/<path:job_id>/remove/", self.remove_view, "job_remove"),
            page("queue/<str:job_type>/jobs/<path:job_id>/retry/", self.retry_view, "job_retry"),
        ]

    def search_view(self, request: HttpRequest) -> HttpResponse:
        """``?id=``: the job's page in the first queue that holds it."""
        if not request.user.has_perm(PERM_VIEW):
            raise PermissionDenied
        job_id = request.GET.get("id", "").strip()
        found: list[str] = []
        error = None
        if job_id and len(job_id) <= MAX_JOB_ID_LENGTH and ":" not in job_id:
            sync = get_sync_broker()
            try:
                for job_type, queue in get_settings().queues.items():
                    if sync.run(sync.broker.dashboard.read_job_detail, queue, job_id):
                        found.append(job_type)
            except BrokerError as exc:
                error = {
                    "title": "Redis unreachable",
                    "error": type(exc).__name__,
                    "message": str(exc),
                }
            if len(found) == 1:
                return HttpResponseRedirect(self.admin._url("job", found[0], job_id))
        return TemplateResponse(
            request,
            "fairqueue/job_search.html",
            self.admin._context(
                request,
                "Find a job",
                ("jobs", None),
                job_id=job_id,
                found=[(jt, self.admin._url("job", jt, job_id)) for jt in found],
                redis_error=error,
            ),
        )

    def remove_view(self, request: HttpRequest, job_type: str, job_id: str) -> HttpResponse:
        """Remove one job no worker holds: confirmed on GET, done on POST, logged."""
        if not request.user.has_perms((PERM_VIEW, PERM_REMOVE)):
            raise PermissionDenied
        queues = get_settings().queues
        if job_type not in queues:
            raise Http404("No such job type")
        job_url = self.admin._url("job", job_type, job_id)
        if request.method == "POST":
            sync = get_sync_broker()
            removed = sync.run(sync.broker.console.remove_job, queues[job_type], job_id)
            if removed:
                self.admin._log(request, job_type, f"Removed job {job_id} from the console.")
                messages.success(request, f"Removed job {job_id}.")
                return HttpResponseRedirect(self.admin._url("queue", job_type))
            messages.error(
                request, f"Job {job_id} was not removed (a worker holds it, or it is gone)."
            )
            return HttpResponseRedirect(job_url)
        return self._confirm(
            request,
            "remove",
            job_type,
            job_id,
            f"Remove job {job_id} of {job_type} with BullMQ's own removal (a job "
            "a worker is running cannot be removed).",
        )

    def retry_view(self, request: HttpRequest, job_type: str, job_id: str) -> HttpResponse:
        """Retry one failed job as a fair turn of its flow, within its tenant's limits:
        confirmed on GET, done on POST, logged."""
        if not request.user.has_perms((PERM_VIEW, PERM_REMOVE)):
            raise PermissionDenied
        if job_type not in get_settings().queues:
            raise Http404("No such job type")
        if not job_id or len(job_id) > MAX_JOB_ID_LENGTH or ":" in job_id:
            raise Http404("No such job")
        job_url = self.admin._url("job", job_type, job_id)
        if request.method == "POST":
            try:
                retried = retry_failed_job(job_type, job_id)
            except BrokerError as exc:
                messages.error(request, f"Redis failed ({type(exc).__name__}): not retried.")
                return HttpResponseRedirect(job_url)
            if retried:
                self.admin._log(request, job_type, f"Retried job {job_id} from the console.")
                messages.success(
                    request,
                    f"Retried job {job_id}: back in line as a fair turn of its flow "
                    "(held while its tenant is paused or at its limits).",
                )
            else:
                messages.error(request, f"Job {job_id} was not retried: it is not failed.")
            return HttpResponseRedirect(job_url)
        return self._confirm(
            request,
            "retry",
            job_type,
            job_id,
            f"Put failed job {job_id} of {job_type} back in line as a fair turn of its "
            "flow (not at the front, where BullMQ's own retry puts it), within its "
            "tenant's limits: held while its tenant is paused or at its limit; its "
            "attempts made are kept.",
        )

    def _confirm(
        self, request: HttpRequest, action: str, job_type: str, job_id: str, touches: str
    ) -> HttpResponse:
        """The confirmation page of a one-job action (GET never acts)."""
        job_url = self.admin._url("job", job_type, job_id)
        return TemplateResponse(
            request,
            "fairqueue/tenant_confirm.html",
            self.admin._context(
                request,
                f"{action.capitalize()} job {job_id}?",
                (job_type, self.admin._url("queue", job_type)),
                (f"job {job_id}", job_url),
                (action, None),
                touches=touches,
                action=action,
                tenant_id=f"job {job_id}",
                tenant_url=job_url,
            ),
        )
