"""The browser tests' operator at the console (tests/helpers/console_driver.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def console(live_server):
    """A :class:`~tests.helpers.console_driver.Console` on the live server; its browser
    starts at its first ``open`` (so a test sets up its data before) and ends here."""
    from fairqueue.dashboard import stats as dashboard
    from tests.helpers.console_driver import Console

    dashboard.clear_backlog_cache()
    driver = Console(live_server.url)
    yield driver
    driver.close()
