"""What a maintainer publishes: the wheel's metadata, the extras, the sdist's contents and
the one place the version is written."""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

import fairqueue
from tests.test_tasks_backend import (  # noqa: F401 - installed_wheel is a fixture
    ROOT,
    installed_wheel,
)


def _wheel_metadata(site: Path) -> email.message.Message:
    (metadata,) = site.glob("django_fairqueue-*.dist-info/METADATA")
    return email.parser.Parser().parsestr(metadata.read_text())


def test_pyproject__the_version_is_read_from_the_package_not_written_twice():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fairqueue.__version__"}


def test_wheel__version_classifiers_license_and_extras(installed_wheel):  # noqa: F811
    metadata = _wheel_metadata(installed_wheel)
    assert metadata["Version"] == fairqueue.__version__
    assert metadata["License-Expression"] == "MIT"
    (dist_info,) = installed_wheel.glob("django_fairqueue-*.dist-info")
    assert "MIT License" in (dist_info / "licenses" / "LICENSE").read_text()
    classifiers = metadata.get_all("Classifier")
    for classifier in (
        "Framework :: Django :: 5.2",
        "Framework :: Django :: 6.0",
        "Framework :: Django :: 6.1",
        "Typing :: Typed",
    ):
        assert classifier in classifiers
    assert (installed_wheel / "fairqueue" / "py.typed").is_file()

    extras: dict[str, set[str]] = {}
    for line in metadata.get_all("Requires-Dist"):
        requirement = Requirement(line)
        if requirement.marker is None:
            continue
        for extra in ("celery", "prometheus", "tasks"):
            if requirement.marker.evaluate({"extra": extra}):
                extras.setdefault(extra, set()).add(
                    requirement.name + "".join(f"[{e}]" for e in sorted(requirement.extras))
                )
    # Celery's Redis transport (kombu.transport.redis) imports packages plain celery
    # does not install; its `redis` extra does.
    assert extras == {
        "celery": {"celery[redis]"},
        "prometheus": {"django-prometheus"},
        "tasks": {"django-tasks"},
    }


def test_sdist__carries_the_docs_license_and_changelog(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".venv-dj6", "build", "*.egg-info", "node_modules", ".demo", "out"
        ),
    )
    dist = tmp_path / "dist"
    done = subprocess.run(
        # The build frontend, in an isolated environment with pyproject's build requirements
        # (setuptools>=77, as pip's wheel build in installed_wheel).
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), str(source)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = dist.glob("django_fairqueue-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    shipped_docs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").iterdir()}
    assert shipped_docs <= names, shipped_docs - names
    assert {"LICENSE", "CHANGELOG.md", "README.md", "CONTRIBUTING.md"} <= names
