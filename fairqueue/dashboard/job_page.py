"""The job page: one job's metadata, where a waiting job stands and why, its failure,
its expected start, its payload (with ``fairqueue.view_job_payload``); a search by job
id across the configured queues; removing or retrying a job (confirmed, audited).

"Why" is what fairqueue can say and other dashboards cannot: a waiting job stands at its
flow's turn (its level's weight and its tenant's weight decide how often its flow is
served), behind its own flow's earlier jobs and the other flows' turns that come first;
a held job waits for its tenant's limit; a delayed one for its time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
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
from fairqueue.dashboard.console_admin import (
    PERM_ACT,
    PERM_VIEW,
    ActionConfirm,
    ConsolePage,
    RedisTrouble,
    job_type_or_404,
    redis_trouble,
    require,
)
from fairqueue.dashboard.expected import ExpectedStart, job_expected_start
from fairqueue.dashboard.links import tenant_url
from fairqueue.dashboard.moment import moment
from fairqueue.dashboard.tenant_routes import tenant_url as route_url
from fairqueue.dashboard.wording import format_duration, format_time, tenant_words
from fairqueue.exceptions import BrokerError
from fairqueue.tenants import retry_failed_job

PERM_PAYLOAD = "fairqueue.view_job_payload"
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


@dataclass(frozen=True, slots=True)
class AheadTenant:
    """A tenant with jobs ahead of the job, and how many."""

    tenant: str
    count: int
    url: str


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the job page adds to BullMQ's metadata: its place in line, why, its failure.
    ``due_ms``/``due_at``: a delayed job's time (never a held job's year-9999 one)."""

    place: Place | None
    ahead_by_tenant: tuple[AheadTenant, ...]
    due_ms: int | None
    due_at: str
    why: str
    error_class: str
    error_message: str
    tenant_id: str | None
    tenant_display: str
    held: bool


def job_facts(queue: str, detail: JobDetail) -> JobFacts:
    """Read the job page's facts of ``detail`` (one round trip each)."""
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
    return JobFacts(
        place=place,
        ahead_by_tenant=tuple(
            AheadTenant(tenant_words(t), n, tenant_url(t))
            for t, n in (place.ahead_by_tenant if place else [])
        ),
        due_ms=None if held else delayed_until,
        due_at="" if held or delayed_until is None else format_time(delayed_until),
        why=why_it_waits(detail, place, delayed_until),
        error_class=error_class,
        error_message=message,
        tenant_id=tenant,
        tenant_display=tenant_words(tenant),
        held=held,
    )


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


@dataclass(frozen=True, slots=True)
class JobPage:
    """What the job page shows (its template reads it as ``page``). ``detail`` is
    ``None`` when Redis did not answer (``redis_error`` says so); the fields after it
    are then empty."""

    job_type: str
    job_id: str
    queue_url: str
    redis_error: RedisTrouble | None
    can_view_payload: bool
    can_remove: bool
    remove_url: str
    detail: JobDetail | None = None
    facts: JobFacts | None = None
    read_at: str = ""
    level: str | None = None
    tenant_url: str = ""
    enqueued_at: str = ""
    wait: JobWait | None = None
    overdue: bool = False
    max_attempts: int = 1
    processed_on: str = ""
    finished_on: str = ""
    expected: ExpectedStart | None = None
    payload: str | None = None
    retry_url: str = ""
    tenant_retry_url: str = ""


@dataclass(frozen=True, slots=True)
class JobSearch:
    """The job search: the id asked for and (job type, job page) of each queue holding
    it, when more than one does (one: the search goes straight to its page)."""

    job_id: str
    found: tuple[tuple[str, str], ...]
    redis_error: RedisTrouble | None


def _expected_start(job_type: str, job_id: str) -> ExpectedStart | None:
    """The job's expected start (docs/design.md, "When a job will start"); ``None`` when
    Redis did not answer: the rest of the page still shows."""
    try:
        return job_expected_start(job_type, job_id)
    except BrokerError:
        return None


def _valid_job_id_or_404(job_id: str) -> None:
    if not job_id or len(job_id) > MAX_JOB_ID_LENGTH or ":" in job_id:
        raise Http404("No such job")


