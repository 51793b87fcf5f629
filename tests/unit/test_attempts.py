"""The history's page arithmetic (``fairqueue.scheduling.attempts``): what a page of
starts and ends records, whatever the page boundaries; and how BullMQ's entries and job
hashes are read (``fairqueue.broker.stream_rows``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairqueue.broker.stream_rows import parse_event, parse_start
from fairqueue.scheduling import attempt_events, attempts
from fairqueue.scheduling.attempt_events import Event, Run, Start
from fairqueue.scheduling.attempts import PageRecord
from fairqueue.scheduling.shares import wait_bin

NOW_S = 1_800_000_000
T0 = NOW_S * 1000 - 600_000
OPTIONS = {
    "now_s": NOW_S,
    "bucket_s": 10,
    "retention_s": 3_600,
    "bound_ms": 2_000,
    "wait_bin": wait_bin,
}
LEVELS = sorted(attempt_events.LEVELS)


@st.composite
def histories(draw):
    """A stream's worth of attempts in order: job ids start, end or are re-added after a
    failure; some jobs' hashes are gone (unknown level)."""
    n_jobs = draw(st.integers(1, 12))
    starts = {}
    for i in range(n_jobs):
        gone = draw(st.booleans()) and draw(st.booleans())
        starts[str(i)] = (
            None
            if gone
            else Start(
                level=draw(st.sampled_from(LEVELS)),
                tenant=draw(st.sampled_from(["a", "b", "t\nx"])),
                ready_ms=T0 + draw(st.integers(0, 60_000)),
                first_attempt=draw(st.booleans()),
            )
        )
    events, at = [], T0 + 60_000
    for _ in range(draw(st.integers(0, 40))):
        at += draw(st.integers(0, 5_000))
        kind = draw(st.sampled_from(["start", "start", "end", "retry", "lost"]))
        events.append(Event(kind, str(draw(st.integers(0, n_jobs - 1))), at))
    return events, starts


def record_in_pages(events, starts, cuts, by_time, state=None, runs=None):
    """``events`` recorded page by page, carrying the runs and the state between pages as
    Redis would (the commit script's writes, read back by the next page)."""
    runs, state = dict(runs or {}), dict(state or {})
    pages = []
    bounds = [0, *sorted(cuts), len(events)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        page = attempts.record_page(events[lo:hi], starts, runs, state, by_time=by_time, **OPTIONS)
        for job_id in page.ended_runs:
            runs.pop(job_id, None)
        runs.update(page.started_runs)
        state.update({name: float(text) for name, text in page.state_writes.items()})
        pages.append(page)
    return pages, runs, state


def merged(pages: list[PageRecord]) -> tuple[dict, dict, dict, int, int, list]:
    buckets, tenants, served = {}, {}, {}
    for page in pages:
        for target, source in ((buckets, page.buckets), (tenants, page.tenants)):
            for b, row in source.items():
                for name, n in row.items():
                    target.setdefault(b, {})
                    target[b][name] = target[b].get(name, 0) + n
        for level, (ms, retries) in page.served.items():
            done, again = served.get(level, (0, 0))
            served[level] = (done + ms, again + retries)
    waits = [w for page in pages for w in page.waits]
    return (
        buckets,
        tenants,
        served,
        sum(p.recorded for p in pages),
        sum(p.unknown for p in pages),
        waits,
    )


@settings(max_examples=300, deadline=None)
@given(histories(), st.lists(st.integers(0, 40), max_size=4), st.booleans())
def test_record_page__the_same_whatever_the_page_boundaries(history, cuts, by_time):
    events, starts = history
    cuts = [c for c in cuts if c <= len(events)]
    whole, whole_runs, _ = record_in_pages(events, starts, [], by_time)
    split, split_runs, _ = record_in_pages(events, starts, cuts, by_time)
    assert merged(split) == merged(whole)
    assert split_runs.keys() == whole_runs.keys()


@settings(max_examples=300, deadline=None)
@given(histories(), st.booleans())
def test_record_page__counts_every_start_once_and_pairs_each_end_with_its_start(history, by_time):
    events, starts = history
    (page,), runs, _ = record_in_pages(events, starts, [], by_time)
    n_starts = sum(1 for e in events if e.kind == "start")
    assert page.recorded + page.unknown == n_starts
    s_fields = sum(n for row in page.buckets.values() for k, n in row.items() if k[:2] == "s:")
    assert s_fields == n_starts
    assert sum(page.started_by_level.values()) == page.recorded
    # ... and each known one in its tenant's bucket too (the tenant page's starts)
    by_tenant: dict[tuple[str, str], int] = {}
    for name, row in page.tenant_rows.items():
        tenant = name.split(":", 2)[2]  # tw:<start second>:<tenant>
        for key, n in row.items():
            if key[:2] == "s:":
                by_tenant[tenant, key[2:]] = by_tenant.get((tenant, key[2:]), 0) + n
    expected_starts = {}
    for e in events:
        info = starts.get(e.job_id)
        if e.kind == "start" and info is not None and info.level is not None:
            key = (info.tenant, info.level)
            expected_starts[key] = expected_starts.get(key, 0) + 1
    assert by_tenant == expected_starts
    # Worker time: each end after a known start adds the time since that start.
    expected, running = {}, {}
    for e in events:
        info = starts.get(e.job_id)
        if e.kind == "start":
            running.pop(e.job_id, None)
            if info is not None:
                running[e.job_id] = (info.level, e.at_ms)
        elif e.job_id in running:
            level, since = running.pop(e.job_id)
            if e.kind == "lost":  # its worker died: no time, no retry
                continue
            ms, retries = expected.get(level, (0, 0))
            expected[level] = (ms + e.at_ms - since, retries + (e.kind == "retry"))
    assert page.served == expected
    assert set(runs) == set(running)
    # A first attempt's wait is from its ready time, never negative; later ones have none.
    firsts = [starts[e.job_id] for e in events if e.kind == "start" and starts[e.job_id]]
    assert len(page.waits) == sum(1 for s in firsts if s.first_attempt)
    assert all(wait >= 0 for _, wait in page.waits)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 4_000), min_size=1, max_size=30))
