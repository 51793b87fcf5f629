"""Celery task for teams that already run Celery beat instead of ``rebalance_fair``.

The task takes the same per-queue leader lock as the command, with a token that lives as
long as the Celery worker process: the process that won the lock keeps renewing it on
every beat tick, and another worker takes over within two intervals if it dies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from celery import shared_task

from fairqueue.conf import get_settings
from fairqueue.exceptions import BrokerError
from fairqueue.rebalance.leadership import rebalancer_id
from fairqueue.rebalance.passes import rebalance_as_leader
from fairqueue.tenants import keep_tenant_limits

logger = logging.getLogger("fairqueue.tasks")

#: pid -> this process's lock token. Celery forks its pool children after importing
#: this module: a token computed at import would be shared, and two children would
#: both "hold" the lock.
_tokens: dict[int, str] = {}


def process_token() -> str:
    """This process's leader-lock token (a new one in every forked child)."""
    pid = os.getpid()
    token = _tokens.get(pid)
    if token is None:
        token = _tokens[pid] = rebalancer_id()
    return token


@shared_task(name="fairqueue.rebalance_fair", ignore_result=True)
def rebalance_fair(job_types: Sequence[str] | None = None) -> dict[str, int]:
    """One rebalance round over ``job_types`` (default: every configured job type).

    Returns the number of jobs adopted per job type this worker rebalanced (job types
    another rebalancer leads are left out). A Redis outage ends the round quietly; the
    next beat tick tries again.
    """
    settings = get_settings()
    written: dict[str, int] = {}
    for job_type in job_types or list(settings.queues):
        try:
            result = rebalance_as_leader(
                job_type, token=process_token(), interval_ms=settings.rebalance_interval_ms
            )
        except BrokerError as exc:
            logger.warning("rebalance skipped: %s", exc)
            break
        if result is not None:
            keep_tenant_limits(settings.queues[job_type])  # when Redis lost them
            written[job_type] = result.adopted
    return written
