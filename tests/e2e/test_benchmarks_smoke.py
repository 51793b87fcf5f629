"""The benchmarks docs/benchmarks.md cites, run to their table with a tiny size on the
versions the requirements resolve to today: a benchmark that stops before its first row
on a fresh install (redis-py's default socket timeout against a blocking XREAD was one)
fails here, not in a reader's hands. Figures are not checked: speed is the benchmarks'
business, on a quiet machine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.fresh_project import ROOT

pytestmark = pytest.mark.slow

#: script -> (tiny arguments, a line of the table it prints at the end).
CASES = {
    "bench_enqueue.py": (["--jobs", "50"], "batch of 100: enqueue_jobs vs Queue.addBulk"),
    "bench_tasks.py": (["--jobs", "50"], "read: get_result vs getJobState + Job.fromId"),
    "bench_instructions.py": (["--jobs", "5", "--rate", "200"], "| 1 | "),
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_benchmark__runs_to_its_table_with_a_tiny_size(script):
    args, last_row = CASES[script]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert last_row in done.stdout, output
