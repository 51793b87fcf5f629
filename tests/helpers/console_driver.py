"""An operator at the console in Chromium (Debian's, as tests/e2e/test_dashboard_browser.py
drives it): log in, open a page, follow a link to an action's confirmation and confirm
it, read what the page then says.

While a browser is open, Playwright's sync API keeps an asyncio loop running on the
test's thread, where Django's ORM (``SynchronousOnlyOperation``) and ``asyncio.run``
(BullMQ's own counts, a stock worker) refuse to run: :func:`off_loop` runs them on a
thread of their own.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connections

if TYPE_CHECKING:  # imported where used: the browser modules skip without Chromium
    from playwright.sync_api import Browser, Page, Playwright

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
PASSWORD = "pw-operator"
#: What an operator who acts on tenants and jobs holds.
OPERATOR_PERMS = ("view_dashboard", "change_tenantplan", "view_tenantplan")
YES = "input[type=submit][value^='Yes']"
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
T = TypeVar("T")


def require_chromium() -> None:
    """Skip the calling browser module where Chromium is missing, outside CI only: in CI
    a missing browser fails the tests rather than hiding them."""
    if not IN_CI and not os.path.exists(CHROMIUM):
        pytest.skip("Chromium is not installed (.ci/run installs it)", allow_module_level=True)


def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a thread of its own (its database connection closed
    after), for the ORM and ``asyncio.run`` while a browser is open."""

    def run() -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def make_staff(username: str, *codenames: str, superuser: bool = False) -> User:
    """A staff user with password :data:`PASSWORD` and ``fairqueue``'s ``codenames``."""
    if superuser:
        return User.objects.create_superuser(username, password=PASSWORD)
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="fairqueue", codename=codename)
        )
    return user


def login(page: Page, base_url: str, username: str) -> None:
    """Log in through the admin's own login form."""
    page.goto(f"{base_url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}/admin/")


class Console:
    """One browser, started by the first :meth:`open`; :meth:`close` ends it."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._page: Page | None = None

    @property
    def page(self) -> Page:
        assert self._page is not None, "open() first"
        return self._page

    def open(self, username: str, *codenames: str, superuser: bool = False) -> Page:
        """A new staff user with ``codenames``, logged in on a page of its own."""
        off_loop(make_staff, username, *codenames, superuser=superuser)
        if self._browser is None:
            from playwright.sync_api import sync_playwright

            self._playwright = sync_playwright().start()
            self._browser = self._playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS
            )
        self._page = self._browser.new_page(viewport={"width": 1400, "height": 1000})
        self._page.set_default_timeout(10_000)  # a missing element fails the test sooner
        login(self._page, self.base_url, username)
        return self._page

    def go(self, path: str) -> None:
        response = self.page.goto(f"{self.base_url}{path}")
        assert response is not None and response.status == 200, (path, response)

    def follow(self, selector: str) -> None:
        """Click a link or a submit button and wait for the page it leads to."""
        with self.page.expect_navigation():
            self.page.click(selector)

    def confirm(self, selector: str) -> str:
        """Follow the action's link, read what its confirmation says it will touch and
        answer yes; returns that text (the page then is where the action led)."""
        self.follow(selector)
        touches = self.text("[data-fq-touches]")
        self.follow(YES)
        return touches

    def text(self, selector: str) -> str:
        return self.page.locator(selector).inner_text().strip()

    def message(self) -> str:
        """The admin's message after an action (one)."""
        return self.text("ul.messagelist li")

    def close(self) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._playwright is not None:
            self._playwright.stop()
        self._browser = self._playwright = self._page = None