def test_record_page__a_flow_whose_runs_are_long_is_charged_whole_turns(run_ms):
    """With fairness by time, a flow whose attempts run beyond the turns it paid owes
    whole turns (settlements) and its balance stays below one turn either way."""
    events, starts, at = [], {}, T0 + 60_000
    for i, ms in enumerate(run_ms):
        starts[str(i)] = Start("normal", "a", at, True)
        events += [Event("start", str(i), at), Event("end", str(i), at + ms)]
        at += ms
    state = {"typ": 100.0}
    page = attempts.record_page(events, starts, {}, state, by_time=True, **OPTIONS)
    debt = float(page.state_writes["d:normal\na"])
    assert abs(debt) < 1
    assert all(abs(s.debt) >= 1 for s in page.settlements)
    assert all(s.member == "normal\na" and s.level == "normal" for s in page.settlements)
    # The estimates are averages of the runs (each bounded to 1/16..16 typical ones).
    assert 0 < float(page.state_writes["c:normal\na"]) <= max(*run_ms, 100) * 1.0001
    assert 0 < float(page.state_writes["typ"]) <= max(*run_ms, 100) * 1.0001


def _cold_runs(tenant: str, run_ms: list[int], at: int) -> tuple[list[Event], dict, int]:
    """Jobs of ``tenant`` placed cold (one turn paid), run one after another."""
    events, starts = [], {}
    for i, ms in enumerate(run_ms):
        job_id = f"{tenant}{at}-{i}"
        starts[job_id] = Start("normal", tenant, at, True, paid=1.0)
        events += [Event("start", job_id, at), Event("end", job_id, at + ms)]
        at += ms
    return events, starts, at


def test_record_page__a_cold_flow_measured_first_is_placed_again_its_overrun_paid_at_once():
    """A flow whose jobs were placed cold at one turn and run 6 turns: the page that
    first measures it asks its waiting jobs placed again at about 6 turns (in tags as
    placed now: on the cost grid, times the turn's length), with what its runs overran
    as the shift, not as a settlement; a flow as typical as the queue is left to its
    charges."""
    events, starts, at = _cold_runs("slow", [600, 600, 600], T0 + 60_000)
    more, more_starts, _ = _cold_runs("quick", [100, 100], at)
    state = {"typ": 100.0, "unit": 100.0}
    page = attempts.record_page(
        events + more, starts | more_starts, {}, state, by_time=True, **OPTIONS
    )
    [recost] = page.recosts
    assert (recost.member, recost.level) == ("normal\nslow", "normal")
    assert recost.ratio == pytest.approx(6, rel=0.1)
    assert recost.shift >= 10  # 5 turns overrun a run, the balance settled a turn at a time
    assert not [s for s in page.settlements if s.member == "normal\nslow"]


