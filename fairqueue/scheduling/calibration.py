"""How far to trust an expected start: ranges and confidence from how the recent
estimates of the same level came out. Plain data in, plain data out.

The loop's history step already sees, for each started job enqueued with an estimate,
the start it was promised (``fqEta``) and the one it got (the estimate-error metric). It
also counts them per level in the history's buckets as the ratio of the actual wait to
the expected one, binned (:func:`error_bin`; bucket fields ``e:<level>:<bin>``). The
start estimate reads those bins for the rate's window and:

* reads them only for waits of their scale (:meth:`Calibration.covers`: the history also
  sums the waits they were made for, ``e:<level>:w``): beyond, the range is at least the
  uncalibrated one and never ``high``;
* sets its range so that it holds the actual start at least as often as
  :data:`RANGE_COVERAGE`: it would have held :data:`RANGE_AIM` of the recent estimates
  of that level (the bins' edges at the 5th and 95th percentile, so a little wider), as
  the next estimates come out a little differently from the last when the load changes;
* says ``high`` only when at least :data:`HIGH_CLOSE` of at least :data:`MIN_SAMPLES`
  recent estimates were within a factor 0.9-1.11 of the actual wait (``tight``: an error
  of about 10%), so the next ones, estimated while the load moves on, stay within 25% 9
  times in 10 (at 90% within 0.8-1.25, the mark itself, ``high`` estimates came out at
  p90 0.31-0.35 in bench_eta); ``medium`` when most were within 0.8-1.25 or too few were
  seen to tell; else ``low``.

Ratios count :data:`FLOOR_MS` on both sides, ``(actual + F) / (expected + F)``, so
waits of a few milliseconds (scheduling noise) neither blow up nor shrink a range, and a
range is never of zero width.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

Confidence = Literal["high", "medium", "low", "none"]

#: Upper edges of the ratio bins (actual wait over expected, both plus FLOOR_MS): bin 0
#: is below 0.5, bin i is [EDGES[i-1], EDGES[i]), the last is 2 and above.
ERROR_EDGES: Final = (0.5, 0.67, 0.8, 0.9, 1.0, 1.11, 1.25, 1.5, 2.0)
ERROR_BINS: Final = len(ERROR_EDGES) + 1
#: What the lowest and highest bin stand for in a range (below half, twice and above).
LOWEST_RATIO: Final = 0.33
HIGHEST_RATIO: Final = 3.0
#: Milliseconds added to both waits of a ratio (see the module docstring).
FLOOR_MS: Final = 250
#: The bins of a "close" estimate: a ratio in [0.8, 1.25); of a "tight" one: [0.9, 1.11).
CLOSE_BINS: Final = range(ERROR_EDGES.index(0.8) + 1, ERROR_EDGES.index(1.25) + 1)
TIGHT_BINS: Final = range(ERROR_EDGES.index(0.9) + 1, ERROR_EDGES.index(1.11) + 1)
#: Estimates seen in the window before the bins decide the range and a ``high``.
MIN_SAMPLES: Final = 20
HIGH_CLOSE: Final = 0.9
MEDIUM_CLOSE: Final = 0.6
#: The share of actual starts a range is meant to hold.
RANGE_COVERAGE: Final = 0.8
#: The share of the recent estimates a range is cut to hold: more than RANGE_COVERAGE,
#: as the load moves between the estimates the bins counted and the next ones (held at
#: 0.8 of the recent, ranges held 60-75% of the starts after a change in bench_eta).
RANGE_AIM: Final = 0.9
#: The history field (``e:<level>:<this>``) summing the expected waits (ms) of the
#: estimates binned, each at most MAX_SCALED_WAIT_MS: the waits a calibration was made on.
WAIT_SCALE_FIELD: Final = "w"
MAX_SCALED_WAIT_MS: Final = 3_600_000
#: A wait (plus FLOOR_MS) more than this many times the recent estimates' mean (plus
#: FLOOR_MS) is out of the calibration's scale: how they came out says little of it.
SCALE_FACTOR: Final = 2.0
#: The share of the recent estimates whose actual wait admission expects a job's to stay
#: under (:func:`admission_wait`).
ADMIT_QUANTILE: Final = 0.9
#: The most admission stretches a wait by: the bound's own tolerance (admitted jobs' p99
#: within 1.25x of it). Stretched by the full quantile (up to 3x), bench_eta's overload
#: held its flows at shallow backlogs, where estimates are noisier (p90 error 1.0 of
#: the wait against 0.15), and refused a flow within its share.
ADMIT_MAX_FACTOR: Final = 1.25
#: The range's factors before enough estimates were seen: wide, as nothing says better.
DEFAULT_LOW: Final = 0.5
DEFAULT_HIGH: Final = 2.0


def error_bin(actual_ms: float, expected_ms: float) -> int:
    """The bin of an estimate that said ``expected_ms`` of wait for a job that waited
    ``actual_ms`` (the history step counts it in ``e:<level>:<bin>``)."""
    ratio = (max(0.0, actual_ms) + FLOOR_MS) / (max(0.0, expected_ms) + FLOOR_MS)
    return bisect.bisect_right(ERROR_EDGES, ratio)


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the recent estimates of a level say: how many were seen, the share close to
    the actual wait, and the factors of a range holding :data:`RANGE_COVERAGE` of them."""

    samples: int
    close: float
    low_factor: float
    high_factor: float
    #: The ratio :data:`ADMIT_QUANTILE` of the recent estimates stayed under (a bin's
    #: upper edge, at least 1): admission stretches the expected wait by it.
    admit_factor: float = 1.0
    #: The share within a factor 0.9-1.11 (:data:`TIGHT_BINS`): what a ``high`` needs.
    tight: float = 0.0
    #: The mean expected wait (ms) of the estimates counted (``None``: not recorded).
    mean_expected_ms: float | None = None

    def covers(self, expected_s: float) -> bool:
        """Whether ``expected_s`` is of the scale of the waits the calibration saw
        (within :data:`SCALE_FACTOR` of their mean, both plus :data:`FLOOR_MS`; ``True``
        when their scale was not recorded). A queue that ran near idle has only seen
        waits of a few ms come out close, which says nothing of the seconds a backlog
        just formed makes a job wait."""
        if self.mean_expected_ms is None:
            return True
        seen = self.mean_expected_ms + FLOOR_MS
        asked = expected_s * 1000 + FLOOR_MS
        return seen / SCALE_FACTOR <= asked <= seen * SCALE_FACTOR


