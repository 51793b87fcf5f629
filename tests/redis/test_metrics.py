import asyncio
import shutil
import subprocess
import time

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.exceptions import BrokerRejectedError
from fairqueue.metrics import (
    enqueue_priority_label,
    get_metrics,
    initialize_queue_fair_metrics,
    metrics_view,
)
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.scheduling.levels import PriorityLevel
from tests.helpers import metric, stock_worker_until

#: Every family fairqueue exports (histograms and counters by their base name).
FAMILIES = (
    "queue_fair_priority_assigned",
    "queue_fair_decisions",
    "queue_fair_aged_boosts",
    "queue_fair_overdue_waiting",
    "queue_jobs_enqueued",
    "queue_fair_outbox_pending",
    "queue_fair_wait_seconds",
    "queue_fair_jobs_started",
    "queue_fair_level_overdue_waiting",
    "queue_fair_pass_duration_seconds",
    "queue_fair_pass_errors",
    "queue_fair_leader",
    "queue_fair_last_pass_success_timestamp_seconds",
    "queue_fair_rebalance_interval_seconds",
    "queue_fair_max_wait_seconds",
    "queue_fair_level_weight",
    "queue_fair_worker_seconds",
    "queue_fair_retries",
)


def test_initialize_is_idempotent_and_uses_seed_names():
    registry = CollectorRegistry()
    first = initialize_queue_fair_metrics(registry, job_types=["email"], queues=["email"])
    second = initialize_queue_fair_metrics(registry, job_types=["email"])
    assert first is second
    text = generate_latest(registry).decode()
    for name in (
        "queue_fair_priority_assigned_total",
        "queue_fair_decisions_total",
        "queue_fair_aged_boosts_total",
        "queue_fair_overdue_waiting",
        "queue_jobs_enqueued_total",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text


def test_series_exist_at_zero_for_configured_job_types():
    registry = CollectorRegistry()
    initialize_queue_fair_metrics(registry, job_types=["email"], queues=["email"])
    assert (
        registry.get_sample_value(
            "queue_fair_decisions_total",
            {"job_type": "email", "queue": "email", "decision": "aged"},
        )
        == 0
    )
    assert (
        registry.get_sample_value(
            "queue_jobs_enqueued_total", {"queue": "email", "priority": "other"}
        )
        == 0
    )


def test_every_family_is_labelled_by_queue_without_more_series(settings):
    """One ``queue`` filter selects every family: a job type's series carry its queue
    (a job type has one queue, so the label adds no series), and the settings gauges
    are per queue; the names and the labels they had before are all still there."""
    from fairqueue.metrics import FAMILIES

    for family in FAMILIES:
        assert "queue" in family.labels, family.name
        if "job_type" in family.labels:
            assert family.labels[:2] == ("job_type", "queue"), family.name
    settings.FAIRQUEUE = {"QUEUES": {"invoice": "billing", "receipt": "billing"}}
    registry = CollectorRegistry()
    initialize_queue_fair_metrics(registry, job_types=["invoice", "receipt"], queues=["billing"])
    by_name = {family.name: family for family in registry.collect()}
    assert {
        (sample.labels["job_type"], sample.labels["queue"])
        for sample in by_name["queue_fair_overdue_waiting"].samples
    } == {("invoice", "billing"), ("receipt", "billing")}
    totals = [s for s in by_name["queue_fair_decisions"].samples if s.name.endswith("_total")]
    assert len(totals) == 2 * 2  # job types x decisions: the queue label adds none
    assert {
        (sample.labels["queue"], sample.labels["priority_level"]): sample.value
        for sample in by_name["queue_fair_level_weight"].samples
    } == {("billing", "critical"): 4, ("billing", "high"): 3, ("billing", "normal"): 2,
          ("billing", "low"): 1}  # fmt: skip


def test_priority_label():
    assert enqueue_priority_label(PriorityLevel.HIGH) == "high"
    assert enqueue_priority_label(None) == "other"


def test_web_process_serves_the_families_at_metrics(client, fq_prefix):
    from fairqueue.enqueue.api import enqueue_job

    enqueue_job("email", {}, priority_level="low")
    body = client.get("/metrics").content.decode()
    assert 'queue_jobs_enqueued_total{priority="low",queue="email"}' in body
    assert "queue_fair_overdue_waiting" in body


# -- the rebalancer's metrics ---------------------------------------------------------------
# Read from the process-wide registry (what `rebalance_fair --metrics-port` serves) as
# differences, since other tests in this process add to the same series.


def _value(name: str, **labels: str) -> float:
    return metric(name, **labels)


async def _drain(prefix: str, queue: str, count: int, seen: list) -> None:
    """A stock BullMQ worker takes ``count`` jobs; ``seen``: (level, wait ms) as the
    worker measured it (its processedOn less the job's timestamp)."""
    await stock_worker_until(
        prefix,
        queue,
        lambda job: seen.append((job.data["priorityLevel"], job.processedOn - job.timestamp)),
        count,
    )


@pytest.mark.serial  # a subprocess or a live loop against a deadline
@pytest.mark.django_db
def test_pass__counts_every_start_per_level_and_its_wait_once(fq_prefix):
    levels = ("critical", "high", "normal", "low")
    before = {
        level: (
            _value("queue_fair_jobs_started_total", queue="email", priority_level=level),
            _value("queue_fair_wait_seconds_count", queue="email", priority_level=level),
            _value("queue_fair_wait_seconds_sum", queue="email", priority_level=level),
        )
        for level in levels
    }
    rebalance_queue("email", rebalancer="metrics-test")  # the history's cursor starts here
    for level in levels:
        enqueue_jobs("email", [{"i": i} for i in range(3)], tenant_id="t", priority_level=level)
    time.sleep(0.2)  # waits of a few hundred ms, well apart from the clocks' skew
    seen: list = []
    asyncio.run(_drain(fq_prefix, "email", 12, seen))
    rebalance_queue("email", rebalancer="metrics-test")
    rebalance_queue("email", rebalancer="metrics-test")  # nothing new: nothing counted twice

    for level in levels:
        started, count, total = before[level]
        waits = [wait for name, wait in seen if name == level]
        assert len(waits) == 3
        assert (
            _value("queue_fair_jobs_started_total", queue="email", priority_level=level)
            == started + 3
        )
        assert (
            _value("queue_fair_wait_seconds_count", queue="email", priority_level=level)
            == count + 3
        )
        # Redis's clock stamps the start (the stream entry) and the ready time (fqReady),
        # the worker's and producer's clocks the measured wait: equal within a few ms.
        recorded = _value("queue_fair_wait_seconds_sum", queue="email", priority_level=level)
        assert recorded - total == pytest.approx(sum(waits) / 1000, abs=0.03 * 3)
        assert recorded - total >= 3 * 0.15


@pytest.mark.django_db
def test_pass__duration_last_success_and_overdue_per_level(fq_prefix, redis_client, settings):
    durations = _value("queue_fair_pass_duration_seconds_count", job_type="report")
    enqueue_jobs("report", [{} for _ in range(2)], tenant_id="t", priority_level="high")
    enqueue_jobs("report", [{}], tenant_id="t", priority_level="low")
    time.sleep(1.1)  # overdue is counted to the second
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "MAX_WAIT_MS": 1}
    from fairqueue import conf

    conf.reload_settings()
    started = time.time()
    result = rebalance_queue("report", rebalancer="metrics-test")
    assert result.overdue == 3
    assert _value("queue_fair_pass_duration_seconds_count", job_type="report") == durations + 1
    assert (
        started
        <= _value("queue_fair_last_pass_success_timestamp_seconds", job_type="report")
        <= time.time()
    )
    overdue = {
        level: _value("queue_fair_level_overdue_waiting", queue="report", priority_level=level)
        for level in ("critical", "high", "normal", "low")
    }
    assert overdue == {"critical": 0, "high": 2, "normal": 0, "low": 1}