def _runs_side_by_side(*flows: tuple[str, int, int, dict]) -> tuple[list[Event], dict]:
    """Each flow's (tenant, runs, ms a run, Start keywords) jobs, one worker each, all
    starting together: the page's events in time order."""
    events, starts = [], {}
    for tenant, runs, ms, paid in flows:
        for i in range(runs):
            job_id = f"{tenant}-{i}"
            starts[job_id] = Start("normal", tenant, T0, True, **paid)
            at = T0 + 60_000 + i * ms
            events += [Event("start", job_id, at), Event("end", job_id, at + ms)]
    events.sort(key=lambda e: (e.at_ms, e.kind != "end"))
    return events, starts


def test_record_page__equal_flows_measured_later_are_not_moved_when_every_run_drifts():
    """Every flow's jobs were placed cold at a turn of 25 ms (the first runs, on a loaded
    machine); now every run takes 15. A flow measured first on this page beside a flow
    measured before is priced against that flow's runs now, so it stays in step with it
    (their waiting jobs paid alike); against the typical time as the page found it alone,
    it would be placed again at about 0.6 and take about twice its share."""
    state = {"typ": 25.0, "unit": 25.0, "c:normal\nfirst": 25.0}
    events, starts = _runs_side_by_side(
        ("first", 8, 15, {"paid": 1.0}), ("later", 4, 15, {"paid": 1.0})
    )
    page = attempts.record_page(events, starts, {}, state, by_time=True, **OPTIONS)
    assert not page.recosts
    alone, alone_starts = _runs_side_by_side(("later", 4, 15, {"paid": 1.0}))
    page = attempts.record_page(alone, alone_starts, {}, state, by_time=True, **OPTIONS)
    [recost] = page.recosts
    assert recost.ratio < 1 / attempts.RECOST_BAND


def test_record_page__a_slow_flow_measured_first_is_priced_against_its_peers_runs_now():
    """A quick flow measured before (100 ms) now runs 60 ms; a cold flow runs 600: ten of
    its peer's runs each, so its jobs are placed again at about 10 turns, not at its runs
    over the typical time as the page found it (6)."""
    state = {"typ": 100.0, "unit": 100.0, "c:normal\nquick": 100.0}
    events, starts = _runs_side_by_side(
        ("quick", 20, 60, {"placed": 1.0}), ("slow", 2, 600, {"paid": 1.0})
    )
    page = attempts.record_page(events, starts, {}, state, by_time=True, **OPTIONS)
    [recost] = page.recosts
    assert recost.member == "normal\nslow"
    assert recost.ratio == pytest.approx(10, rel=0.15)  # on the grid of quarter powers of two


def test_record_page__a_cold_run_ending_after_the_first_measurement_shifts_its_flow():
    """The history's lag: a cold job of the flow still ran when its flow was first
    measured; its overrun, when its end is read, is paid at once too (a shift of the
    flow's waiting jobs, ratio 1), not behind its backlog."""
    events, starts, at = _cold_runs("slow", [600, 600, 600], T0 + 60_000)
    first = attempts.record_page(events, starts, {}, {"typ": 100.0}, by_time=True, **OPTIONS)
    state = {"typ": 100.0, **{k: float(v) for k, v in first.state_writes.items()}}
    later, later_starts, _ = _cold_runs("slow", [600, 600], at)
    page = attempts.record_page(later, later_starts, {}, state, by_time=True, **OPTIONS)
    assert [(r.member, r.ratio) for r in page.recosts] == [("normal\nslow", 1.0)]
    assert page.recosts[0].shift > 0
    assert not page.settlements


def test_record_page__a_run_is_charged_against_what_its_job_paid_not_a_later_estimate():
    """Jobs placed by a young estimate (1/16 turn, ``fqCost``) that run a whole turn owe
    15/16 each, though their flow's estimate is a turn by now (a job with nothing recorded
    is charged against that: nothing); the page's settlements of a flow are one, summed
    (each moves the flow's waiting jobs), the rest of the balance kept."""
    state = {"typ": 600.0, "unit": 600.0, "c:normal\nslow": 600.0}
    starts = {str(i): Start("normal", "slow", T0, True, placed=1 / 16) for i in range(5)}
    starts["5"] = Start("normal", "slow", T0, True)
    events = [Event("start", str(i), T0 + i) for i in range(6)]
    events += [Event("end", str(i), T0 + 600 + i) for i in range(6)]
    page = attempts.record_page(events, starts, {}, state, by_time=True, **OPTIONS)
    assert page.settlements == [attempts.Settlement("normal\nslow", "normal", 2 * 1.875)]
    assert float(page.state_writes["d:normal\nslow"]) == 0.9375


