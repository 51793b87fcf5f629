"""The README's quickstart, followed as a newcomer would: a fresh project from
``django-admin startproject``, the README's settings, handler and view verbatim, its
commands run as written (with ``--burst`` / ``--once`` so they return): a job enqueued
from the view, shown on the dashboard, run by ``fairqueue_worker``.

The fast test imports fairqueue from this checkout; the slow one from the wheel built
from it (under ``make test-django6``: a fresh Django 6.1 project)."""

from __future__ import annotations

from pathlib import Path

import django
import pytest

from tests.helpers.quickstart import check_quickstart, follow_quickstart, quickstart

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_readme__quickstart_is_short_and_has_its_parts():
    python, commands = quickstart()
    section = README.read_text().split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    assert len(section.split()) <= 1200
    assert list(python) == [
        "# settings.py",
        "# yourapp/apps.py",
        "# yourapp/jobs.py",
        "# yourapp/views.py",
        "# mysite/urls.py (append)",
    ]
    # The plan lookup is wired (step 2) before the text relies on it (step 4's view).
    assert "wire_tenant_plan_lookup()" in python["# yourapp/apps.py"]
    assert [c.split()[2] if c.startswith("python") else c.split()[0] for c in commands] == [
        "migrate",
        "runserver",
        "curl",
        "fairqueue_worker",
        "rebalance_fair",
    ]
    assert "case-sensitive" in section
    # The two commands a newcomer runs first stay near the top.
    top = README.read_text().split("\n## ", 1)[0]
    assert "make demo" in top and "make test" in top


@pytest.mark.serial  # failed beside the parallel part on Django 6.1; passes alone
@pytest.mark.django_db(transaction=True)
def test_readme__quickstart_in_a_fresh_project(tmp_path):
    steps = follow_quickstart(tmp_path / "site", ROOT)
    check_quickstart(steps, ROOT)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_readme__quickstart_in_a_fresh_project_from_the_wheel(tmp_path, installed_wheel):
    """Under `make test-django6` this is the fresh Django 6.1 project."""
    steps = follow_quickstart(tmp_path / "site", installed_wheel)
    check_quickstart(steps, installed_wheel)
    assert django.get_version()  # the project ran on the test environment's Django
