"""placed_wait: a flow's jobs already waiting after a change of load (pure, no Redis)."""

from __future__ import annotations

import pytest

from fairqueue.scheduling.estimate import ServiceRate, placed_wait
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.order import TAG_SCALE

NORMAL = PriorityLevel.NORMAL
#: 10 jobs per second; the virtual time moves one normal step (TAG_SCALE / 2) per job.
RATE = ServiceRate(10.0, 10.0 * TAG_SCALE / 2, 10.0, 10.0, 200, 10.0, 20.0)


def test_a_level_that_began_to_flood_slows_the_flow_at_once() -> None:
    """20 of the flow's jobs wait before it; a higher level began to flood, so its flow
    now gets 4 jobs a second where the window's virtual time still moves a step per
    job at 10 a second: its pace now says 5 s, the lagging clock 2 s."""
    tag = 21 * TAG_SCALE / 2
    wait = placed_wait(
        tag=tag, level=NORMAL, vt=0.0, ahead=30, rate=RATE, own_ahead=20.0, flow_per_s=4.0
    )
    assert wait.expected_s == pytest.approx(5.0)


def test_a_flow_that_speeds_up_is_never_earlier_than_the_jobs_ahead() -> None:
    """The flow's pace now is faster than the window measured: its jobs at that pace,
    never less than the jobs ahead over all starts."""
    tag = 5 * TAG_SCALE / 2
    wait = placed_wait(
        tag=tag, level=NORMAL, vt=0.0, ahead=10, rate=RATE, own_ahead=4.0, flow_per_s=8.0
    )
    # by the pace 4 jobs at 8/s = 0.5 s; the floor 10 jobs at 10/s = 1 s
    assert wait.expected_s == pytest.approx(1.0)
    faster = placed_wait(
        tag=tag, level=NORMAL, vt=0.0, ahead=4, rate=RATE, own_ahead=4.0, flow_per_s=2.0
    )
    assert faster.expected_s == pytest.approx(2.0)  # 4 jobs at 2/s; the clock said 0.4 s


def test_without_the_flows_pace_the_tag_distance_at_the_clocks_pace() -> None:
    tag = 21 * TAG_SCALE / 2
    wait = placed_wait(tag=tag, level=NORMAL, vt=0.0, ahead=5, rate=RATE)
    assert wait.expected_s == pytest.approx(2.0)  # 20 steps at 10 a second