def test_record_page__retention_drops_old_buckets_and_clamps_old_ready_times():
    old = (NOW_S - 7_200) * 1000
    start = Start("high", "a", ready_ms=old, first_attempt=True)
    page = attempts.record_page(
        [Event("start", "1", T0 + 60_000)], {"1": start}, {}, {}, by_time=False, **OPTIONS
    )
    oldest = attempts.oldest_bucket(NOW_S, 10, 3_600)
    assert page.buckets[oldest] == {"a:high": 1}
    assert min(page.buckets) >= oldest
    assert page.waits == [("high", T0 + 60_000 - old)]
    assert page.buckets[attempts.bucket_of(T0 + 60_000, 10)]["o:high"] == 1


def test_gap_buckets__split_by_bucket_from_the_later_of_since_and_retention():
    gap = attempts.gap_buckets(10_005_000, 10_032_000, oldest_s=0, since_ms=10_007_000, bucket_s=10)
    assert gap == {10_000: 3_000, 10_010: 10_000, 10_020: 10_000, 10_030: 2_000}
    assert attempts.gap_buckets(5, 5, oldest_s=0, since_ms=0, bucket_s=10) == {}


@pytest.mark.parametrize(
    ("run", "text"),
    [
        (Run("low", "a", 123, 1.0), "low\na\n123\n1"),
        (Run("high", "multi\nline", 5, 0.25), "high\nmulti\nline\n5\n0.25"),
        (Run("normal", "a", 7, 1.0, cold=True), "normal\na\n7\nc1"),
    ],
)
def test_run__encodes_as_the_lua_side_did_and_back(run, text):
    assert run.encode() == text
    assert Run.decode(text) == run


def test_run__an_unreadable_entry_is_no_run():
    assert Run.decode("nonsense") is None
    assert Run.decode("weird\na\n1\n1") is None
    assert Run.decode("low\na\n1\nnan") is None
    assert Run.decode("low\na\ninf\n1") is None


def test_parse_event__starts_ends_and_retries_only():
    assert parse_event(b"17-0", [b"event", b"active", b"jobId", b"9", b"prev", b"waiting"]) == (
        Event("start", "9", 17)
    )
    assert parse_event(b"18-1", [b"event", b"failed", b"jobId", b"9"]) == Event("end", "9", 18)
    assert parse_event(b"19-0", [b"event", b"delayed", b"jobId", b"9", b"prev", b"active"]) == (
        Event("retry", "9", 19)
    )
    # A backed-off retry: BullMQ's 'delayed' has no 'prev' (nor has a delayed add's).
    assert parse_event(b"19-3", [b"event", b"delayed", b"jobId", b"9", b"delay", b"50"]) == (
        Event("retry", "9", 19)
    )
    assert parse_event(b"19-1", [b"event", b"waiting", b"jobId", b"9"]) is None
    assert parse_event(b"19-2", [b"event", b"stalled", b"jobId", b"9"]) == (
        Event("stalled", "9", 19)
    )
    assert parse_event(b"20-0", [b"event", b"added", b"jobId", b"9"]) is None
    assert parse_event(b"21-0", [b"event", b"drained"]) is None


def test_fold_stalls__a_re_add_the_stalled_check_wrote_is_a_lost_attempt_not_a_retry():
    events = [
        Event("start", "1", 10),
        Event("start", "2", 11),
        Event("retry", "1", 50),  # a real retry: no stalled follows
        Event("retry", "2", 30_011),  # BullMQ's stalled check: the re-add, then 'stalled'
        Event("stalled", "2", 30_011),
        Event("stalled", "3", 30_012),  # its re-add was on an earlier page: nothing to fold
        Event("start", "2", 30_100),
        Event("end", "2", 30_200, ok=True),
    ]
    folded = attempt_events.fold_stalls(events)
    assert [(e.kind, e.job_id) for e in folded] == [
        ("start", "1"),
        ("start", "2"),
        ("retry", "1"),
        ("lost", "2"),
        ("start", "2"),
        ("end", "2"),
    ]
    starts = {job: Start("normal", "a", 0, first_attempt=True) for job in ("1", "2")}
    page = attempts.record_page(folded, starts, {}, {}, by_time=False, **OPTIONS)
    # Job 2's lost attempt: no worker time, no retry; its second attempt's 100 ms count.
    assert page.served == {"normal": (40 + 100, 1)}
    assert page.recorded == 3


