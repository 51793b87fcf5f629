"""docs/operations.md's Celery beat files, copied verbatim into a fresh project (fairqueue
installed from its wheel), run with ``celery -A mysite worker -B`` against a private
Redis: beat sends ``fairqueue.rebalance_fair`` every interval and the worker runs it."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest

from tests.helpers import PrivateRedis
from tests.helpers.doc_snippets import code_blocks, named_block
from tests.helpers.fresh_project import project_env, run_ok

pytestmark = pytest.mark.slow
PAGE = "docs/operations.md"
SUCCEEDED = re.compile(r"Task fairqueue\.rebalance_fair\[[0-9a-f-]+\] succeeded")


def test_celery_file__beat_runs_rebalance_fair_every_interval(tmp_path, installed_wheel):
    server = PrivateRedis(tmp_path / "redis", aof=False)
    (tmp_path / "redis").mkdir()
    server.start()
    project = tmp_path / "site"
    project.mkdir()
    env = project_env(project, installed_wheel, settings_module="mysite.settings")
    try:
        run_ok([sys.executable, "-m", "django", "startproject", "mysite", str(project)], env=env)
        package = project / "mysite"
        (package / "celery.py").write_text(named_block(PAGE, "# mysite/celery.py"))
        (package / "__init__.py").write_text(named_block(PAGE, "# mysite/__init__.py"))
        broker = named_block(PAGE, "# settings.py (Celery)")
        assert "127.0.0.1:6379" in broker, broker
        settings = package / "settings.py"
        settings.write_text(
            settings.read_text()
            + broker.replace("127.0.0.1:6379", f"127.0.0.1:{server.port}")
            + 'INSTALLED_APPS += ["fairqueue"]\n'
            + f"FAIRQUEUE = {{'REDIS_URL': 'redis://127.0.0.1:{server.port}/0', "
            f"'PREFIX': 'fq{uuid.uuid4().hex[:8]}', 'REBALANCE_INTERVAL_MS': 1000}}\n"
        )
        run_ok([sys.executable, "manage.py", "migrate", "--noinput"], cwd=project, env=env)
        (command,) = [
            body.strip()
            for language, body in code_blocks(PAGE)
            if language == "bash" and body.startswith("celery -A mysite")
        ]
        args = command.split()[1:] + ["--concurrency", "1"]
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", *args],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: list[str] = []
        try:
            deadline = time.monotonic() + 90  # a loaded machine starts Celery slowly
            started = None
            while time.monotonic() < deadline:
                line = worker.stdout.readline()
                if not line:
                    break
                lines.append(line)
                if started is None and "beat: Starting" in line:
                    started = time.monotonic()
                if len([x for x in lines if SUCCEEDED.search(x)]) >= 2 and (
                    started is not None and time.monotonic() - started >= 2
                ):
                    break
        finally:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
        output = "".join(lines)
        assert len(SUCCEEDED.findall(output)) >= 2, output
        assert "Scheduler: Sending due task fairqueue rebalance" in output, output
    finally:
        server.stop()
