"""A fresh Django project in a temporary directory, as a user would make one around
fairqueue installed from its wheel: a clean copy of this checkout to build from, the
environment its subprocesses run in, and a one-app project with a TASKS setting whose
``manage.py`` commands the test runs (tests/redis/test_tasks_backend.py,
tests/redis/test_django6.py, tests/e2e/test_packaging.py, tests/e2e/test_quickstart.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What a build must not see: setuptools reuses a stale build/lib and would ship modules
#: that were moved or deleted since the last build in this checkout.
BUILD_LEFTOVERS = (
    ".git",
    ".venv",
    ".venv-dj6",
    "build",
    "dist",
    "*.egg-info",
    "node_modules",
    ".demo",
    "out",
    "__pycache__",
)


def copy_checkout(destination: Path) -> Path:
    """This checkout copied to ``destination`` without virtualenvs or build artifacts."""
    shutil.copytree(ROOT, destination, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
    return destination


def run_ok(args, *, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess[str]:
    """``args`` run to its end (``kwargs`` as ``subprocess.run`` takes them), asserted to
    exit 0; its output, in text, is in the assertion's message."""
    done = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done


def project_env(*paths: Path, settings_module: str = "settings", **extra: str) -> dict[str, str]:
    """The environment of a project's subprocess: ``paths`` on PYTHONPATH, its settings
    module, ``extra`` variables, and none of the test run's FAIRQUEUE_* or DATABASE_URL
    (the project's own settings say where Redis and the database are)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(path) for path in paths),
        "DJANGO_SETTINGS_MODULE": settings_module,
        **extra,
    }
    for variable in ("FAIRQUEUE_REDIS_URL", "FAIRQUEUE_PREFIX", "DATABASE_URL"):
        env.pop(variable, None)
    return env


def shop_project(
    directory: Path,
    *,
    tasks_py: str,
    apps: tuple[str, ...],
    redis_url: str,
    prefix: str,
    site: Path,
    **env: str,
) -> Callable[..., str]:
    """A project in ``directory`` with one app, ``shop`` (its ``tasks.py`` is
    ``tasks_py``), ``apps`` and ``shop`` in INSTALLED_APPS, SQLite, fairqueue on
    ``redis_url`` under ``prefix``, and FairQueueBackend as TASKS' default; fairqueue
    imported from ``site``. Returns ``manage(*args)``: ``python -m django *args`` in the
    project (``env`` added to its environment), asserted to succeed; its stdout."""
    app = directory / "shop"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text(textwrap.dedent(tasks_py))
    installed = ["django.contrib.contenttypes", "django.contrib.auth", *apps, "shop"]
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(directory / "db.sqlite3")}
    (directory / "settings.py").write_text(
        textwrap.dedent(
            f"""
            SECRET_KEY = "fresh-project"
            USE_TZ = True
            INSTALLED_APPS = {installed!r}
            DATABASES = {{"default": {database!r}}}
            FAIRQUEUE = {{"REDIS_URL": {redis_url!r}, "PREFIX": {prefix!r}}}
            TASKS = {{"default": {{"BACKEND": "fairqueue.tasks.backend.FairQueueBackend"}}}}
            """
        )
    )
    environment = project_env(directory, site, **env)

    def manage(*args: str) -> str:
        return run_ok(
            [sys.executable, "-m", "django", *args], cwd=directory, env=environment
        ).stdout

    return manage
