"""What the browser tests share (tests/e2e/test_dashboard_browser.py,
test_console_browser.py, test_console_themes.py): Debian's Chromium driven by Playwright,
a staff user with the console's permissions, and the admin's login form.

Importing this module skips the importing test module when Chromium (or the playwright
package) is missing outside CI; with ``CI`` set a missing browser fails the test, so CI
cannot pass without running it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

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
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

if not IN_CI and not os.path.exists(CHROMIUM):
    pytest.skip("Chromium is not installed (.ci/run installs it)", allow_module_level=True)

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402 - after the skip


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium, closed on the way out (its event loop gone after the
    ``with``: read the database there, not inside)."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def staff_user(username: str, *codenames: str):
    """A staff user (password ``pw-<username>``) with the permissions ``codenames``."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, password=f"pw-{username}", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def log_in(page: Page, url: str, username: str) -> None:
    """``username`` (made by :func:`staff_user`) logs in to the admin at ``url``."""
    page.goto(f"{url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}")
    page.click("input[type=submit]")
    page.wait_for_url(f"{url}/admin/")
