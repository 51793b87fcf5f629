"""``job_status`` and ``estimate_start`` on real Redis with stock workers: each state, the
place in line a stock worker then keeps, held jobs and why, estimates carried by
``EnqueuedJob`` and kept in the job's opts for the estimate-error metric."""

from __future__ import annotations

import asyncio
import json

import pytest
from bullmq import Worker
from django.core.exceptions import ImproperlyConfigured

import fairqueue
from fairqueue import (
    ExpectedWaitTooLongError,
    InvalidJobOptionError,
    UnknownJobTypeError,
    enqueue_job,
    enqueue_jobs,
    estimate_start,
    job_status,
    pause_tenant,
)
from fairqueue.rebalance.passes import rebalance_queue
from tests.helpers import drain_with_stock_worker, metric
from tests.helpers.keys import REDIS_URL

pytestmark = pytest.mark.django_db


def test_the_place_in_line_is_what_a_stock_worker_keeps(fq_prefix):
    """Every waiting job's ``ahead`` is the number of jobs a stock worker takes before it."""
    jobs = enqueue_jobs("email", [{}] * 12, tenant_id="flood", priority_level="low")
    jobs += enqueue_jobs("email", [{}] * 4, tenant_id="ops", priority_level="critical")
    jobs.append(enqueue_job("email", {}, tenant_id="small", priority_level="low"))
    said = {job.job_id: job_status("email", job.job_id) for job in jobs}
    assert {status.state for status in said.values()} == {"waiting"}
    order = [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", len(jobs))]
    assert [said[job_id].ahead for job_id in order] == list(range(len(jobs)))


def test_finished_failed_and_gone_jobs(fq_prefix):
    done = enqueue_job("email", {"ok": True}, tenant_id="t")
    bad = enqueue_job("email", {"ok": False}, tenant_id="t")

    async def run() -> None:
        seen = asyncio.Event()
        count = 0

        async def process(job, token):
            nonlocal count
            count += 1
            if count >= 2:
                seen.set()
            if not job.data["ok"]:
                raise RuntimeError("boom")

        worker = Worker(
            "email", process, {"connection": REDIS_URL, "prefix": fq_prefix, "autorun": False}
        )
        task = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(seen.wait(), 20)
        await asyncio.sleep(0.3)
        await worker.close()
        task.cancel()

    asyncio.run(run())
    completed, failed = job_status("email", done.job_id), job_status("email", bad.job_id)
    assert completed.state == "completed" and failed.state == "failed"
    assert completed.started_ms is not None and completed.finished_ms >= completed.started_ms
    assert failed.estimate.confidence == "high" and failed.ahead == 0
    assert job_status("email", "no-such-job") is None
    assert job_status("email", "wait") is None  # one of the queue's own keys, not a job


def test_a_delayed_job_starts_when_due(fq_prefix):
    job = enqueue_job("email", {}, tenant_id="t", delay_ms=60_000)
    status = job_status("email", job.job_id)
    assert status.state == "delayed"
    assert 30_000 <= status.estimate.expected_wait_ms <= 60_000  # due in a minute
    assert status.public()["expected_start_ms"] == status.expected_start_ms


def test_held_jobs_say_which_limit_holds_them(limited):
    jobs = enqueue_jobs("email", [{}] * 5, tenant_id="acme")  # max_active=2
    statuses = [job_status("email", job.job_id) for job in jobs]
    assert [s.state for s in statuses] == ["waiting"] * 2 + ["held"] * 3
    assert [s.held_reason for s in statuses[2:]] == ["max_active"] * 3
    assert [s.ahead for s in statuses[2:]] == [0, 1, 2]  # its place among the held jobs
    new = estimate_start("email", tenant_id="acme")
    assert new.held_reason == "max_active"
    assert estimate_start("email", tenant_id="beta").held_reason is None


def test_a_paused_tenants_jobs_have_no_estimate(limited):
    pause_tenant("acme")
    job = enqueue_job("email", {}, tenant_id="acme")
    status = job_status("email", job.job_id)
    assert status.state == "held" and status.held_reason == "paused"
    assert status.expected_start_ms is None and status.estimate.confidence == "none"
    estimate = estimate_start("email", tenant_id="acme")
    assert estimate.held_reason == "paused" and estimate.expected_wait_ms is None


def test_bad_input_names_the_argument(fq_prefix):
    with pytest.raises(UnknownJobTypeError, match="job_type='nope'"):
        job_status("nope", "1")
    with pytest.raises(InvalidJobOptionError, match="job_id=''"):
        job_status("email", "")
    with pytest.raises(InvalidJobOptionError, match="count=0 is not allowed"):
        estimate_start("email", tenant_id="t", count=0)
    with pytest.raises(InvalidJobOptionError, match="max_wait_ms=-1 is not allowed"):
        enqueue_job("email", {}, tenant_id="t", max_wait_ms=-1)
    with pytest.raises(InvalidJobOptionError, match="estimate='yes' is not allowed"):
        enqueue_job("email", {}, tenant_id="t", estimate="yes")


def _measure(fq_prefix: str, tenant: str, jobs: int) -> None:
    """Serve ``jobs`` jobs with a stock worker and record them as the loop does, so the
    service rate is measured."""
    rebalance_queue("email", rebalancer="eta-test")  # the history's cursor
    enqueue_jobs("email", [{}] * jobs, tenant_id=tenant, priority_level="normal")
    drain_with_stock_worker(fq_prefix, "email", jobs)
    rebalance_queue("email", rebalancer="eta-test")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def test_the_estimate_rides_on_the_job_and_its_error_is_measured(fq_prefix, redis_client):
    _measure(fq_prefix, "warm", 30)
    backlog = enqueue_jobs("email", [{}] * 20, tenant_id="a", priority_level="normal")
    job = enqueue_job("email", {}, tenant_id="a", priority_level="normal", estimate=True)
    assert job.estimate is not None and job.estimate.ahead == len(backlog)
    assert job.estimate.expected_wait_ms > 0 and job.estimate.confidence != "none"
    opts = json.loads(redis_client.hget(f"{fq_prefix}:email:{job.job_id}", "opts"))
    assert opts["fqEta"] == job.estimate.expected_start_ms
    batch = enqueue_jobs("email", [{}] * 4, tenant_id="a", priority_level="normal", estimate=True)
    starts = [job.estimate.expected_start_ms for job in batch]
    assert starts == sorted(starts) and starts[0] < starts[-1]
    assert [job.estimate.ahead for job in batch] == list(range(21, 25))
    for job in batch:
        opts = json.loads(redis_client.hget(f"{fq_prefix}:email:{job.job_id}", "opts"))
        assert opts["fqEta"] == job.estimate.expected_start_ms
    plain = enqueue_job("email", {}, tenant_id="a", priority_level="normal")
    assert plain.estimate is None
    assert "fqEta" not in json.loads(redis_client.hget(f"{fq_prefix}:email:{plain.job_id}", "opts"))
    name = "queue_fair_start_estimate_error_seconds_count"
    before = metric(name, job_type="email", priority_level="normal")
    drain_with_stock_worker(fq_prefix, "email", len(backlog) + 6)
    rebalance_queue("email", rebalancer="eta-test")
    assert metric(name, job_type="email", priority_level="normal") == before + 5
    # the history bins the five and sums the waits they expected (the calibration's scale)
    binned, scale = 0, 0
    for key in redis_client.scan_iter(f"{fq_prefix}:email:fq:hist:*"):
        if redis_client.type(key) in (b"hash", "hash"):
            row = {_text(k): int(float(v)) for k, v in redis_client.hgetall(key).items()}
            binned += sum(
                v for k, v in row.items() if k.startswith("e:normal:") and k[9:].isdigit()
            )
            scale += row.get("e:normal:w", 0)
    expected = [job.estimate.expected_wait_ms, *(j.estimate.expected_wait_ms for j in batch)]
    assert binned == 5
    # from the job's ready time (its add, a little after the estimate's read)
    assert sum(expected) - 5 * 500 <= scale <= sum(expected)


def test_max_wait_refuses_the_flooding_tenant_and_admits_the_trickling_one(fq_prefix, redis_client):
    """A real backlog: one tenant floods a level, another of the same level sends one job
    now and then. With a bound both would pass on an empty queue, the flood's next job is
    refused (it would wait behind its own backlog, at its half of the workers) while the
    trickle's job, placed at its fair turn near the head, is admitted every time."""
    _measure(fq_prefix, "warm", 40)
    rate = estimate_start("email", tenant_id="x", priority_level="normal")
    assert rate.confidence != "none"
    enqueue_jobs("email", [{}] * 400, tenant_id="flood", priority_level="normal")
    flood = estimate_start("email", tenant_id="flood", priority_level="normal")
    trickle = estimate_start("email", tenant_id="trickle", priority_level="normal")
    assert trickle.expected_wait_ms * 10 < flood.expected_wait_ms
    bound = (flood.expected_wait_ms + trickle.expected_wait_ms) // 2

    def keys() -> int:  # under this test's prefix: the shared Redis has others' keys
        return sum(1 for _ in redis_client.scan_iter(f"{fq_prefix}:*", count=1_000))

    keys_before = keys()
    with pytest.raises(ExpectedWaitTooLongError) as refused:
        enqueue_job("email", {}, tenant_id="flood", priority_level="normal", max_wait_ms=bound)
    assert keys() == keys_before  # nothing written
    assert refused.value.expected_wait_ms > bound
    assert refused.value.retry_after_s >= 1
    assert 0 < refused.value.share <= 1
    with pytest.raises(ExpectedWaitTooLongError):
        enqueue_jobs(
            "email", [{}] * 3, tenant_id="flood", priority_level="normal", max_wait_ms=bound
        )
    for _ in range(5):
        admitted = enqueue_job(
            "email", {}, tenant_id="trickle", priority_level="normal", max_wait_ms=bound
        )
        assert admitted.created
        drain_with_stock_worker(fq_prefix, "email", 1)  # the trickle's job leaves the line
    assert fairqueue.job_status("email", admitted.job_id) is not None


def test_the_status_endpoint_shows_a_job_for_its_token_and_nothing_else(fq_prefix, client):
    job = enqueue_job(
        "email", {"secret": "payload-x"}, tenant_id="tenant-secret", job_id="job-id-x"
    )
    response = client.get(f"/jobs/{job.status_token}/")
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "waiting" and body["ahead"] == 0
    text = response.content.decode()
    for hidden in ("payload-x", "tenant-secret", "secret", job.job_id, "email"):
        assert hidden not in text
    assert set(body) == {
        "state",
        "held_reason",
        "ahead",
        "expected_start_ms",
        "earliest_start_ms",
        "latest_start_ms",
        "confidence",
        "started_ms",
        "finished_ms",
    }


def test_tampered_expired_and_gone_tokens_get_404(
    fq_prefix, client, settings, redis_client, monkeypatch
):
    import time

    from django.core import signing

    job = enqueue_job("email", {}, tenant_id="t")
    token = job.status_token
    tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    assert client.get(f"/jobs/{tampered}/").status_code == 404
    other = enqueue_job("email", {}, tenant_id="t")
    forged = signing.dumps(["email", other.job_id], compress=True)  # no salt: not a token
    assert client.get(f"/jobs/{forged}/").status_code == 404
    assert client.get("/jobs/not-a-token/").status_code == 404
    unknown_type = signing.dumps(["nope", job.job_id], salt="fairqueue.status", compress=True)
    assert client.get(f"/jobs/{unknown_type}/").status_code == 404
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 7200)  # signed two hours ago
    old = job.status_token
    monkeypatch.setattr(time, "time", real)
    settings.FAIRQUEUE_STATUS_TOKEN_MAX_AGE_S = 3600
    assert client.get(f"/jobs/{old}/").status_code == 404  # expired
    assert client.get(f"/jobs/{token}/").status_code == 200
    settings.FAIRQUEUE_STATUS_TOKEN_MAX_AGE_S = 0
    with pytest.raises(ImproperlyConfigured, match="FAIRQUEUE_STATUS_TOKEN_MAX_AGE_S=0"):
        client.get(f"/jobs/{token}/")
    settings.FAIRQUEUE_STATUS_TOKEN_MAX_AGE_S = 3600
    redis_client.delete(f"{fq_prefix}:email:{job.job_id}")
    assert client.get(f"/jobs/{token}/").status_code == 404  # the job is gone