class JobViews(ConsolePage):
    """The job page, job search, and a job's removal and retry."""

    def urls(self) -> list[URLPattern]:
        page = self.admin._page
        return [
            page("jobs/", self.search_view, "jobs"),
            page("queue/<str:job_type>/jobs/<path:job_id>/remove/", self.remove_view, "job_remove"),
            page("queue/<str:job_type>/jobs/<path:job_id>/retry/", self.retry_view, "job_retry"),
            # after its actions: <path:job_id> would take ".../remove" as an id
            page("queue/<str:job_type>/jobs/<path:job_id>/", self.job_view, "job"),
        ]

    def job_view(self, request: HttpRequest, job_type: str, job_id: str) -> HttpResponse:
        """One job's metadata; its payload only with ``fairqueue.view_job_payload``."""
        require(request, PERM_VIEW)
        queue = job_type_or_404(job_type)
        _valid_job_id_or_404(job_id)
        error: RedisTrouble | None = None
        try:
            sync = get_sync_broker()
            detail = sync.run(sync.broker.dashboard.read_job_detail, queue, job_id)
        except BrokerError as exc:
            detail, error = None, redis_trouble(exc, "job")
        else:
            if detail is None:
                raise Http404("No such job")
        queue_url = self.admin._url("queue", job_type)
        page = JobPage(
            job_type=job_type,
            job_id=job_id,
            queue_url=queue_url,
            redis_error=error,
            can_view_payload=request.user.has_perm(PERM_PAYLOAD),
            can_remove=request.user.has_perm(PERM_ACT),
            remove_url=self.admin._url("job_remove", job_type, job_id),
        )
        if detail is not None:
            page = self._shown(page, queue, detail)
        return self.admin._show(
            request,
            "fairqueue/job_detail.html",
            f"Job {job_id} of {job_type}",
            (job_type, queue_url),
            (f"job {job_id}", None),
            page=page,
        )

    def _shown(self, page: JobPage, queue: str, detail: JobDetail) -> JobPage:
        """``page`` with what Redis holds of the job."""
        job = detail.job
        pending = pending_from_job(job)
        now_ms = int(time.time() * 1000)
        facts = job_facts(queue, detail)
        wait = job_wait(detail, now_ms=now_ms, held=facts.held, due_ms=facts.due_ms)
        site = self.admin.admin_site.name
        # a page for the job's tenant, when it has one (not the default bucket's)
        tenant = pending.tenant_id if pending and job_tenant_id(job) is not None else None
        failed = detail.state == "failed"
        return replace(
            page,
            detail=detail,
            facts=facts,
            read_at=moment(now_ms)["at"],
            level=pending.priority_level.value if pending else None,
            tenant_url=route_url(tenant, site=site) if tenant is not None else "",
            enqueued_at=format_time(job.timestamp_ms),
            wait=wait,
            # Only a job still waiting can be overdue.
            overdue=detail.state in ("waiting", "prioritized")
            and wait.waited_ms is not None
            and wait.waited_ms > get_settings().max_wait_ms,
            max_attempts=max(1, detail.max_attempts or 0),
            processed_on=format_time(detail.processed_on_ms),
            finished_on=format_time(detail.finished_on_ms),
            expected=_expected_start(page.job_type, page.job_id),
            payload=(
                json.dumps(job.data, indent=2, sort_keys=True, ensure_ascii=False)
                if page.can_view_payload and job.data is not None
                else None
            ),
            # this job back in line as a fair turn of its flow, within its limits
            retry_url=(self.admin._url("job_retry", page.job_type, page.job_id) if failed else ""),
            tenant_retry_url=(
                route_url(tenant, "retry", site=site) if failed and tenant is not None else ""
            ),
        )

    def search_view(self, request: HttpRequest) -> HttpResponse:
        """``?id=``: the job's page in the first queue that holds it."""
        require(request, PERM_VIEW)
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
                error = redis_trouble(exc, "job search")
            if len(found) == 1:
                return HttpResponseRedirect(self.admin._url("job", found[0], job_id))
        return self.admin._show(
            request,
            "fairqueue/job_search.html",
            "Find a job",
            ("jobs", None),
            page=JobSearch(
                job_id=job_id,
                found=tuple((jt, self.admin._url("job", jt, job_id)) for jt in found),
                redis_error=error,
            ),
        )

    def remove_view(self, request: HttpRequest, job_type: str, job_id: str) -> HttpResponse:
        """Remove one job no worker holds: confirmed on GET, done on POST, logged."""
        require(request, PERM_VIEW, PERM_ACT)
        queue = job_type_or_404(job_type)
        job_url = self.admin._url("job", job_type, job_id)
        if request.method == "POST":
            sync = get_sync_broker()
            removed = sync.run(sync.broker.console.remove_job, queue, job_id)
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
        require(request, PERM_VIEW, PERM_ACT)
        job_type_or_404(job_type)
        _valid_job_id_or_404(job_id)
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
        return self.admin._show(
            request,
            "fairqueue/tenant_confirm.html",
            f"{action.capitalize()} job {job_id}?",
            (job_type, self.admin._url("queue", job_type)),
            (f"job {job_id}", job_url),
            (action, None),
            page=ActionConfirm(
                touches=touches, action=action, tenant_id=f"job {job_id}", tenant_url=job_url
            ),
        )
