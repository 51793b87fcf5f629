"""Fixtures of the worker tests (tests/redis/test_worker*.py, test_limits.py): the
handler registry restored afterwards, and a prefix configured with the test job types."""

from __future__ import annotations

import pytest
from django.test import override_settings

from fairqueue import conf
from fairqueue.worker import handlers
from tests.helpers.keys import REDIS_URL, delete_prefix, run_prefix
from tests.helpers.worker_jobs import QUEUES


@pytest.fixture
def registry():
    """Restore the handler registry afterwards (tests register their own handlers).

    Apps' jobs modules are imported first: they register once per process, so they
    must be in what is restored.
    """
    handlers.autodiscover()
    saved = {
        job_type: handlers.get_handler(job_type) for job_type in handlers.registered_job_types()
    }
    yield
    for job_type in handlers.registered_job_types():
        handlers.unregister(job_type)
    for job_type, fn in saved.items():
        handlers.handler(job_type)(fn)


@pytest.fixture
def prefix(registry):
    """A private BullMQ prefix in FAIRQUEUE (with the test job types); its keys go after."""
    prefix = run_prefix()
    with override_settings(
        FAIRQUEUE={"PREFIX": prefix, "QUEUES": dict(QUEUES), "REDIS_URL": REDIS_URL}
    ):
        conf.reload_settings()
        try:
            yield prefix
        finally:
            delete_prefix(prefix)
    conf.reload_settings()
