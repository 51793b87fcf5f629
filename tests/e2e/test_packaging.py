"""What a maintainer publishes: the wheel's metadata, the extras, the sdist's contents,
the one place the version is written, twine's check of both, and the wheel in a fresh
Django 6.0 project."""

from __future__ import annotations

import email.parser
import shlex
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import fairqueue
from tests.helpers.fresh_project import ROOT, copy_checkout, run_ok
from tests.helpers.quickstart import check_quickstart, follow_quickstart


def _wheel_metadata(site: Path) -> email.message.Message:
    (metadata,) = site.glob("django_fairqueue-*.dist-info/METADATA")
    return email.parser.Parser().parsestr(metadata.read_text())


def test_pyproject__the_version_is_read_from_the_package_not_written_twice():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fairqueue.__version__"}


def test_wheel__version_classifiers_license_and_extras(installed_wheel):
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
    source = copy_checkout(tmp_path / "source")
    dist = tmp_path / "dist"
    run_ok(
        # The build frontend, in an isolated environment with pyproject's build requirements
        # (setuptools>=77, as pip's wheel build in installed_wheel).
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), str(source)],
        cwd=source,
    )
    (sdist,) = dist.glob("django_fairqueue-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    shipped_docs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").iterdir()}
    assert shipped_docs <= names, shipped_docs - names
    assert {"LICENSE", "CHANGELOG.md", "README.md", "CONTRIBUTING.md"} <= names


# -- what a maintainer uploads: twine's check, and the wheel in a fresh Django 6.0 project --


def _run(*args: str, timeout: int = 600, **kwargs) -> str:
    done = run_ok(args, timeout=timeout, **kwargs)
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def built_dists(tmp_path_factory) -> Path:
    """The sdist and the wheel `python -m build` makes from a clean copy of this checkout,
    as a maintainer publishes them (the wheel built from the sdist)."""
    source = copy_checkout(tmp_path_factory.mktemp("source") / "django-fairqueue")
    dist = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--outdir", str(dist), str(source), cwd=source)
    return dist


def _python312() -> list[str]:
    """A command that runs Python 3.12 (python3.12, or pyenv's), as `make test-django6`
    and .ci/run find it."""
    found = subprocess.run(
        ["bash", str(ROOT / ".ci" / "python312")], capture_output=True, text=True, check=False
    )
    if found.returncode != 0 or not found.stdout.strip():
        pytest.skip("no Python 3.12 (.ci/python312 found none): Django 6.0 needs it")
    return shlex.split(found.stdout.strip())


@pytest.fixture(scope="module")
def django60_venv(tmp_path_factory, built_dists) -> Path:
    """A fresh virtualenv on Python 3.12 with the built wheel and Django 6.0 from PyPI
    (the wheel's other dependencies resolved by pip as a user's would be), and twine."""
    venv = tmp_path_factory.mktemp("venv-dj60") / "venv"
    _run(*_python312(), "-m", "venv", str(venv))
    python = venv / "bin" / "python"
    (wheel,) = built_dists.glob("django_fairqueue-*.whl")
    _run(
        str(python),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "-q",
        str(wheel),
        "django>=6.0,<6.1",
        "twine>=6,<7",
    )
    return venv


@pytest.mark.slow
def test_dists__twine_check_strict_passes_on_the_sdist_and_the_wheel(built_dists, django60_venv):
    (sdist,) = built_dists.glob("django_fairqueue-*.tar.gz")
    (wheel,) = built_dists.glob("django_fairqueue-*.whl")
    out = _run(
        str(django60_venv / "bin" / "python"),
        "-m",
        "twine",
        "check",
        "--strict",
        str(sdist),
        str(wheel),
    )
    assert out.count("PASSED") == 2, out


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_wheel__the_readme_quickstart_in_a_fresh_django_60_project(tmp_path, django60_venv):
    """Django 5.2 (`make test`) and 6.1 (`make test-django6`) follow the quickstart from
    the wheel in tests/e2e/test_quickstart.py; this is Django 6.0, from PyPI."""
    python = django60_venv / "bin" / "python"
    version = _run(str(python), "-c", "import django; print(django.get_version())").strip()
    assert version.startswith("6.0"), version
    site = Path(
        _run(
            str(python),
            "-c",
            "import fairqueue, pathlib; print(pathlib.Path(fairqueue.__file__).parent.parent)",
            cwd=tmp_path,  # not this checkout, which `python -c` would import from
        ).strip()
    )
    assert site.is_relative_to(django60_venv)
    steps = follow_quickstart(tmp_path / "site", site, interpreter=str(python))
    check_quickstart(steps, site)
