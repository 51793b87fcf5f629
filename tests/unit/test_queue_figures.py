"""A queue's figures reach its template as a frozen dataclass, every key of the stats a
field: a key added to the stats without a field (or a field the stats lack) is refused
by name, not passed on as a mapping."""

from __future__ import annotations

import dataclasses

import pytest

from fairqueue.dashboard.overview import attention
from fairqueue.dashboard.queue_figures import QueueStats

FIELDS = [f.name for f in dataclasses.fields(QueueStats)]


def stats(**changes):
    base = {name: {} for name in FIELDS}
    base.update(
        job_type="email",
        queue="email",
        now_ms=0,
        waiting_total=3,
        paused=False,
        redis_memory=None,
        max_wait_ms=1000,
        max_wait="1s",
        interval_ms=500,
        unparsed=None,
        overdue_total=2,
        overdue_flows=[],
        last_pass=None,
        warnings=[],
        limits={"paused": 0, "held_total": 0, "holding": 0},
        order={"drift_count": 0},
    )
    base.update(changes)
    return base


def test_every_key_becomes_a_frozen_field():
    figures = QueueStats.of(stats())
    assert figures.job_type == "email" and figures.overdue_total == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        figures.job_type = "other"  # type: ignore[misc]


def test_a_key_without_a_field_or_a_missing_one_is_named():
    with pytest.raises(ValueError, match=r"\['surprise'\] are not allowed or missing"):
        QueueStats.of(stats(surprise=1))
    missing = stats()
    del missing["outbox"]
    with pytest.raises(ValueError, match=r"\['outbox'\]"):
        QueueStats.of(missing)


def test_attention_reads_the_fields():
    items = attention(QueueStats.of(stats()), "/q")
    assert [(i.level, i.text) for i in items] == [
        ("red", "no recent rebalance pass"),
        ("red", "2 job(s) past the wait bound"),
    ]
    assert items[0].url == "/q#queue-email"