def test_cut_before_trailing_retry__keeps_a_last_re_add_for_the_next_page_when_cut():
    cut = attempt_events.cut_before_trailing_retry
    assert cut(["start", None, "retry"], cut=True) == 2
    assert cut(["start", None, "retry"], cut=False) == 3  # the page is the stream's end
    assert cut(["start", "retry", "end"], cut=True) == 3
    assert cut(["retry"], cut=True) == 1  # never none: the cursor must move


def _row(data, opts=None, ats=b"1", timestamp=b"1000", delay=b"0"):
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return [timestamp, delay, ats, json.dumps(opts or {}).encode(), raw, None, None]


def test_parse_start__fairqueue_metadata_foreign_jobs_and_bad_data():
    fair = parse_start(
        _row({"priorityLevel": "high", "tenantId": "t-1"}, {"fqReady": 1500}), 65_536
    )
    assert fair == Start("high", "t-1", 1500, True)
    foreign = parse_start(_row({"x": 1}, {"priority": 7}, delay=b"250"), 65_536)
    assert foreign == Start("low", "default", 1250, True)
    paid = parse_start([*_row({"priorityLevel": "low"})[:5], b"1", b"2.5"], 65_536)
    assert (paid.paid, paid.placed) == (1.0, 2.5)  # fqPaid (cold), fqCost
    assert parse_start(_row({"priorityLevel": "urgent"}), 65_536).level is None
    assert parse_start(_row({"priorityLevel": "low", "tenantId": 5}), 65_536).level is None
    assert parse_start(_row(b"not json"), 65_536).level is None
    assert parse_start(_row({"x": "y" * 100}), 50) is None  # over the decode limit
    assert parse_start([None, None, None, None, None], 65_536) is None  # hash gone
    assert parse_start(_row({"priorityLevel": "low"}, ats=b"3"), 65_536).first_attempt is False
    lone = parse_start(_row(b'{"priorityLevel":"low","tenantId":"\\ud800"}'), 65_536)
    assert lone.tenant == "?"


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(LEVELS),
    st.text(min_size=1, max_size=12),
    st.integers(0, 2**50),
    st.dictionaries(st.sampled_from(["i", "to", "x"]), st.integers(), max_size=3),
)
def test_parse_start__the_text_read_agrees_with_decoding(level, tenant, ready, extra):
    """fairqueue's own jobs are read from the stored text (level and tenant first, a
    whole fqReady); any other order of the same JSON is decoded: the same start."""
    opts = {"attempts": 1, "fqReady": ready, "priority": 2_097_151}
    compact = {"separators": (",", ":")}
    first = {"priorityLevel": level, "tenantId": tenant, **extra}
    last = {**extra, "tenantId": tenant, "priorityLevel": level}
    as_text = parse_start(
        [
            b"1",
            b"0",
            b"1",
            json.dumps(opts, **compact).encode(),
            json.dumps(first, **compact).encode(),
        ],
        65_536,
    )
    decoded = parse_start(
        [b"1", b"0", b"1", json.dumps(opts).encode(), json.dumps(last).encode()], 65_536
    )
    assert (
        as_text == decoded == Start(level, tenant.encode("utf-8", "replace").decode(), ready, True)
    )


_field = st.one_of(st.none(), st.binary(max_size=40), st.sampled_from([b"1e999", b"nan", b"-3"]))
_json_text = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=8)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
).map(lambda value: json.dumps(value).encode())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_field, _json_text), min_size=5, max_size=5))
def test_parse_start__never_raises_on_what_another_producer_may_store(row):
    """A job hash written by anyone (odd numbers, infinities, nested or broken JSON) is
    read or counted unknown, never an exception: the history's cursor must move past it."""
    start = parse_start(row, 65_536)
    assert start is None or isinstance(start.ready_ms, int)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_run_decode__never_raises_on_any_text(text):
    """fq:run entries another version (or a hand) wrote are no run, never an exception."""
    run = Run.decode(text)
    assert run is None or (run.level in attempt_events.LEVELS and Run.decode(run.encode()) == run)


def test_parse_start__a_ready_time_that_overflows_is_unknown_not_an_error():
    """Finite timestamp and delay whose sum is infinite (another producer's odd numbers)."""
    row = [b"8.99e307", b"8.99e307", b"1", b"{}", b"{}"]
    assert parse_start(row, 65_536) is None