def test_a_refusal_becomes_a_429_with_retry_after():
    from fairqueue.exceptions import ExpectedWaitTooLongError
    from fairqueue.http import refuse_with_429

    @refuse_with_429
    def view(request):
        raise ExpectedWaitTooLongError(
            job_type="email",
            level="normal",
            expected_wait_ms=9_500,
            max_wait_ms=2_000,
            retry_after_s=8,
            share=0.5,
        )

    response = view(None)
    assert response.status_code == 429 and response["Retry-After"] == "8"
    assert b"expected_wait_ms" in response.content


try:  # Django 6: its own django.tasks; Django 5.2: the django-tasks backport
    from django.tasks import task, task_backends
except ImportError:
    from django_tasks import task, task_backends


@task()
def eta_task(tenant_id: str | None = None) -> int:
    return 1


def test_the_tasks_backend_option_refuses_a_task_over_its_share(fq_prefix):
    from django.test import override_settings

    backend = "fairqueue.tasks.backend.FairQueueBackend"
    options = {"JOB_TYPES": {"default": "email"}, "MAX_WAIT_MS": 0}
    with override_settings(TASKS={"default": {"BACKEND": backend, "OPTIONS": options}}):
        with pytest.raises(ImproperlyConfigured, match=r"\['MAX_WAIT_MS'\]: max_wait_ms=0"):
            task_backends["default"]
    _measure(fq_prefix, "warm", 30)
    enqueue_jobs("email", [{}] * 300, tenant_id="flood", priority_level="normal")
    flood = estimate_start("email", tenant_id="flood", priority_level="normal")
    options["MAX_WAIT_MS"] = max(1, flood.expected_wait_ms // 4)
    with override_settings(TASKS={"default": {"BACKEND": backend, "OPTIONS": options}}):
        with pytest.raises(ExpectedWaitTooLongError):
            eta_task.using(priority=0).enqueue(tenant_id="flood")
        assert eta_task.enqueue(tenant_id="calm").status is not None


def test_the_dashboard_pages_can_show_the_expected_start(limited):
    from fairqueue.dashboard.expected import job_expected_start, tenant_expected_start

    jobs = enqueue_jobs("email", [{}] * 3, tenant_id="acme")  # max_active=2: one held
    shown = job_expected_start("email", jobs[2].job_id)
    assert shown is not None
    assert shown.state == "held" and shown.held_reason == "max_active"
    assert isinstance(shown.text, str) and shown.text
    assert job_expected_start("email", jobs[0].job_id).text == "now"
    assert job_expected_start("email", "no-such-job") is None
    tenant = tenant_expected_start("email", "beta", "normal")
    assert tenant.held_reason is None and tenant.text == "now"
    pause_tenant("acme")
    assert tenant_expected_start("email", "acme").text == "not while its tenant is paused"