@pytest.mark.django_db
def test_loop__leader_gauge_follows_the_lock_and_failed_passes_count(fq_prefix, redis_client):
    from fairqueue.rebalance.rebalancer import Rebalancer

    ours = Rebalancer(["cleanup"], interval_ms=1000, install_signal_handlers=False)
    theirs = Rebalancer(["cleanup"], interval_ms=1000, install_signal_handlers=False)
    assert _value("queue_fair_leader", queue="cleanup") == 0  # published at start
    ours.run_once()
    assert _value("queue_fair_leader", queue="cleanup") == 1
    assert _value("queue_fair_rebalance_interval_seconds", queue="cleanup") == 1.0
    ours.finish()  # releases the lock
    assert _value("queue_fair_leader", queue="cleanup") == 0
    theirs.run_once()  # takes the lock: the two share this process's registry
    assert _value("queue_fair_leader", queue="cleanup") == 1
    ours.run_once()  # ours finds it held
    assert _value("queue_fair_leader", queue="cleanup") == 0
    theirs.finish()

    errors = _value("queue_fair_pass_errors_total", job_type="cleanup")
    lock = f"{fq_prefix}:cleanup:fq:leader"
    redis_client.hset(lock, "not", "a string")  # the lock script fails: WRONGTYPE
    with pytest.raises(BrokerRejectedError):
        ours.run_once()
    assert _value("queue_fair_pass_errors_total", job_type="cleanup") == errors + 1
    assert _value("queue_fair_leader", queue="cleanup") == 0


@pytest.mark.django_db
def test_exposition__promtool_check_metrics_is_clean(fq_prefix):
    """Every family, the rebalancer's included, with samples in it, as Prometheus's own
    linter reads them (Debian's prometheus package; .ci/run installs it)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    from fairqueue.rebalance.rebalancer import Rebalancer

    rebalancer = Rebalancer(["email"], interval_ms=1000, install_signal_handlers=False)
    rebalancer.run_once()
    rebalancer.finish()
    text = generate_latest(REGISTRY)
    for name in FAMILIES:
        assert f"# TYPE {name}" in text.decode(), name
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert done.stdout.decode().strip() == "" and done.stderr.decode().strip() == ""


def test_level_weights_are_exported_for_the_rules():
    get_metrics()
    assert {
        level: _value("queue_fair_level_weight", queue="email", priority_level=level)
        for level in ("critical", "high", "normal", "low")
    } == {"critical": 4, "high": 3, "normal": 2, "low": 1}


def test_metrics_view__serves_the_registry_without_django_prometheus(rf):
    response = metrics_view(rf.get("/metrics"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert "# TYPE queue_fair_wait_seconds histogram" in response.content.decode()
