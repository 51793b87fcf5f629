"""placed_wait: a flow's jobs already waiting after a change of load (pure, no Redis)."""

from __future__ import annotations

import pytest

from fairqueue.scheduling.estimate import ServiceRate, placed_wait
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.order import TAG_SCALE

NORMAL = PriorityLevel.NORMAL
#: 10 jobs per second; the virtual time moves one normal step (TAG_SCALE / 2) per job.
RATE = ServiceRate(10.0, 10.0 * TAG_SCALE / 2, 10.0, 10.0, 200, 10.0, 20.0)


def test_jobs_placed_at_a_sparser_spacing_are_not_counted_double() -> None:
    """20 of the flow's jobs wait, placed while it ran alone (one normal step apart); a
    tenant joined since, so today's spacing is half that and the tag distance over it
    says 40 jobs: the virtual time's pace (20 jobs at 10 per second) wins."""
    tag = 21 * TAG_SCALE / 2
    wait = placed_wait(
        tag=tag, level=NORMAL, vt=0.0, ahead=40, rate=RATE, own_ahead=40.0, flow_per_s=5.0
    )
    assert wait.expected_s == pytest.approx(4.0)  # the jobs ahead at the measured rate


def test_a_pace_that_fell_lowers_the_flow_pace_estimate_not_the_floor() -> None:
    """The flow's pace now is slower than the window measured: the later estimate is
    the jobs ahead over all starts, never less."""
    tag = 5 * TAG_SCALE / 2
    wait = placed_wait(
        tag=tag, level=NORMAL, vt=0.0, ahead=10, rate=RATE, own_ahead=4.0, flow_per_s=2.0
    )
    # by the clock 4 jobs at 10/s = 0.4 s; by the pace 2 s; the floor 10 jobs at 10/s = 1 s
    assert wait.expected_s == pytest.approx(1.0)


def test_a_level_that_began_to_flood_slows_the_clock_at_once() -> None:
    """20 of the flow's jobs wait before it; a higher level began to flood, so its flow
    now gets 4 jobs a second where the window's virtual time still moves a step per
    job at 10 a second: scaled by how much slower the clock moves now (0.4), both say
    5 s; unscaled, the clock said 2 s."""
    tag = 21 * TAG_SCALE / 2
    common = {"tag": tag, "level": NORMAL, "vt": 0.0, "ahead": 30, "rate": RATE}
    wait = placed_wait(**common, own_ahead=20.0, flow_per_s=4.0, clock_ratio=0.4)
    assert wait.expected_s == pytest.approx(5.0)
    assert placed_wait(**common, own_ahead=20.0, flow_per_s=4.0).expected_s == pytest.approx(3.0)
    # without the flow's pace: the tag distance at the scaled clock's pace
    alone = placed_wait(**common, clock_ratio=0.4)
    assert alone.expected_s == pytest.approx(5.0)


def _tight() -> ServiceRate:
    """RATE whose normal estimates came out tight lately (25 within 0.9-1.11, of waits
    of about 2 s): ``high`` where nothing changed."""
    from dataclasses import replace

    from fairqueue.scheduling.calibration import calibrate

    counts = [0] * 10
    counts[4] = counts[5] = 13
    return replace(RATE, calibrations={"normal": calibrate(counts, 26 * 2000.0)})


def test_high_only_while_the_load_looks_as_the_calibration_saw_it() -> None:
    """The level's recent estimates were tight: a job whose flow pace and clock agree is
    ``high``; one estimated just after a change (its flow's pace now gives a wait the
    clock's pace does not, or the clock moves slower than measured) is ``medium``, as
    those estimates were made in the load before."""
    rate = _tight()
    tag = 21 * TAG_SCALE / 2
    common = {"tag": tag, "level": NORMAL, "vt": 0.0, "ahead": 20, "rate": rate}
    steady = placed_wait(**common, own_ahead=20.0, flow_per_s=10.0, clock_ratio=1.0)
    assert steady.expected_s == pytest.approx(2.0) and steady.confidence == "high"
    # a change inside the level: its pace now gives 4 s, the clock 2 s
    inside = placed_wait(**common, own_ahead=20.0, flow_per_s=5.0, clock_ratio=1.0)
    assert inside.confidence == "medium"
    # a level began to flood: the clock moves at 0.6 of its measured pace
    flood = placed_wait(**common, own_ahead=20.0, flow_per_s=6.0, clock_ratio=0.6)
    assert flood.expected_s == pytest.approx(20 / 6) and flood.confidence == "medium"
    # the clock moving 15% slower than measured (within 25%): still high
    near = placed_wait(**common, own_ahead=20.0, flow_per_s=8.5, clock_ratio=0.85)
    assert near.confidence == "high"
