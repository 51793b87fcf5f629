"""The demo project's job handlers (found by ``fairqueue_worker`` through autodiscovery).

Each does a little real work: ``work_ms`` in the payload (0..60000, default 0) is how
long it takes. ``email`` and ``cleanup`` are sync (run in the worker's thread pool; the
cleanup uses the ORM), ``report`` is ``async def`` (awaited on the worker's loop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from django.contrib.sessions.models import Session
from django.utils import timezone

import fairqueue

logger = logging.getLogger("project.jobs")

MAX_WORK_MS = 60_000


def _work_ms(payload: Any) -> int:
    """The payload's ``work_ms``; a bad value fails the job (so BullMQ retries it)."""
    value = payload.get("work_ms", 0) if isinstance(payload, dict) else 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WORK_MS:
        raise ValueError(f"work_ms={value!r} is not allowed: expected an integer in 0..60000")
    return value


@fairqueue.handler("email")
def send_email(payload: dict[str, Any], job: fairqueue.JobContext) -> None:
    """Pretend to talk to a mail server."""
    time.sleep(_work_ms(payload) / 1000)
    logger.debug("email job %s sent", job.job_id)


@fairqueue.handler("report")
async def build_report(payload: dict[str, Any], job: fairqueue.JobContext) -> None:
    """Pretend to wait on a slow query without holding a thread."""
    await asyncio.sleep(_work_ms(payload) / 1000)
    logger.debug("report job %s built", job.job_id)


@fairqueue.handler("cleanup")
def clean_up(payload: dict[str, Any], job: fairqueue.JobContext) -> None:
    """Delete expired sessions (what ``manage.py clearsessions`` does), then idle."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    time.sleep(_work_ms(payload) / 1000)
    logger.debug("cleanup job %s removed %d expired sessions", job.job_id, deleted)
