"""docs/operations.md's code, run: the Node worker it shows takes jobs from enqueue_job."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import uuid
from pathlib import Path

from fairqueue.enqueue.api import enqueue_job
from tests.helpers import wait_until
from tests.helpers.keys import REDIS_URL
from tests.helpers.node import NODE_DIR

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def documented_node_worker() -> str:
    section = OPERATIONS.read_text().split("### Node (and other stock) workers", 1)[1]
    (code,) = re.findall(r"```js\n(.*?)```", section.split("\n## ", 1)[0], flags=re.DOTALL)
    return code


def test_node_worker_of_the_docs__runs_jobs_from_enqueue_job(node_worker, fq_prefix, redis_client):  # noqa: F811
    code = documented_node_worker()
    for documented in ('"redis://127.0.0.1:6379/0"', 'prefix: "bull"'):
        assert documented in code
    code = code.replace('"redis://127.0.0.1:6379/0"', json.dumps(REDIS_URL))
    code = code.replace('prefix: "bull"', f"prefix: {json.dumps(fq_prefix)}")
    # Beside tests/node/node_modules, where Node resolves `import "bullmq"` from.
    script = NODE_DIR / f"doc_worker_{uuid.uuid4().hex[:8]}.mjs"
    script.write_text(code)
    tenant = enqueue_job("email", {"to": "ann@example.com"}, tenant_id="acme")
    internal = enqueue_job("email", {"to": "ops@example.com"}, internal=True)
    worker = subprocess.Popen(
        [node_worker[0], str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(
            lambda: redis_client.zcard(f"{fq_prefix}:email:completed") == 2, timeout_s=60
        )
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        script.unlink()
    assert worker.returncode == 0, err
    assert f"job {tenant.job_id} for acme (normal)" in out, out
    assert f"job {internal.job_id} for internal work (critical)" in out, out
    stored = redis_client.hget(f"{fq_prefix}:email:{tenant.job_id}", "returnvalue")
    assert json.loads(stored) == {"to": "ann@example.com"}
