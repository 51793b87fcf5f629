"""Prometheus metric families, defined once (their names are a public interface).

``initialize_queue_fair_metrics(registry)`` registers them, idempotently, into any
registry; by default the process-wide one that django-prometheus serves at ``/metrics``
and ``rebalance_fair --metrics-port`` serves on its own port. Label children are
pre-created for every configured job type so series exist at zero from the start.
Tenant ids are never a label. Every family with a ``job_type`` label carries the job
type's ``queue`` too (one queue per job type, so no more series), and the per-queue
settings gauges are labelled by queue: one ``queue`` filter selects every family.

The rebalancer's families (waits, starts, passes, the leader) are set only by
``rebalance_fair``: from what its passes already read (the history step's page of BullMQ's
events stream gives every start and its wait), so the metrics cost no extra Redis call.
The leader and last-pass gauges are not pre-created: a process that never rebalanced
has no such series, and the shipped rules (``fairqueue/contrib/prometheus/rules.yml``)
say so with ``absent()``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from fairqueue.conf import get_settings
from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, LEVELS_BY_RANK, PriorityLevel
from fairqueue.scheduling.limits import REASONS as LIMIT_REASONS

_M = TypeVar("_M", Counter, Gauge, Histogram)

DECISIONS: Final = ("aged", "weighted_fair")
ENQUEUE_PRIORITY_LABELS: Final = ("critical", "high", "normal", "low", "other")
#: Upper bounds (seconds) of the wait histogram's buckets: ms to an hour, with the default
#: wait bound (300 s) among them, about 2.5x apart (Prometheus interpolates within one).
WAIT_BUCKETS_S: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
#: Upper bounds (seconds) of the estimate-error histogram's buckets: predicted less actual
#: start, both ways (negative: the job started later than predicted).
ESTIMATE_ERROR_BUCKETS_S: Final = (
    -300.0, -60.0, -30.0, -10.0, -5.0, -2.0, -1.0, -0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5,
    1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
#: Upper bounds (seconds) of the pass duration histogram's buckets.
PASS_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, slots=True)
class QueueFairMetrics:
    priority_assigned: Counter
    decisions: Counter
    aged_boosts: Counter
    overdue_waiting: Gauge
    jobs_enqueued: Counter
    outbox_pending: Gauge
    worker_seconds: Counter
    retries: Counter
    # The rebalancer's (``rebalance_fair --metrics-port``): what its passes read.
    wait_seconds: Histogram
    jobs_started: Counter
    level_overdue_waiting: Gauge
    pass_duration: Histogram
    pass_errors: Counter
    leader: Gauge
    last_pass_success: Gauge
    rebalance_interval: Gauge
    max_wait: Gauge
    level_weight: Gauge
    # Per-tenant limits (no tenant label: counts per job type only).
    held_jobs: Gauge
    limited: Counter
    # Quotas and the breaker (no tenant label; docs/usage.md).
    quota_exceeded: Counter
    breaker_open: Gauge
    # Estimates of when jobs start (enqueued with estimate=True), against when they did.
    start_estimate_error: Histogram


_lock = threading.Lock()
#: Keyed by the registry itself, weakly: keyed by ``id()``, a registry that was garbage
#: collected could hand its metrics to a new registry at the same address.
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, QueueFairMetrics] = (
    weakref.WeakKeyDictionary()
)


LEVEL_VALUES: Final = tuple(level.value for level in LEVELS_BY_RANK)


@dataclass(frozen=True, slots=True)
class _Family:
    """One metric family: the :class:`QueueFairMetrics` field that holds it, its kind,
    name, help and labels, and which of its series exist at zero from the start."""

    field: str
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    #: One series at zero per configured job type (``"job_type"``, labelled with its queue
    #: too) or queue (``"queue"``), times each value of the last label (``second``) when
    #: the family has one more; ``None``: no series until one is set.
    zero_for: str | None = None
    second: tuple[str, ...] = ()

    def create(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        if self.buckets is not None:
            return Histogram(
                self.name, self.help, list(self.labels), buckets=self.buckets, registry=registry
            )
        return self.kind(self.name, self.help, list(self.labels), registry=registry)

    def create_zero_series(
        self, metric: Counter | Gauge | Histogram, owners: tuple[tuple[str, ...], ...]
    ) -> None:
        for owner in owners:
            if not self.second:
                metric.labels(*owner)
            for value in self.second:
                metric.labels(*owner, value)


#: Every family, in the order they are registered.
FAMILIES: Final[tuple[_Family, ...]] = (
    _Family(
        "priority_assigned",
        Counter,
        "queue_fair_priority_assigned_total",
        "Enqueued jobs by normalized priority level.",
        ("job_type", "queue", "priority_level"),
        zero_for="job_type",
        second=LEVEL_VALUES,
    ),
    _Family(
        "decisions",
        Counter,
        "queue_fair_decisions_total",
        "Ordering decisions of rebalance passes: aged (wait bound) or weighted_fair.",
        ("job_type", "queue", "decision"),
        zero_for="job_type",
        second=DECISIONS,
    ),
    _Family(
        "aged_boosts",
        Counter,
        "queue_fair_aged_boosts_total",
        "Jobs promoted by the maximum wait bound.",
        ("job_type", "queue"),
        zero_for="job_type",
    ),
    _Family(
        "overdue_waiting",
        Gauge,
        "queue_fair_overdue_waiting",
        "Waiting jobs past the wait bound, as of the last rebalance pass.",
        ("job_type", "queue"),
        zero_for="job_type",
    ),
    _Family(
        "jobs_enqueued",
        Counter,
        "queue_jobs_enqueued_total",
        "Enqueued jobs by queue and priority.",
        ("queue", "priority"),
        zero_for="queue",
        second=ENQUEUE_PRIORITY_LABELS,
    ),
    _Family(
        "outbox_pending",
        Gauge,
        "queue_fair_outbox_pending",
        "Durable jobs waiting in the outbox for the relay, as of this process's last relay run.",
        ("job_type", "queue"),
        zero_for="job_type",
    ),
    _Family(
        "worker_seconds",
        Counter,
        "queue_fair_worker_seconds",
        "Worker time spent on finished attempts, per level (what fairness by time shares out), "
        "from BullMQ's events as the leader reads them.",
        ("job_type", "queue", "priority_level"),
        zero_for="job_type",
        second=LEVEL_VALUES,
    ),
    _Family(
        "retries",
        Counter,
        "queue_fair_retries",
        "Attempts that failed with attempts left, so their job runs again, per level.",
        ("job_type", "queue", "priority_level"),
        zero_for="job_type",
        second=LEVEL_VALUES,
    ),
    _Family(
        "wait_seconds",
        Histogram,
        "queue_fair_wait_seconds",
        "Wait of started jobs from ready to start, on Redis's clock (first attempts), read by the "
        "rebalancer from BullMQ's events stream.",
        ("queue", "priority_level"),
        buckets=WAIT_BUCKETS_S,
        zero_for="queue",
        second=LEVEL_VALUES,
    ),
    _Family(
        "jobs_started",
        Counter,
        "queue_fair_jobs_started_total",
        "Jobs workers started (every attempt), read by the rebalancer from BullMQ's events stream.",
        ("queue", "priority_level"),
        zero_for="queue",
        second=LEVEL_VALUES,
    ),
    _Family(
        "level_overdue_waiting",
        Gauge,
        "queue_fair_level_overdue_waiting",
        "Waiting jobs past the wait bound per level, as of the last rebalance pass (the part of "
        "the overdue count checked job by job).",
        ("queue", "priority_level"),
        zero_for="queue",
        second=LEVEL_VALUES,
    ),
    _Family(
        "pass_duration",
        Histogram,
        "queue_fair_pass_duration_seconds",
        "Duration of rebalance passes that ran to the end.",
        ("job_type", "queue"),
        buckets=PASS_BUCKETS_S,
        zero_for="job_type",
    ),
    _Family(
        "pass_errors",
        Counter,
        "queue_fair_pass_errors_total",
        "Rebalance passes that failed (Redis unreachable or another error).",
        ("job_type", "queue"),
        zero_for="job_type",
    ),
    _Family(
        "leader",
        Gauge,
        "queue_fair_leader",
        "1 while this rebalancer holds the queue's leader lock, else 0.",
        ("queue",),
    ),
    _Family(
        "last_pass_success",
        Gauge,
        "queue_fair_last_pass_success_timestamp_seconds",
        "When this process's last successful pass over the job type ended (Unix time).",
        ("job_type", "queue"),
    ),
    _Family(
        "rebalance_interval",
        Gauge,
        "queue_fair_rebalance_interval_seconds",
        "The rebalance loop's pass interval (for rules that count intervals), per queue it "
        "rebalances.",
        ("queue",),
    ),
    _Family(
        "max_wait",
        Gauge,
        "queue_fair_max_wait_seconds",
        "The wait bound (QUEUE_FAIR_MAX_WAIT_MS) the rebalancer enforces, per queue it rebalances.",
        ("queue",),
    ),
    _Family(
        "level_weight",
        Gauge,
        "queue_fair_level_weight",
        "Each level's weight in the fair share (its entitlement among the levels with work).",
        ("queue", "priority_level"),
    ),
    _Family(
        "held_jobs",
        Gauge,
        "queue_fair_held_jobs",
        "Jobs held back because their tenant is at a limit or paused (in BullMQ's delayed set "
        "until released), in the job type's queue.",
        ("job_type", "queue"),
        zero_for="job_type",
    ),
    _Family(
        "limited",
        Counter,
        "queue_fair_limited_total",
        "Jobs held at enqueue by a tenant limit (max_active, rate, paused), and enqueues refused "
        "by max_waiting.",
        ("job_type", "queue", "reason"),
        zero_for="job_type",
        second=LIMIT_REASONS,
    ),
    _Family(
        "quota_exceeded",
        Counter,
        "queue_fair_quota_exceeded_total",
        "Tenants that went over their worker-time quota, by the job type whose work took them "
        "over and the action taken (demote or hold).",
        ("job_type", "queue", "action"),
        zero_for="job_type",
        second=("demote", "hold"),
    ),
    _Family(
        "breaker_open",
        Gauge,
        "queue_fair_breaker_open",
        "Tenants whose jobs of this type are held by an open breaker (failing jobs), probes "
        "included.",
        ("job_type", "queue"),
        zero_for="job_type",
    ),
    _Family(
        "start_estimate_error",
        Histogram,
        "queue_fair_start_estimate_error_seconds",
        "Expected start less actual start of jobs enqueued with an estimate (first attempts), "
        "read by the rebalancer from BullMQ's events stream.",
        ("job_type", "queue", "priority_level"),
        buckets=ESTIMATE_ERROR_BUCKETS_S,
        zero_for="job_type",
        second=LEVEL_VALUES,
    ),
)


def initialize_queue_fair_metrics(
    registry: CollectorRegistry | None = None,
    *,
    job_types: Iterable[str] = (),
    queues: Iterable[str] = (),
) -> QueueFairMetrics:
    """Register fairqueue's metric families in ``registry`` (once) and return them.

    Args:
        job_types: job types whose series are created at zero (labelled with their
            queue, from the settings).
        queues: queue names whose per-queue series are created at zero, and whose level
            weights are set (the queues of ``job_types`` too).
    """
    registry = REGISTRY if registry is None else registry
    with _lock:
        metrics = _by_registry.get(registry)
        if metrics is None:
            created: dict[str, Any] = {family.field: family.create(registry) for family in FAMILIES}
            metrics = QueueFairMetrics(**created)
            _by_registry[registry] = metrics
    typed = tuple((job_type, queue_label(job_type)) for job_type in job_types)
    queue_names = tuple(dict.fromkeys([*queues, *(queue for _, queue in typed if queue)]))
    for queue in queue_names:
        for level, weight in DEFAULT_FAIR_WEIGHTS.items():
            metrics.level_weight.labels(queue, PriorityLevel(level).value).set(weight)
    owners = {"job_type": typed, "queue": tuple((queue,) for queue in queue_names)}
    for family in FAMILIES:
        if family.zero_for is not None:
            family.create_zero_series(getattr(metrics, family.field), owners[family.zero_for])
    return metrics


_initialized_for: dict[tuple[frozenset[str], frozenset[str]], QueueFairMetrics] = {}
_last: list[object] = [None, None]  # (queues mapping, metrics): the hot path's shortcut
_enqueue_children: dict[tuple[str, str, PriorityLevel], tuple[Counter, Counter, Counter]] = {}


def get_metrics() -> QueueFairMetrics:
    """The metrics in the default registry, with series for every configured job type.

    Cheap on the hot path: series are pre-created once per set of configured queues.
    """
    queues = get_settings().queues
    if _last[0] is queues:
        return _last[1]  # type: ignore[return-value]
    key = (frozenset(queues), frozenset(queues.values()))
    metrics = _initialized_for.get(key)
    if metrics is None:
        metrics = initialize_queue_fair_metrics(job_types=key[0], queues=key[1])
        _initialized_for[key] = metrics
    _last[:] = [queues, metrics]
    return metrics


def record_enqueue(queue: str, job_type: str, level: PriorityLevel, *, placed: bool) -> None:
    """Count one enqueued job in both enqueue counters and, when the add script gave it
    its fair place (``placed``; a delayed job is placed by the pass later), one
    ``weighted_fair`` decision (label children cached)."""
    key = (queue, job_type, level)
    children = _enqueue_children.get(key)
    if children is None:
        metrics = get_metrics()
        children = (
            metrics.jobs_enqueued.labels(queue, enqueue_priority_label(level)),
            metrics.priority_assigned.labels(job_type, queue, level.value),
            metrics.decisions.labels(job_type, queue, "weighted_fair"),
        )
        _enqueue_children[key] = children
    children[0].inc()
    children[1].inc()
    if placed:
        children[2].inc()


def record_limited(job_type: str, reason: str, count: int = 1) -> None:
    """Count jobs a tenant limit held at enqueue (or an enqueue ``max_waiting``
    refused) under ``reason``; never a tenant label."""
    if count > 0:
        by_job_type(get_metrics().limited, job_type, reason).inc(count)


def queue_label(job_type: str) -> str:
    """The ``queue`` label of a job type's series: its configured queue (each job type has
    exactly one), or ``""`` (no label) for a job type no longer configured."""
    return get_settings().queues.get(job_type, "")


def by_job_type(metric: _M, job_type: str, *values: str) -> _M:
    """``metric``'s child for ``job_type``, its queue and ``values`` (the family's other
    labels, in order): every job-type family carries its queue, so one ``queue`` filter
    selects every family."""
    return metric.labels(job_type, queue_label(job_type), *values)


def enqueue_priority_label(level: PriorityLevel | None) -> str:
    """The low-cardinality ``priority`` label of ``queue_jobs_enqueued_total``."""
    return level.value if isinstance(level, PriorityLevel) else "other"


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``/metrics`` for the process-wide registry, fairqueue's families included, for
    projects without django-prometheus (whose 2.5.0 requires Django<6.1):
    ``path("metrics", metrics_view)``. Serves what prometheus_client's own exporter
    serves, in the text format."""
    get_metrics()
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
