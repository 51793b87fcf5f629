"""The worker's BullMQ workers finish a job and take the slot's next one in one script
call (fairqueue.broker.chaining), against a real Redis: every job still runs once, in
fewer round trips, and a stop leaves no job active."""

from __future__ import annotations

import pytest

import fairqueue
from fairqueue.broker import Broker
from fairqueue.broker.chaining import ChainingWorker
from fairqueue.worker.runner import Worker
from tests.helpers.keys import REDIS_URL
from tests.helpers.worker_jobs import add, counts

pytestmark = pytest.mark.serial


@pytest.fixture
def broker(prefix):
    return Broker(REDIS_URL, prefix)


@pytest.fixture
def fetches(monkeypatch):
    """Counts BullMQ's own fetches (moveToActive) of the chaining workers."""
    calls = []
    fetch = ChainingWorker.moveToActive

    async def counted(self, token):
        calls.append(token)
        return await fetch(self, token)

    monkeypatch.setattr(ChainingWorker, "moveToActive", counted)
    return calls


def test_a_slot_takes_its_next_job_as_it_finishes_one(broker, fetches):
    ran = []

    @fairqueue.handler("t_async")
    async def record(payload, job):
        ran.append(payload["n"])

    add(broker, "t_async", *({"n": n, "tenantId": "t", "priorityLevel": "low"} for n in range(20)))

    Worker(["t_async"], concurrency=1, burst=True, broker=broker).run()
    assert sorted(ran) == list(range(20))
    state = counts(broker, "t_async")
    assert (state["completed"], state["active"], state["prioritized"]) == (20, 0, 0)
    # One fetch took the first job; each completion fetched the next (before: 20+).
    assert len(fetches) <= 3, len(fetches)


def test_failed_jobs_fetch_nothing_and_every_job_still_runs_once(broker, fetches):
    ran = []

    @fairqueue.handler("t_fail")
    def fail_odd(payload, job):
        ran.append(payload["n"])
        if payload["n"] % 2:
            raise RuntimeError("odd")

    add(broker, "t_fail", *({"n": n, "tenantId": "t", "priorityLevel": "low"} for n in range(8)))

    Worker(["t_fail"], concurrency=2, burst=True, broker=broker).run()
    assert sorted(ran) == list(range(8))
    state = counts(broker, "t_fail")
    assert (state["completed"], state["failed"], state["active"]) == (4, 4, 0)
    assert len(fetches) >= 4  # after a failure the slot fetches on its own


def test_a_stop_during_a_chain_leaves_the_rest_waiting_and_none_active(broker):
    ran = []
    workers = []

    @fairqueue.handler("t_async")
    async def stop_at_the_third(payload, job):
        ran.append(payload["n"])
        if len(ran) == 3:
            workers[0].request_stop()

    worker = Worker(["t_async"], concurrency=1, broker=broker, install_signal_handlers=False)
    workers.append(worker)

    add(broker, "t_async", *({"n": n, "tenantId": "t", "priorityLevel": "low"} for n in range(10)))

    worker.run()
    state = counts(broker, "t_async")
    # Jobs fetched before the stop reached BullMQ's close() ran; none was left active.
    assert state["active"] == 0 and state["completed"] == len(ran) and 3 <= len(ran) < 10
    assert state["prioritized"] + state["wait"] == 10 - len(ran)
