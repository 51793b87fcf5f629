"""Ranges and confidence from how recent estimates came out (``scheduling/calibration.py``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairqueue.scheduling.calibration import (
    ADMIT_MAX_FACTOR,
    ADMIT_QUANTILE,
    ERROR_BINS,
    ERROR_EDGES,
    FLOOR_MS,
    HIGH_CLOSE,
    HIGHEST_RATIO,
    MIN_SAMPLES,
    RANGE_COVERAGE,
    UNCALIBRATED,
    admission_wait,
    calibrate,
    confidence,
    error_bin,
    summed,
    wait_range,
)

counts = st.lists(st.integers(0, 200), min_size=ERROR_BINS, max_size=ERROR_BINS)


@given(counts)
def test_the_range_holds_the_share_of_recent_estimates_it_promises(row):
    cal = calibrate(row)
    total = sum(row)
    if total < MIN_SAMPLES:
        assert cal == UNCALIBRATED.__class__(total, 0.0, cal.low_factor, cal.high_factor)
        return
    lows = (0.0, *ERROR_EDGES)
    highs = (*ERROR_EDGES, float("inf"))
    inside = sum(
        n
        for index, n in enumerate(row)
        if lows[index] >= cal.low_factor - 1e-9 or index == 0 and cal.low_factor <= 0.5
        if highs[index] <= cal.high_factor + 1e-9
        or index == ERROR_BINS - 1
        and cal.high_factor >= 2.0
    )
    assert inside >= RANGE_COVERAGE * total - 1e-9
    assert cal.low_factor < cal.high_factor


@given(counts)
def test_high_only_when_most_recent_estimates_were_close(row):
    cal = calibrate(row)
    said = confidence(cal, rate_known=True)
    if said == "high":
        assert cal.samples >= MIN_SAMPLES and cal.tight >= HIGH_CLOSE
        tight = sum(n for i, n in enumerate(row) if 0.9 <= _low_edge(i) and _high(i) <= 1.11)
        assert tight >= HIGH_CLOSE * sum(row) - 1e-9
    assert confidence(cal, rate_known=False) == "none"
    assert confidence(UNCALIBRATED, rate_known=True) != "high"


@given(st.floats(0, 10_000), counts)
def test_a_range_is_never_of_zero_width(expected_s, row):
    low, high = wait_range(expected_s, calibrate(row))
    assert 0 <= low <= expected_s < high


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(0, 10**6))
def test_a_later_start_is_never_in_a_lower_bin(actual, expected, more):
    assert error_bin(actual, expected) <= error_bin(actual + more, expected)
    assert 0 <= error_bin(actual, expected) < ERROR_BINS


def test_bins_of_exact_and_short_waits():
    assert ERROR_EDGES[error_bin(1000, 1000) - 1] == 1.0  # [1.0, 1.11)
    assert error_bin(0, 0) == error_bin(1000, 1000)
    # 50 ms against 10 ms expected: noise, not a factor of 5
    assert error_bin(50, 10) == error_bin(1000, 1000) + 1
    assert FLOOR_MS == 250
    assert summed([[1] * ERROR_BINS, [2] * ERROR_BINS]) == [3] * ERROR_BINS


@given(st.floats(0, 10_000), counts)
def test_admission_never_holds_a_job_to_less_than_its_expected_wait(expected_s, row):
    cal = calibrate(row)
    assert admission_wait(expected_s, cal) >= expected_s
    assert admission_wait(expected_s, cal) <= (expected_s + 0.25) * ADMIT_MAX_FACTOR
    if cal.samples < MIN_SAMPLES:
        assert admission_wait(expected_s, cal) == expected_s


@given(counts)
def test_the_admit_factor_bounds_the_share_of_recent_ratios_it_promises(row):
    cal = calibrate(row)
    total = sum(row)
    highs = (*ERROR_EDGES, float("inf"))
    under = sum(n for index, n in enumerate(row) if highs[index] <= cal.admit_factor + 1e-9)
    if total >= MIN_SAMPLES and cal.admit_factor < HIGHEST_RATIO:
        assert under >= ADMIT_QUANTILE * total - 1e-9


def test_admission_holds_the_late_end_of_recent_estimates_to_the_bound():
    # recent estimates came out 1.11-1.25x late one time in five: a job expected at
    # 1.8 s would wait about 2.2 s as often, past a 2 s bound; expected at 1.4 s it fits
    row = [0] * ERROR_BINS
    row[error_bin(1000, 1000)] = 80
    row[error_bin(1200, 1000)] = 20
    cal = calibrate(row)
    assert cal.admit_factor == 1.25
    assert admission_wait(1.8, cal) == pytest.approx((1.8 + 0.25) * 1.25 - 0.25)
    assert admission_wait(1.8, cal) > 2.0 >= admission_wait(1.4, cal)
    # far later (a third more than twice late): stretched by the bound's tolerance only
    row[error_bin(1000, 1000)], row[ERROR_BINS - 1] = 70, 30
    assert calibrate(row).admit_factor == HIGHEST_RATIO
    assert admission_wait(1.0, calibrate(row)) == pytest.approx((1.0 + 0.25) * 1.25 - 0.25)
    # all close: the expected wait itself up to the bin's edge
    row = [0] * ERROR_BINS
    row[error_bin(1000, 1000)] = 100
    assert calibrate(row).admit_factor == ERROR_EDGES[error_bin(1000, 1000)]


def _low_edge(index: int) -> float:
    return 0.0 if index == 0 else ERROR_EDGES[index - 1]


def _high(index: int) -> float:
    return ERROR_EDGES[index] if index < len(ERROR_EDGES) else float("inf")


def test_high_needs_estimates_tighter_than_the_25_percent_it_stands_for():
    """9 in 10 recent estimates within 0.8-1.25 is the mark itself: the next ones,
    estimated while the load moves on, miss it more often (bench_eta: p90 0.31-0.35 of
    the ``high`` ones). ``high`` needs 9 in 10 within 0.9-1.11; 0.8-1.25 is ``medium``."""
    loose = [0] * ERROR_BINS
    loose[error_bin(1000, 1000)] = 50
    loose[error_bin(1200, 1000)] = 45  # [1.11, 1.25): close, not tight
    loose[error_bin(3000, 1000)] = 5
    cal = calibrate(loose)
    assert cal.close >= HIGH_CLOSE > cal.tight
    assert confidence(cal, rate_known=True) == "medium"
    tight = [0] * ERROR_BINS
    tight[error_bin(1000, 1000)] = 50
    tight[error_bin(950, 1000)] = 45
    tight[error_bin(3000, 1000)] = 5
    assert confidence(calibrate(tight), rate_known=True) == "high"


def test_a_calibration_covers_waits_of_the_scale_it_saw():
    row = [0] * ERROR_BINS
    row[error_bin(10, 10)] = 40
    near_idle = calibrate(row, expected_ms=40 * 10)  # all expected 10 ms
    assert near_idle.mean_expected_ms == 10
    assert near_idle.covers(0.2) and not near_idle.covers(1.5)
    assert confidence(near_idle, rate_known=True, expected_s=0.2) == "high"
    assert confidence(near_idle, rate_known=True, expected_s=1.5) == "medium"
    # out of its scale: at least the uncalibrated range, half to twice (plus the floor)
    low, high = wait_range(1.5, near_idle)
    assert low <= (1.5 + 0.25) * 0.5 - 0.25 and high >= (1.5 + 0.25) * 2 - 0.25
    low, high = wait_range(0.2, near_idle)
    assert high < (0.2 + 0.25) * 1.25
    # not recorded (history written before): every wait is of its scale
    assert calibrate(row).covers(100.0)


@given(counts, st.floats(0, 3_600_000), st.floats(0, 10_000))
def test_out_of_scale_is_never_high_and_never_narrower(row, summed_ms, expected_s):
    cal = calibrate(row, expected_ms=summed_ms)
    plain = calibrate(row)
    if not cal.covers(expected_s):
        assert confidence(cal, rate_known=True, expected_s=expected_s) != "high"
        low, high = wait_range(expected_s, cal)
        plain_low, plain_high = wait_range(expected_s, plain)
        assert low <= plain_low and high >= plain_high
