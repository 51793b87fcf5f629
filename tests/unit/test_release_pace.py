"""A held tenant's release pace (``pace.tenant_pace``, ``estimate.held_delay_s``): its
starts over its last buckets, not the whole window; its flow's share with none measured."""

from __future__ import annotations

import pytest

from fairqueue.scheduling.estimate import held_delay_s
from fairqueue.scheduling.limits import REASON_MAX_ACTIVE, TenantLimits
from fairqueue.scheduling.pace import TENANT_PACE_MIN_S, AskingRead, tenant_pace

#: ``lim`` started 400 jobs over the last 10 s, 400 over the 25 s window (it began its
#: backlog 10 s ago); ``other`` 250 over 10 s of 500 over 25 s.
READ = AskingRead(
    totals={"normal": 2.0},
    served={("normal", "lim"): 400, ("normal", "other"): 500, ("high", "other"): 10},
    recent={("normal", "lim"): 400, ("normal", "other"): 250},
    recent_since_s=1_000,
)


def test_a_tenants_pace_is_read_over_its_last_buckets() -> None:
    assert tenant_pace(READ, "lim", window_s=25.0, now_s=1_010.0) == pytest.approx(40.0)
    assert tenant_pace(READ, "other", window_s=25.0, now_s=1_010.0) == pytest.approx(25.0)


def test_a_short_span_falls_back_to_the_window() -> None:
    now = 1_000 + TENANT_PACE_MIN_S / 2
    assert tenant_pace(READ, "lim", window_s=25.0, now_s=now) == pytest.approx(16.0)
    assert tenant_pace(READ, "other", window_s=25.0, now_s=None) == pytest.approx(510 / 25)
    assert tenant_pace(READ, "nobody", window_s=25.0, now_s=1_010.0) is None


def test_a_held_tenant_is_released_at_the_faster_of_its_measure_and_its_share() -> None:
    """A tenant kept at max_active=2 is measured at 40 jobs/s where its share would give
    it 30: the measured pace wins. Measured at 10/s with fewer than 10 s of that held, it
    was held for a moment only (its starts followed its arrivals): released at its
    share. With more held, its limit binds (long runs): its measured pace. Either
    bounded by 2 jobs per run."""
    limits = TenantLimits(max_active=2)
    common = {"reason": REASON_MAX_ACTIVE, "held_ahead": 399, "occupied": 2, "run_s": 0.01}
    assert held_delay_s(limits, tenant_per_s=40.0, flow_per_s=30.0, **common) == 10.0
    assert held_delay_s(limits, tenant_per_s=10.0, flow_per_s=40.0, **common) == 40.0
    short = {**common, "held_ahead": 79}  # 80 releases: 8 s at 10/s
    assert held_delay_s(limits, tenant_per_s=10.0, flow_per_s=40.0, **short) == 2.0
    assert held_delay_s(limits, flow_per_s=40.0, **common) == 10.0
    assert held_delay_s(limits, **common) == 2.0  # 2 jobs per 10 ms
    slow = {**common, "run_s": 1.0}  # its limit is slower than its share
    assert held_delay_s(limits, tenant_per_s=40.0, flow_per_s=30.0, **slow) == 200.0
    assert (
        held_delay_s(limits, reason=REASON_MAX_ACTIVE, held_ahead=3, occupied=2, run_s=None) is None
    )
