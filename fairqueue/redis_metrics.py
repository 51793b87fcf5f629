"""Gauges read from Redis when ``/metrics`` is scraped, so they exist on every path: a
rebalance loop exports its own families, but passes run by Celery beat export nothing
from the worker that ran them. The web process's ``/metrics`` (``metrics_view``) reads
what every path leaves in Redis: when the last pass was recorded (by a loop, Celery beat
or the dashboard's button: "is anyone rebalancing?" without a loop to scrape), and how
many noisy tenants, running accounts and noisy accounts there are now
(:mod:`fairqueue.scheduling.noisy`; the families: docs/operations.md). Counted, never
labelled by tenant or account.

Each scrape costs a few round trips per queue (the last pass record, the active list,
the flows of the running tenants and one read-only estimate read of who is asking),
bounded by the workers' concurrency.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Final

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fairqueue.broker import get_sync_broker
from fairqueue.conf import get_settings
from fairqueue.dashboard.overview import noisy_figures
from fairqueue.rebalance.pass_result import LAST_RUN_RECORD

logger = logging.getLogger("fairqueue.metrics")

RECORDED_AT_FAMILY: Final = "queue_fair_last_pass_recorded_timestamp_seconds"
NOISY: Final = "queue_fair_noisy_tenants"
ACCOUNTS_RUNNING: Final = "queue_fair_accounts_running"
NOISY_ACCOUNTS: Final = "queue_fair_noisy_accounts"
_LABELS: Final = ("job_type", "queue")


def _families() -> tuple[GaugeMetricFamily, ...]:
    return (
        GaugeMetricFamily(
            RECORDED_AT_FAMILY,
            "When the last rebalance pass over the job type was recorded in Redis (Unix time), "
            "whoever ran it: the loop, Celery beat or the dashboard.",
            labels=_LABELS,
        ),
        GaugeMetricFamily(
            NOISY,
            "Tenants running more than 1.5 times their entitlement now (max-min share of their "
            "level given who is asking) of their level's running jobs while other tenants of "
            "the level wait (counted; no tenant label).",
            labels=_LABELS,
        ),
        GaugeMetricFamily(
            ACCOUNTS_RUNNING,
            "Accounts with jobs running now, a tenant of no account counting as its own "
            "(counted; no account label).",
            labels=_LABELS,
        ),
        GaugeMetricFamily(
            NOISY_ACCOUNTS,
            "Accounts whose tenants together run more than 1.5 times the account's entitlement "
            "now of their level's running jobs while others of the level wait (counted; no "
            "account label).",
            labels=_LABELS,
        ),
    )


class RedisStateCollector(Collector):
    """The gauges above, read at scrape time."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from _families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = _families()
        last_pass, noisy, accounts, noisy_accounts = families
        try:
            sync = get_sync_broker()
            queues = get_settings().queues
        except Exception as exc:  # a scrape never fails on Redis: the series go absent
            logger.warning("Redis state not read for /metrics (%s)", type(exc).__name__)
            yield from families
            return
        for job_type, queue in queues.items():
            try:
                record = sync.run(sync.broker.passes.read_status, queue, LAST_RUN_RECORD)
                figures = noisy_figures(job_type, broker=sync)
            except Exception as exc:  # a scrape never fails on Redis: the series go absent
                logger.warning("Redis state not read for /metrics (%s)", type(exc).__name__)
                continue
            at_ms = (record or {}).get("at_ms")
            if isinstance(at_ms, int):
                last_pass.add_metric([job_type, queue], at_ms / 1000)
            noisy.add_metric([job_type, queue], figures["count"])
            accounts.add_metric([job_type, queue], figures["accounts_running"])
            noisy_accounts.add_metric([job_type, queue], figures["accounts_count"])
        yield from families


_registered: set[int] = set()
_lock = threading.Lock()


def register_redis_collector(registry: CollectorRegistry = REGISTRY) -> None:
    """Register :class:`RedisStateCollector` once per registry."""
    with _lock:
        if id(registry) not in _registered:
            registry.register(RedisStateCollector())
            _registered.add(id(registry))
