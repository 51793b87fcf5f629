"""The README's quickstart followed as a newcomer would (its Python blocks and commands,
in a fresh project), and what the steps must show: for the checkout's package and for
the built wheel's."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.helpers import free_port
from tests.helpers.fresh_project import project_env, run_ok
from tests.helpers.keys import REDIS_URL, delete_prefix, run_prefix

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def quickstart() -> tuple[dict[str, str], list[str]]:
    """The quickstart section's Python blocks (by their first line) and its commands, in
    the order a reader meets them (those named in the prose, such as "Then run `python
    manage.py migrate`", included)."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    python = {}
    commands = []
    for inline, language, body in re.findall(
        r"`(python manage\.py [^`]+)`|```(python|bash)\n(.*?)```", section, flags=re.DOTALL
    ):
        if inline:
            commands.append(inline)
        elif language == "python":
            python[body.splitlines()[0]] = body
        else:
            commands += [line.split("#", 1)[0].strip() for line in body.splitlines()]
    return python, [command for command in commands if command]


def follow_quickstart(
    project: Path, fairqueue_path: Path, *, interpreter: str = sys.executable
) -> dict[str, str]:
    python, commands = quickstart()
    prefix = run_prefix("fqquick")
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
    for name in ("apps", "jobs", "views"):
        (app / f"{name}.py").write_text(python[f"# yourapp/{name}.py"])
    urls = project / "mysite" / "urls.py"
    urls.write_text(urls.read_text() + "\n" + python["# mysite/urls.py (append)"])

    try:
        steps = {}
        migrate, runserver, curl, worker, rebalance = commands
        run(*shlex.split(migrate)[1:], "--noinput")
        run("manage.py", "shell", "-c", ENTERPRISE_ACME)
        steps["curl"] = _curl_against_runserver(
            [interpreter, *shlex.split(runserver)[1:]], shlex.split(curl), project, env
        )
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
                client = Client(enforce_csrf_checks=True)
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


def check_quickstart(steps: dict[str, str], fairqueue_path: Path) -> None:
    # An enterprise tenant's job is critical (the wired plan lookup), said by the plan
    # rule, through the README's curl; a POST without a CSRF token is accepted.
    assert (steps["curl"]["level"], steps["curl"]["rule"]) == ("critical", "plan"), steps
    # The dashboard lists the view's job among the waiting jobs.
    assert "JOB critical 200 True" in steps["view"], steps["view"]
    # The handler ran it, with the tenant in its context.
    assert "to ann@example.com for tenant acme" in steps["worker"], steps["worker"]
    imported = Path(steps["fairqueue"].split()[-1])
    assert imported.is_relative_to(fairqueue_path), imported


ENTERPRISE_ACME = (
    "from fairqueue.models import TenantPlan; "
    "TenantPlan.objects.create(tenant_id='acme', plan_tier='enterprise')"
)


def _curl_against_runserver(
    runserver: list[str], curl: list[str], project: Path, env: dict[str, str]
) -> dict:
    """The README's curl, run against the README's `runserver` on a free port."""
    port = free_port()
    server = subprocess.Popen(
        [*runserver, f"127.0.0.1:{port}", "--noreload"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = [arg for arg in curl if arg.startswith("http://127.0.0.1:8000/")]
        assert url, curl
        args = [arg.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for arg in curl]
        done = None
        deadline = time.monotonic() + 60  # a loaded machine starts Django slowly
        while time.monotonic() < deadline:
            done = subprocess.run(
                [*args, "-sS", "--fail-with-body"], capture_output=True, text=True, check=False
            )
            if done.returncode != 7:  # 7: not listening yet
                break
            time.sleep(0.5)
        assert done is not None and done.returncode == 0, done
        return json.loads(done.stdout)
    finally:
        server.terminate()
        server.wait(30)