UNCALIBRATED: Final = Calibration(0, 0.0, DEFAULT_LOW, DEFAULT_HIGH)


def _low_edge(index: int) -> float:
    return LOWEST_RATIO if index == 0 else ERROR_EDGES[index - 1]


def _high_edge(index: int) -> float:
    return HIGHEST_RATIO if index >= len(ERROR_EDGES) else ERROR_EDGES[index]


def calibrate(counts: Sequence[int], expected_ms: float | None = None) -> Calibration:
    """The calibration from a level's bin counts over the window (``counts[i]``: bin i)
    and the sum of those estimates' expected waits (``expected_ms``; ``None``: not
    recorded)."""
    counts = [max(0, int(c)) for c in counts[:ERROR_BINS]]
    total = sum(counts)
    if total < MIN_SAMPLES:
        return Calibration(total, 0.0, DEFAULT_LOW, DEFAULT_HIGH)
    mean = None if expected_ms is None else max(0.0, expected_ms) / total
    tail = (1 - RANGE_AIM) / 2 * total
    seen, low_index = 0, 0
    for index, count in enumerate(counts):
        seen += count
        if seen > tail:
            low_index = index
            break
    seen, high_index = 0, len(counts) - 1
    for index in range(len(counts) - 1, -1, -1):
        seen += counts[index]
        if seen > tail:
            high_index = index
            break
    close = sum(counts[i] for i in CLOSE_BINS if i < len(counts)) / total
    seen, admit_index = 0, len(counts) - 1
    for index, count in enumerate(counts):
        seen += count
        if seen >= ADMIT_QUANTILE * total:
            admit_index = index
            break
    admit = max(1.0, _high_edge(admit_index))
    tight = sum(counts[i] for i in TIGHT_BINS if i < len(counts)) / total
    low, high = _low_edge(low_index), _high_edge(high_index)
    return Calibration(total, close, low, high, admit, tight, mean)


def summed(rows: Iterable[Sequence[int]]) -> list[int]:
    """Bin counts of several buckets added up."""
    total = [0] * ERROR_BINS
    for row in rows:
        for index, count in enumerate(row[:ERROR_BINS]):
            total[index] += int(count)
    return total


def wait_range(expected_s: float, calibration: Calibration) -> tuple[float, float]:
    """The range (seconds) around an expected wait: the calibration's factors applied to
    the wait plus :data:`FLOOR_MS` (at least the uncalibrated ones when the wait is out
    of the calibration's scale, :meth:`Calibration.covers`), stretched to hold the
    expected wait itself, and never of zero width."""
    floor = FLOOR_MS / 1000
    low_factor, high_factor = calibration.low_factor, calibration.high_factor
    if not calibration.covers(expected_s):
        low_factor, high_factor = min(low_factor, DEFAULT_LOW), max(high_factor, DEFAULT_HIGH)
    low = max(0.0, (expected_s + floor) * low_factor - floor)
    high = (expected_s + floor) * high_factor - floor
    return min(low, expected_s), max(high, expected_s + floor * 0.2)


def admission_wait(expected_s: float, calibration: Calibration) -> float:
    """The wait admission holds to ``max_wait_ms`` (seconds): the expected wait plus
    :data:`FLOOR_MS` stretched by the calibration's ``admit_factor`` (at most
    :data:`ADMIT_MAX_FACTOR`), never less than
    the expected wait. Why not the expected wait: admitting on it keeps exactly the jobs
    whose estimates came out low (those estimated late are refused), so the admitted
    ones' waits run past the bound by the estimates' spread. Uncalibrated (too few
    estimates seen): the expected wait."""
    if calibration.samples < MIN_SAMPLES:
        return expected_s
    floor = FLOOR_MS / 1000
    factor = min(calibration.admit_factor, ADMIT_MAX_FACTOR)
    return max(expected_s, (expected_s + floor) * factor - floor)


def confidence(
    calibration: Calibration, *, rate_known: bool, expected_s: float | None = None
) -> Confidence:
    """``high`` only when the level's recent estimates were tight and ``expected_s`` is of
    their scale (:meth:`Calibration.covers`), ``medium`` when most were close (see the
    module docstring); ``none`` without a measured rate."""
    if not rate_known:
        return "none"
    if calibration.samples < MIN_SAMPLES:
        return "medium"
    in_scale = expected_s is None or calibration.covers(expected_s)
    if calibration.tight >= HIGH_CLOSE and in_scale:
        return "high"
    if calibration.close >= MEDIUM_CLOSE:
        return "medium"
    return "low"
