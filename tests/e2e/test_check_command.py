"""`manage.py check` in a fresh project on each Django line fairqueue supports with
``django.tasks`` (6.0 and 6.1): the tasks backend's fairqueue.E010 is reported by the
command itself, not only by ``run_checks()`` in a shell (Django 6.0 registers task
checks only once ``django.tasks`` is imported, which fairqueue's app now does).

Each line's Django (and fairqueue's runtime dependencies) is installed with pip into a
directory of its own for Python 3.12, the interpreter both lines run on; fairqueue is
imported from this checkout."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.fresh_project import ROOT, project_env, run_ok, shop_project

pytestmark = pytest.mark.slow

#: What `manage.py check` imports: Django and fairqueue's runtime dependencies (pure
#: Python or with wheels; hiredis left out, redis-py runs without it).
RUNTIME = ("bullmq>=3.4.4,<3.5", "redis>=5.0,<9", "prometheus-client>=0.20,<1")


def python312() -> list[str] | None:
    """A command that runs Python 3.12 (this one, or the one .ci/python312 finds)."""
    if sys.version_info[:2] == (3, 12):
        return [sys.executable]
    found = subprocess.run(
        ["bash", str(ROOT / ".ci" / "python312")], capture_output=True, text=True, check=False
    ).stdout.strip()
    return shlex.split(found) or None


@pytest.fixture(scope="module", params=["6.0", "6.1"])
def django_line(request, tmp_path_factory) -> tuple[str, Path]:
    """``(line, site)``: Django ``line`` and the runtime installed in ``site``."""
    line = request.param
    site = tmp_path_factory.mktemp(f"django{line}")
    major, minor = line.split(".")
    run_ok(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            "--target",
            str(site),
            "--python-version",
            "3.12",
            "--only-binary=:all:",
            f"django>={line},<{major}.{int(minor) + 1}",
            *RUNTIME,
        ],
        timeout=300,
    )
    return line, site


def test_manage_py_check__reports_e010_for_a_task_queue_with_no_job_type(tmp_path, django_line):
    interpreter = python312()
    if interpreter is None:
        pytest.skip("no Python 3.12 here (python3.12 on PATH or pyenv's 3.12)")
    line, site = django_line
    manage = shop_project(
        tmp_path,
        tasks_py="",
        apps=("fairqueue",),
        redis_url="redis://127.0.0.1:1/0",  # never reached: `check` talks to no Redis
        prefix="fqcheck",
        site=site,
    )
    del manage  # its interpreter is this one; the project runs on Python 3.12 below
    settings = tmp_path / "settings.py"
    settings.write_text(
        settings.read_text()
        + "TASKS['default']['QUEUES'] = ['default', 'nowhere']\n"
        + "FAIRQUEUE['QUEUES'] = {'default': 'default'}\n"
    )
    env = project_env(tmp_path, site, ROOT)
    done = subprocess.run(
        [*interpreter, "-m", "django", "check"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert (
        f"Django {line}"
        in run_ok(
            [*interpreter, "-c", "import django; print('Django', django.get_version())"], env=env
        ).stdout
    )
    assert done.returncode == 1, output  # an Error fails the command
    assert "fairqueue.E010" in output and "queue_name='nowhere'" in output, output
