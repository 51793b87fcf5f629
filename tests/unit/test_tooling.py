"""The contributor commands find their tools: `make test-django6` finds a Python 3.12 the
way CI does (python3.12 on PATH, or pyenv's 3.12 behind its shim)."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.helpers.fresh_project import run_ok

ROOT = Path(__file__).resolve().parents[2]
FINDER = ROOT / ".ci" / "python312"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _stub(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\n" + textwrap.dedent(script))
    path.chmod(0o755)


def _path_with(bin_dir: Path) -> str:
    """PATH with only the stubs and the basic tools (no real python3.12, no real pyenv)."""
    tools = bin_dir / "tools"
    tools.mkdir()
    for tool in ("bash", "env", "grep", "sort", "tail", "make", "sh"):
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).symlink_to(found)
    return os.pathsep.join([str(bin_dir), str(tools)])


@pytest.fixture
def pyenv_only(tmp_path):
    """A machine whose python3.12 is pyenv's shim: it runs only with PYENV_VERSION."""
    _stub(
        tmp_path,
        "python3.12",
        """
        [ "${PYENV_VERSION:-}" = "3.12.1" ] && exit 0
        echo "pyenv: python3.12: command not found" >&2
        exit 127
        """,
    )
    _stub(tmp_path, "pyenv", 'printf "3.11.7\\n3.12.1\\n3.13.0\\n"\n')
    return _path_with(tmp_path)


def _make_python_dj6(path: str, *args: str) -> str:
    done = run_ok(
        [
            "make",
            "--no-print-directory",
            "--eval",
            'show-python-dj6: ; @echo "$(PYTHON_DJ6)"',
            *args,
            "show-python-dj6",
        ],
        cwd=ROOT,
        env={"PATH": path, "HOME": os.environ.get("HOME", "/tmp")},
        timeout=60,
    )
    return done.stdout.strip()


def test_make_test_django6__finds_pyenvs_python_3_12_behind_its_shim(pyenv_only):
    assert _make_python_dj6(pyenv_only) == "env PYENV_VERSION=3.12.1 python3.12"


def test_make_test_django6__prefers_a_python3_12_that_runs_and_obeys_the_variable(tmp_path):
    _stub(tmp_path, "python3.12", "exit 0\n")
    path = _path_with(tmp_path)
    assert _make_python_dj6(path) == "python3.12"
    assert _make_python_dj6(path, "PYTHON_DJ6=/opt/py312/bin/python") == "/opt/py312/bin/python"


def test_make_test_django6__without_any_python_3_12_stops_with_what_to_set(tmp_path):
    path = _path_with(tmp_path)
    assert _make_python_dj6(path) == ""
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "VENV_DJ6=" + str(tmp_path / "v")]
        + [str(tmp_path / "v" / ".installed")],
        env={"PATH": path, "HOME": os.environ.get("HOME", "/tmp")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "no Python 3.12 found" in done.stderr and "PYTHON_DJ6=" in done.stderr
