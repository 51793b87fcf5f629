"""The history's display: chart geometry and notes from a summary (pure)."""

from __future__ import annotations

import pytest

from fairqueue.dashboard.charts import BAR_W, CHAR_W, CHART_W, LABEL_W, format_ms, history_view
from fairqueue.scheduling.shares import BUCKET_S, Bucket, summarize, wait_bin

NOW_MS = 1_000_000_000_000
LAST = NOW_MS // 1000 // BUCKET_S * BUCKET_S


def _view(buckets, *, since_ms=NOW_MS - 3_600_000, max_wait_ms=2_000, window_s=300):
    summary = summarize(buckets, now_ms=NOW_MS, window_s=window_s, max_wait_ms=max_wait_ms)
    return history_view(summary, now_ms=NOW_MS, since_ms=since_ms)


def test_share_bars_are_proportional_with_entitlement_and_weight_ticks():
    served = {"critical": 40, "high": 30, "normal": 20, "low": 10}
    view = _view([Bucket(LAST, served=served, arrived=dict.fromkeys(served, 1000))])
    chart = view["charts"]["shares"]
    widths = [rect["w"] for rect in chart["rects"]]
    assert widths == pytest.approx([BAR_W * 0.4, BAR_W * 0.3, BAR_W * 0.2, BAR_W * 0.1], abs=0.1)
    ticks = [line["x1"] for line in chart["lines"] if line["cls"] == "fq-tick-weight"]
    assert ticks == pytest.approx([LABEL_W + BAR_W * w for w in (0.4, 0.3, 0.2, 0.1)], abs=0.1)
    assert view["levels"]["low"]["share_display"] == "10%"
    assert "10% of 10%" in [text["text"] for text in chart["texts"]]


def test_labels_end_inside_their_chart_and_never_overlap_on_a_row():
    """The widest values a chart can show: served 100%, waits of an hour, thousands late."""
    served = {"critical": 9_999, "high": 1, "normal": 1, "low": 1}
    waits = {level: {wait_bin(1): 1, wait_bin(3_500_000): 9_999} for level in served}
    bucket = Bucket(LAST, served=served, arrived=served, waits=waits, over=dict(served))
    view = _view([bucket], max_wait_ms=3_000_000)
    for name, chart in view["charts"].items():
        spans = sorted(
            (text["y"], text["x"], text["x"] + CHAR_W * len(text["text"]))
            for text in chart["texts"]
        )
        for y, left, right in spans:
            assert 0 <= left and right <= chart["width"], (name, y)
        for (y1, _, right), (y2, left, _) in zip(spans, spans[1:], strict=False):
            assert y1 != y2 or right <= left, (name, y1)


def test_wait_bars_sit_on_a_log_scale_left_of_the_bound_when_under_it():
    bucket = Bucket(
        LAST,
        served={"low": 2},
        arrived={"low": 2},
        waits={"low": {wait_bin(100): 1, wait_bin(5_000): 1}},
        over={"low": 1},
    )
    chart = _view([bucket])["charts"]["waits"]
    bound_x = {line["x1"] for line in chart["lines"] if line["cls"] == "fq-bound"}
    assert len(bound_x) == 1
    p50 = next(r for r in chart["rects"] if r["title"].startswith("low: p50"))
    p99 = next(r for r in chart["rects"] if r["title"].startswith("low: p99"))
    assert LABEL_W + p50["w"] < bound_x.pop() < LABEL_W + p99["w"]
    assert any("1 over" in text["text"] for text in chart["texts"])


def test_series_places_buckets_by_time_and_shades_gaps():
    buckets = [
        Bucket(LAST, served={"critical": 3, "low": 1}, arrived={"critical": 3, "low": 1}),
        Bucket(LAST - 60, served={}, gap_ms=4_000),
    ]
    view = _view(buckets)
    rects = view["charts"]["series"]["rects"]
    slot_w = CHART_W / (300 // BUCKET_S)
    last_x = {r["x"] for r in rects if r["cls"].startswith("fq-bar")}
    assert last_x == {round(CHART_W - slot_w, 2)}
    assert [r["x"] for r in rects if r["cls"] == "fq-gap"] == [round(CHART_W - 7 * slot_w, 2)]
    assert any("not observed" in note for note in view["notes"])


def test_notes_say_when_nothing_was_recorded_or_jobs_were_unknown():
    assert "No history yet" in _view([], since_ms=None)["notes"][0]
    view = _view([Bucket(LAST, served={"?": 3})])
    assert any("3 started job(s) of unknown level" in note for note in view["notes"])


def test_format_ms():
    assert [format_ms(v) for v in (None, 850, 4_200, 210_000, 7_200_000)] == [
        "—",
        "850 ms",
        "4.2 s",
        "3.5 min",
        "2.0 h",
    ]
