"""What the dashboard shows of the history: :func:`history_view` turns a
:func:`fairqueue.scheduling.shares.summarize` result into display rows and inline-SVG chart
geometry (rectangles, lines and labels in a fixed viewBox).

The page's template and its JavaScript both draw the charts from this geometry, so the
server-rendered page and every refresh from the JSON endpoint show the same thing from
one computation (no chart library: the machine the dashboard runs on may be offline).
"""

from __future__ import annotations

import math
from typing import Any, Final

from fairqueue.scheduling.shares import BUCKET_S, LEVEL_NAMES

CHART_W: Final = 460
#: A generous width of one character of the charts' 11px labels, so a label is laid out
#: to end inside the chart (it used to run into the next chart: "100% / 100% (w 20%)normal").
CHAR_W: Final = 6.5
ROW_H: Final = 24
LABEL_W: Final = 64
BAR_W: Final = 180
SERIES_H: Final = 96


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def format_ms(ms: float | None) -> str:
    """A wait for a chart label: ``850 ms``, ``4.2 s``, ``3.5 min``, ``2.0 h``."""
    if ms is None:
        return "—"
    if ms < 1_000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    if ms < 3_600_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:.1f} h"


def _chart(height: int) -> dict[str, Any]:
    return {"width": CHART_W, "height": height, "rects": [], "lines": [], "texts": []}


def _rect(
    chart: dict[str, Any], x: float, y: float, w: float, h: float, cls: str, title: str
) -> None:
    chart["rects"].append({"x": x, "y": y, "w": w, "h": h, "cls": cls, "title": title})


def _line(chart: dict[str, Any], x1: float, x2: float, y1: float, y2: float, cls: str) -> None:
    chart["lines"].append({"x1": x1, "x2": x2, "y1": y1, "y2": y2, "cls": cls})


def _text(
    chart: dict[str, Any], x: float, y: float, text: str, cls: str = "fq-chart-label"
) -> None:
    chart["texts"].append({"x": x, "y": y, "text": text, "cls": cls})


def _share_chart(levels: dict[str, Any]) -> dict[str, Any]:
    """Per level: the share served (bar), the share entitled (solid tick) and the
    weight's share (dashed tick), on one 0-100% scale."""
    chart = _chart(ROW_H * len(LEVEL_NAMES))
    for row, level in enumerate(LEVEL_NAMES):
        data, y = levels[level], row * ROW_H
        _text(chart, 0, y + 15, level)
        served = data["share"] or 0.0
        _rect(
            chart,
            LABEL_W,
            y + 5,
            round(BAR_W * served, 1),
            14,
            f"fq-bar fq-bar-{level}",
            f"{level}: served {_pct(data['share'])}, entitled to "
            f"{_pct(data['entitled_share'])}, weight's share {_pct(data['weight_share'])}",
        )
        for key, cls in (
            ("entitled_share", "fq-tick-entitled"),
            ("weight_share", "fq-tick-weight"),
        ):
            if data[key] is not None:
                x = round(LABEL_W + BAR_W * data[key], 1)
                _line(chart, x, x, y + 1, y + 23, cls)
        value = f"{_pct(data['share'])} of {_pct(data['entitled_share'])}"
        _text(chart, LABEL_W + BAR_W + 8, y + 15, value, "fq-chart-value")
    return chart


def _log_x(ms: float, top_ms: float) -> float:
    """x of a wait on a log scale from 1 ms to ``top_ms``."""
    return LABEL_W + BAR_W * math.log10(max(ms, 1.0)) / math.log10(max(top_ms, 10.0))


def _wait_chart(levels: dict[str, Any], max_wait_ms: int) -> dict[str, Any]:
    """Per level: p99 (light bar) and p50 (dark bar) on a log scale, the bound (red)."""
    chart = _chart(ROW_H * len(LEVEL_NAMES))
    worst = max([max_wait_ms] + [levels[level]["p99_ms"] or 0 for level in LEVEL_NAMES])
    top = worst * 1.5
    for row, level in enumerate(LEVEL_NAMES):
        data, y = levels[level], row * ROW_H
        _text(chart, 0, y + 15, level)
        for key, cls, bar_y, bar_h in (
            ("p99_ms", "fq-bar fq-bar-p99", 4, 16),
            ("p50_ms", f"fq-bar fq-bar-{level}", 8, 8),
        ):
            if data[key] is not None:
                w = round(_log_x(data[key], top) - LABEL_W, 1)
                title = f"{level}: {key[:3]} {format_ms(data[key])}"
                _rect(chart, LABEL_W, y + bar_y, w, bar_h, cls, title)
        bound_x = round(_log_x(max_wait_ms, top), 1)
        _line(chart, bound_x, bound_x, y, y + 24, "fq-bound")
        over = data["over_bound"]
        value = f"{format_ms(data['p50_ms'])} / {format_ms(data['p99_ms'])}"
        value += f" · {over} over" if over else ""
        _text(chart, LABEL_W + BAR_W + 8, y + 15, value, "fq-chart-value")
    return chart


