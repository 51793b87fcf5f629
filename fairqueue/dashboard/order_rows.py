"""The queue page's waiting order: a page of it in pop order (what a worker takes next),
each job's level, tenant, wait and whether the pass has placed it yet. Split from
:mod:`fairqueue.dashboard.stats`, which reads the jobs and hands them here."""

from __future__ import annotations

import math
from typing import Any, Final

from fairqueue.broker import MAX_PRIORITY, TAG_FLOOR, WaitingJob, job_tenant_id, pending_from_job
from fairqueue.dashboard.wording import decision_words, format_duration, tenant_words
from fairqueue.scheduling.order import AGED, WEIGHTED_FAIR

#: What a row shows for a job whose data does not say its level or tenant.
UNPARSED: Final = "?"


def order_section(
    rows: list[WaitingJob],
    head: tuple[int, int],
    total: int,
    page: int,
    per_page: int,
    *,
    now_ms: int,
    max_wait_ms: int,
) -> dict[str, Any]:
    """Page ``page`` (of ``per_page`` jobs: ``rows``) of the waiting order of ``total``
    jobs, and of its head ``head``: (jobs compared, of them not placed by the pass)."""
    start = (page - 1) * per_page
    num_pages = max(1, math.ceil(total / per_page))
    return {
        "page": page,
        "per_page": per_page,
        "num_pages": num_pages,
        "has_previous": page > 1,
        "has_next": page < num_pages,
        "first_position": start + 1,
        "jobs": _rows(rows, start=start, now_ms=now_ms, max_wait_ms=max_wait_ms),
        "compared": head[0],
        "drift_count": head[1],
    }


def is_unplaced(job: WaitingJob) -> bool:
    """Whether ``job`` waits outside fairqueue's tag order (the next pass adopts it)."""
    return job.in_wait_list or not TAG_FLOOR <= job.priority < MAX_PRIORITY


def _rows(
    jobs: list[WaitingJob],
    *,
    start: int,
    now_ms: int,
    max_wait_ms: int,
) -> list[dict[str, Any]]:
    rows = []
    for index, job in enumerate(jobs):
        position = start + index + 1
        pending = pending_from_job(job)
        ready_ms = job.ready_ms if job.ready_ms is not None else job.timestamp_ms
        waited_ms = None if ready_ms is None else max(0, now_ms - ready_ms)
        overdue = waited_ms is not None and waited_ms > max_wait_ms
        if pending is None:
            decision = "skipped"
        else:
            decision = AGED if overdue else WEIGHTED_FAIR
        tenant = job_tenant_id(job) if pending else UNPARSED
        rows.append(
            {
                "position": position,
                "job_id": job.job_id,
                "name": job.name,
                "level": pending.priority_level.value if pending else UNPARSED,
                "tenant": tenant,
                "tenant_display": tenant_words(tenant),
                "decision_display": decision_words(decision),
                "enqueued_at_ms": job.timestamp_ms,
                "waited_ms": waited_ms,
                "waited": format_duration(waited_ms),
                "decision": decision,
                "overdue": overdue,
                "priority": job.priority,
                "drift": is_unplaced(job),
            }
        )
    return rows
