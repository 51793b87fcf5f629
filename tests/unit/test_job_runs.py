"""What the worker does with each job it takes (fairqueue.worker.job_runs.JobRuns), without
Redis: which function runs it, what a handler is given, the thread a sync one runs in
and what it sees there, and the counting after it (metrics, recycling)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from prometheus_client import REGISTRY

from fairqueue.broker import ActiveJob
from fairqueue.exceptions import NoHandlerError
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.worker.handlers import JobContext
from fairqueue.worker.job_runs import JobRuns
from fairqueue.worker.queue_plans import QueuePlan
from fairqueue.worker.recycling import Recycling

REQUEST = contextvars.ContextVar("REQUEST", default="unset")


def job(name: str = "email", data: Any = None, attempts: int = 0) -> ActiveJob:
    if data is None:
        data = {"to": "a@example.com", "tenantId": "acme", "priorityLevel": "high"}
    return ActiveJob("7", name, data, attempts, 1_000, 2_000)


def run(plan: QueuePlan, *jobs: ActiveJob, recycling: Recycling | None = None) -> list[Any]:
    """Each job through a started JobRuns on a fresh loop; the results or exceptions."""
    recycled: list[str] = []
    runs = JobRuns(recycling or Recycling(), recycled.append)

    async def main() -> list[Any]:
        runs.start(threads=2)
        try:
            return await asyncio.gather(
                *(runs.process(plan, one) for one in jobs), return_exceptions=True
            )
        finally:
            runs.shutdown()

    results = asyncio.run(main())
    return [*results, *recycled]


def count(queue: str, job_type: str, outcome: str) -> float:
    labels = {"queue": queue, "job_type": job_type, "outcome": outcome}
    return REGISTRY.get_sample_value("queue_fair_worker_jobs_total", labels) or 0.0


def test_sync_handler__gets_the_payload_and_context_in_a_job_thread():
    seen = []

    def handler(payload: Any, context: JobContext) -> str:
        seen.append((payload, context, threading.current_thread().name))
        return "ignored"  # a handler's return value is not the job's

    assert run(QueuePlan("q-sync", {"email": handler}), job(attempts=1)) == [None]
    [(payload, context, thread)] = seen
    assert payload == {"to": "a@example.com"}
    assert context == JobContext("7", "email", "acme", PriorityLevel.HIGH, 1, 1_000, 2_000)
    assert thread.startswith("fairqueue-job")


def test_async_handler__is_awaited_on_the_loop():
    seen = []

    async def handler(payload: Any, context: JobContext) -> None:
        seen.append(
            (payload, context.job_type, threading.current_thread() is threading.main_thread())
        )

    assert run(QueuePlan("q-async", {"email": handler}), job(data=[1, 2])) == [None]
    assert seen == [([1, 2], "email", True)]


def test_sync_handler__sees_the_callers_context_variables_and_async_to_sync_uses_the_loop():
    # As under asgiref's sync_to_async: the context is copied into the thread, and
    # async_to_sync there runs its coroutine on the worker's loop (the main thread here).
    seen = []

    async def on_loop() -> bool:
        await asyncio.sleep(0)
        return threading.current_thread() is threading.main_thread()

    def handler(payload: Any, context: JobContext) -> None:
        seen.append((REQUEST.get(), async_to_sync(on_loop)()))
        REQUEST.set("changed in the thread")

    token = REQUEST.set("the worker's")
    try:
        assert run(QueuePlan("q-ctx", {"email": handler}), job(), job()) == [None, None]
        assert REQUEST.get() == "the worker's"
    finally:
        REQUEST.reset(token)
    assert seen == [("the worker's", True)] * 2


def test_failing_handler__raises_and_is_counted_failed_a_done_one_done():
    def handler(payload: Any, context: JobContext) -> None:
        if payload["n"] == 1:
            raise RuntimeError("boom")

    before = count("q-count", "email", "done"), count("q-count", "email", "failed")
    results = run(QueuePlan("q-count", {"email": handler}), job(data={"n": 0}), job(data={"n": 1}))
    assert results[0] is None and isinstance(results[1], RuntimeError)
    after = count("q-count", "email", "done"), count("q-count", "email", "failed")
    assert (after[0] - before[0], after[1] - before[1]) == (1.0, 1.0)


def test_recycling__the_bound_is_reported_once_after_the_job_that_reaches_it():
    recycling = Recycling(max_jobs=2)
    plan = QueuePlan("q-recycle", {"email": lambda payload, context: None})
    results = run(plan, job(), job(), job(), recycling=recycling)
    assert results == [None, None, None, "2 jobs done (--max-jobs-per-child 2)"]
    assert recycling.jobs_done == 3


def test_job_of_no_job_type__fails_naming_the_queues_job_types():
    shared = QueuePlan("q-shared", {"report": lambda p, c: None, "email": lambda p, c: None})
    [error] = run(shared, job(name="cleanup"))
    assert isinstance(error, NoHandlerError)
    assert "named 'cleanup'" in str(error) and "'email', 'report'" in str(error)


@pytest.mark.parametrize("handlers", [{}, {"email": lambda payload, context: "handled"}])
def test_task_job_type__a_job_that_is_no_task_goes_to_the_handler_or_fails(handlers):
    ran: list[Callable[..., Any]] = []
    if handlers:
        handlers = {"email": lambda payload, context: ran.append(payload)}
    plan = QueuePlan("q-task", handlers, task_types=frozenset({"email"}))
    [result] = run(plan, job(data={"n": 1}))
    if handlers:
        assert result is None and ran == [{"n": 1}]
    else:
        assert isinstance(result, NoHandlerError) and "not a Django task job" in str(result)


def test_in_thread__before_start_is_an_error():
    with pytest.raises(RuntimeError, match="before start"):
        JobRuns(Recycling(), lambda reason: None).in_thread(print)