def _series_chart(series: list[dict[str, Any]], *, window_s: int, now_s: int) -> dict[str, Any]:
    """Jobs started per bucket over the window, stacked by level (critical at the
    bottom); buckets with events the pass never saw are shaded."""
    chart = _chart(SERIES_H + 16)
    slots = max(1, window_s // BUCKET_S)
    first_s = (now_s // BUCKET_S - slots + 1) * BUCKET_S
    slot_w = CHART_W / slots
    most = max([1] + [sum(row["served"].values()) for row in series])
    for row in series:
        slot = (row["start_s"] - first_s) // BUCKET_S
        if not 0 <= slot < slots:
            continue
        x = round(slot * slot_w, 2)
        if row.get("gap_ms"):
            gap = f"{row['gap_ms']} ms of events not seen"
            _rect(chart, x, 0, round(slot_w, 2), SERIES_H, "fq-gap", gap)
        bottom = float(SERIES_H)
        for level in LEVEL_NAMES:
            count = row["served"].get(level, 0)
            if not count:
                continue
            h = SERIES_H * count / most
            bottom -= h
            w = round(max(slot_w - 0.5, 0.5), 2)
            bar = f"fq-bar fq-bar-{level}"
            _rect(chart, x, round(bottom, 2), w, round(h, 2), bar, f"{level}: {count}")
    _line(chart, 0, CHART_W, SERIES_H, SERIES_H, "fq-axis")
    _text(chart, 0, SERIES_H + 13, f"-{window_s // 60} min")
    _text(chart, CHART_W - 3 * CHAR_W, SERIES_H + 13, "now")
    _text(chart, 2, 10, f"{most} / {BUCKET_S} s")
    return chart


def history_view(summary: dict[str, Any], *, now_ms: int, since_ms: int | None) -> dict[str, Any]:
    """``summary`` with display strings, notes and the three charts added."""
    levels = summary["levels"]
    for data in levels.values():
        data["share_display"] = _pct(data["share"])
        data["entitled_display"] = _pct(data["entitled_share"])
        data["weight_display"] = _pct(data["weight_share"])
        data["time_share_display"] = _pct(data["time_share"])
        data["worker_display"] = f"{data['worker_s']:g} s"
        data["p50"] = format_ms(data["p50_ms"])
        data["p99"] = format_ms(data["p99_ms"])
    for row in summary["tenants"]:
        row["share_display"] = _pct(row["share"])
    notes = []
    if since_ms is None:
        notes.append(
            "No history yet: the rebalance pass records it (is the rebalance loop running?)."
        )
    elif now_ms - since_ms < summary["window_s"] * 1000:
        notes.append(f"Recorded since {format_ms(now_ms - since_ms)} ago (the first pass).")
    if summary["gap_ms"]:
        notes.append(
            f"{format_ms(summary['gap_ms'])} of the window was not observed: BullMQ trimmed "
            "its events stream before the pass read it (raise the queue's events maxLen, "
            "or shorten the pass interval). Shares are of what was observed."
        )
    if summary["unknown"]:
        notes.append(
            f"{summary['unknown']} started job(s) of unknown level: their hash was removed "
            "before the pass read it (keep finished jobs a few pass intervals)."
        )
    if summary["retried"]:
        notes.append(
            f"{summary['retried']} start(s) of retried jobs: counted as started, with no wait "
            "(a retried job's timestamp is its first add's)."
        )
    summary["notes"] = notes
    summary["window_min"] = summary["window_s"] // 60
    # The seconds the window actually recorded: rates divide by these, not the window.
    recorded_ms = summary["window_s"] * 1000 if since_ms is None else now_ms - since_ms
    summary["observed_s"] = max(1, min(summary["window_s"], recorded_ms // 1000))
    summary["charts"] = {
        "shares": _share_chart(levels),
        "waits": _wait_chart(levels, summary["max_wait_ms"]),
        "series": _series_chart(
            summary["series"], window_s=summary["window_s"], now_s=now_ms // 1000
        ),
    }
    summary["max_wait"] = format_ms(summary["max_wait_ms"])
    return summary


#: The usage chart of a tenant's plan page: one bar per day.
USAGE_BAR_W: Final = 12
USAGE_H: Final = 80


def usage_chart(days: list[tuple[str, float]]) -> dict[str, Any]:
    """Bars of worker seconds per day (``days``: (``YYYY-MM-DD``, seconds), oldest
    first), on a scale from 0 to the busiest day, with the first and last day and the
    busiest day's seconds as labels: the tenant plan page's last 30 days."""
    top = max([0.0] + [seconds for _, seconds in days])
    chart = _chart(USAGE_H + 30)
    chart["width"] = max(CHART_W, len(days) * USAGE_BAR_W + 8)
    for i, (day, seconds) in enumerate(days):
        h = round(USAGE_H * seconds / top, 1) if top else 0.0
        title = f"{day}: {seconds:.1f} worker seconds"
        x, y = 4 + i * USAGE_BAR_W, round(14 + USAGE_H - h, 1)
        _rect(chart, x, y, USAGE_BAR_W - 2, h, "fq-bar fq-bar-usage", title)
    _line(chart, 0, chart["width"], 14 + USAGE_H, 14 + USAGE_H, "fq-axis")
    _text(chart, 4, 10, f"busiest day {top:.1f} s", "fq-chart-value")
    if days:
        _text(chart, 4, USAGE_H + 28, days[0][0])
        last_x = max(4, 4 + len(days) * USAGE_BAR_W - round(CHAR_W * len(days[-1][0])))
        _text(chart, last_x, USAGE_H + 28, days[-1][0])
    return chart
