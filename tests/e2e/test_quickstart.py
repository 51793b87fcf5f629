"""The README's quickstart, followed as a newcomer would: a fresh project from
``django-admin startproject``, the README's settings, handler and view verbatim, its
commands run as written (with ``--burst`` / ``--once`` so they return): a job enqueued
from the view, shown on the dashboard, run by ``fairqueue_worker``.

The fast test imports fairqueue from this checkout; the slow one from the wheel built
from it (under ``make test-django6``: a fresh Django 6.1 project)."""

from __future__ import annotations

import re
import shlex
import sys
import textwrap
import uuid
from pathlib import Path

import django
import pytest

from tests.conftest import REDIS_URL, delete_prefix
from tests.fresh_project import project_env, run_ok

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def quickstart() -> tuple[dict[str, str], list[str]]:
    """The quickstart section's Python blocks (by their first line) and its commands."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(python|bash)\n(.*?)```", section, flags=re.DOTALL)
    python = {}
    commands = []
    for language, body in blocks:
        if language == "python":
            python[body.splitlines()[0]] = body
        else:
            commands += [line.split("#", 1)[0].strip() for line in body.splitlines()]
    # Commands named in the prose ("Then run `python manage.py migrate`").
    commands = re.findall(r"`(python manage\.py [^`]+)`", section) + [c for c in commands if c]
    return python, commands


def test_readme__quickstart_is_short_and_has_its_parts():
    python, commands = quickstart()
    section = README.read_text().split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    assert len(section.split()) <= 1200
    assert {"# settings.py", "# yourapp/jobs.py", "# yourapp/views.py"} <= set(python)
    assert any("wire_tenant_plan_lookup()" in body for body in python.values())
    assert [c.split()[2] for c in commands] == ["migrate", "fairqueue_worker", "rebalance_fair"]
    # The two commands a newcomer runs first stay near the top.
    top = README.read_text().split("\n## ", 1)[0]
    assert "make demo" in top and "make test" in top


def _follow_quickstart(
    project: Path, fairqueue_path: Path, *, interpreter: str = sys.executable
) -> dict[str, str]:
    python, commands = quickstart()
    prefix = f"fqquick-{uuid.uuid4().hex[:12]}"
    env = project_env(project, fairqueue_path, settings_module="mysite.settings")

    def run(*args: str) -> str:
        done = run_ok([interpreter, *args], cwd=project, env=env, timeout=180)
        return done.stdout + done.stderr

    project.mkdir()
    run("-m", "django", "startproject", "mysite", str(project))
    run("manage.py", "startapp", "yourapp")

    # settings.py: the README's block, its `...` being the project's own apps.
    settings = project / "mysite" / "settings.py"
    block = python["# settings.py"].replace("[...,", "[*INSTALLED_APPS,")
    assert block != python["# settings.py"], "the README's INSTALLED_APPS line changed"
    settings.write_text(
        settings.read_text()
        + "\n"
        + block
        + '\nINSTALLED_APPS += ["yourapp"]\n'
        # This test's Redis and a private prefix, deleted afterwards.
        + f"FAIRQUEUE.update(REDIS_URL={REDIS_URL!r}, PREFIX={prefix!r})\n"
    )
    app = project / "yourapp"
    (app / "jobs.py").write_text(python["# yourapp/jobs.py"])
    (app / "views.py").write_text(python["# yourapp/views.py"])
    (wiring,) = [body for body in python.values() if "wire_tenant_plan_lookup()" in body]
    (app / "apps.py").write_text(
        "from django.apps import AppConfig\n\n\n"
        "class YourappConfig(AppConfig):\n"
        '    name = "yourapp"\n\n'
        "    def ready(self):\n" + textwrap.indent(wiring, "        ")
    )
    urls = project / "mysite" / "urls.py"
    urls.write_text(
        urls.read_text()
        + "\nfrom yourapp import views\n\nurlpatterns += [path('invite/', views.invite)]\n"
    )

    try:
        steps = {}
        migrate, worker, rebalance = commands
        run(*shlex.split(migrate)[1:], "--noinput")
        steps["view"] = run(
            "manage.py",
            "shell",
            "-c",
            textwrap.dedent(
                """
                import json
                from django.contrib.auth.models import User
                from django.test import Client
                from django.test.utils import setup_test_environment
                from fairqueue.models import TenantPlan

                setup_test_environment()
                TenantPlan.objects.create(tenant_id="acme", plan_tier="enterprise")
                client = Client()
                job = json.loads(client.post("/invite/", {"to": "ann@example.com"}).content)
                client.force_login(User.objects.create_superuser("admin", "a@example.com", "x"))
                page = client.get("/admin/fairqueue/dashboard/")
                shown = f'data-job-id="{job["job"]}"' in page.content.decode()
                print("JOB", job["level"], page.status_code, shown)
                """
            ),
        )
        steps["worker"] = run(*shlex.split(worker)[1:], "--burst")
        steps["rebalance"] = run(*shlex.split(rebalance)[1:], "--once")
        steps["fairqueue"] = run(
            "manage.py", "shell", "-c", "import fairqueue; print(fairqueue.__file__)"
        )
        return steps
    finally:
        delete_prefix(prefix)


def _check(steps: dict[str, str], fairqueue_path: Path) -> None:
    # An enterprise tenant's job is critical (the wired plan lookup), and the dashboard
    # lists it among the waiting jobs.
    assert "JOB critical 200 True" in steps["view"], steps["view"]
    # The handler ran it, with the tenant in its context.
    assert "to ann@example.com for tenant acme" in steps["worker"], steps["worker"]
    imported = Path(steps["fairqueue"].split()[-1])
    assert imported.is_relative_to(fairqueue_path), imported


@pytest.mark.django_db(transaction=True)
def test_readme__quickstart_in_a_fresh_project(tmp_path):
    steps = _follow_quickstart(tmp_path / "site", ROOT)
    _check(steps, ROOT)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_readme__quickstart_in_a_fresh_project_from_the_wheel(tmp_path, installed_wheel):
    """Under `make test-django6` this is the fresh Django 6.1 project."""
    steps = _follow_quickstart(tmp_path / "site", installed_wheel)
    _check(steps, installed_wheel)
    assert django.get_version()  # the project ran on the test environment's Django
