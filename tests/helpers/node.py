"""Stock Node BullMQ workers (tests/node/, its pinned ``bullmq``) run beside fairqueue:
plain BullMQ on the wire is checked against BullMQ's own Node implementation. The
``node`` and ``node_worker`` fixtures (tests/conftest.py) skip where Node is missing."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.fresh_project import run_ok
from tests.helpers.keys import REDIS_URL

NODE_DIR = Path(__file__).resolve().parents[1] / "node"


def run_node_worker(node_worker, prefix, count):
    done = run_ok([*node_worker, REDIS_URL, prefix, "email", str(count)], timeout=90)
    return done.stdout.split()


@dataclass(frozen=True)
class Start:
    job_id: str
    tenant: str
    attempts_made: int
    at_ms: int


class NodeWorker:
    """A stock Node BullMQ worker (``tests/node/limits_worker.mjs``) in its own process:
    ``concurrency`` slots for ``run_ms``, jobs of ``job_ms``; ``fail_tenant``'s jobs throw.
    ``starts()`` waits for it to end and returns every attempt it started."""

    def __init__(
        self, node, prefix, *, concurrency=16, run_ms=4000, job_ms=100, fail="", url=REDIS_URL
    ):
        self.process = subprocess.Popen(  # noqa: S603
            [
                node,
                str(NODE_DIR / "limits_worker.mjs"),
                url,
                prefix,
                "email",
                str(concurrency),
                str(run_ms),
                str(job_ms),
                fail,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def starts(self) -> list[Start]:
        out, err = self.process.communicate(timeout=60)
        assert self.process.returncode == 0, err
        found = []
        for line in out.splitlines():
            _, job_id, tenant, made, at = line.split(" ")
            found.append(Start(job_id, tenant, int(made), int(at)))
        return found


def active_ids(redis_client, prefix) -> list[str]:
    return redis_client.lrange(f"{prefix}:email:active", 0, -1)
