"""A weight change applies to the jobs already waiting: a stock worker's next starts
follow the new weight at once (docs/design.md, "A weight change")."""

from __future__ import annotations

import pytest

from fairqueue.broker import limit_store
from fairqueue.enqueue.api import enqueue_job
from fairqueue.enqueue.priority import wire_tenant_plan_lookup
from fairqueue.models import TenantPlan
from fairqueue.rebalance.passes import run_tick
from tests.helpers import drain_with_stock_worker

pytestmark = pytest.mark.django_db

N = 80


def _backlog(count: int) -> None:
    TenantPlan.objects.create(tenant_id="A", weight=1)
    TenantPlan.objects.create(tenant_id="B", weight=1)
    wire_tenant_plan_lookup()
    for _ in range(count):
        enqueue_job("email", {}, tenant_id="A", priority_level="normal")
        enqueue_job("email", {}, tenant_id="B", priority_level="normal")


def _raise_a(django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        plan = TenantPlan.objects.get(tenant_id="A")
        plan.weight = 3
        plan.save()


def _assert_three_to_one(prefix: str) -> None:
    order = [data["tenantId"] for _, data in drain_with_stock_worker(prefix, "email", N)]
    assert len(order) == N
    for k in range(1, N + 1):
        a = order[:k].count("A")
        # within one job per tenant of 3:1 at every start
        assert abs(a - 3 * k / 4) <= 1 and abs((k - a) - k / 4) <= 1, (k, order[:k])


def test_a_raised_weight_reorders_the_waiting_backlog_for_a_stock_worker(
    fq_prefix, django_capture_on_commit_callbacks
):
    _backlog(200)
    before = [data["tenantId"] for _, data in drain_with_stock_worker(fq_prefix, "email", 8)]
    assert before.count("A") == before.count("B") == 4  # equal weights alternate
    _raise_a(django_capture_on_commit_callbacks)
    _assert_three_to_one(fq_prefix)


def test_a_long_backlog_is_placed_again_in_pages_the_loop_finishes(
    fq_prefix, redis_client, monkeypatch, django_capture_on_commit_callbacks
):
    """The save's own call places a few pages; the loop's ticks go on where it left off,
    a bounded number of pages each, until the backlog is all placed."""
    monkeypatch.setattr(limit_store, "REPLACE_PAGE", 7)
    _backlog(200)
    _raise_a(django_capture_on_commit_callbacks)
    rw = f"{fq_prefix}:email:fq:rw"
    assert redis_client.hkeys(rw) == ["normal\nA"]  # 8 pages of 7: not done
    ticks = 0
    while redis_client.exists(rw):
        run_tick("email", rebalancer="reweight-test", interval_ms=5_000)
        ticks += 1
        assert ticks < 100
    assert ticks > 1  # 4 pages a tick: over several ticks
    _assert_three_to_one(fq_prefix)
