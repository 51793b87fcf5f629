from prometheus_client import CollectorRegistry, generate_latest

from fairqueue.metrics import enqueue_priority_label, initialize_queue_fair_metrics
from fairqueue.scheduling.levels import PriorityLevel


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
            "queue_fair_decisions_total", {"job_type": "email", "decision": "aged"}
        )
        == 0
    )
    assert (
        registry.get_sample_value(
            "queue_jobs_enqueued_total", {"queue": "email", "priority": "other"}
        )
        == 0
    )


def test_priority_label():
    assert enqueue_priority_label(PriorityLevel.HIGH) == "high"
    assert enqueue_priority_label(None) == "other"


def test_web_process_serves_the_families_at_metrics(client, fq_prefix):
    from fairqueue.enqueue.api import enqueue_job

    enqueue_job("email", {}, priority_level="low")
    body = client.get("/metrics").content.decode()
    assert 'queue_jobs_enqueued_total{priority="low",queue="email"}' in body
    assert "queue_fair_overdue_waiting" in body
