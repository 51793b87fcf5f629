"""The breaker's rule, pure: it counts attempts' outcomes (completed; failed, retried or
not; lost with their worker) (docs/usage.md, "The breaker")."""

from __future__ import annotations

import datetime as dt

from fairqueue.conf.usage_settings import BreakerSettings
from fairqueue.scheduling.attempt_events import Event, Start
from fairqueue.scheduling.usage import page_usage
from fairqueue.usage.breaker import attempt_outcomes, failing
from fairqueue.usage.ledger import Change

DEFAULTS = BreakerSettings(enabled=True)
DAY = dt.date(2025, 1, 2)


def _change(completed=0, failed=0, retried=0, lost=0):
    return Change("acme", "email", DAY, completed, failed, 0, retried, 0, lost)


def test_rule__opens_at_the_ratio_of_jobs_once_enough_ended():
    assert DEFAULTS.min_jobs == 20 and DEFAULTS.failure_ratio == 0.95
    assert not failing(0, 19, DEFAULTS)  # too few jobs ended
    assert failing(0, 20, DEFAULTS)
    assert failing(1, 19, DEFAULTS)  # 95%
    assert not failing(2, 18, DEFAULTS)  # 90%
    assert failing(5, 95, DEFAULTS)
    strict = BreakerSettings(enabled=True, min_jobs=1, failure_ratio=1.0)
    assert failing(0, 1, strict) and not failing(1, 99, strict)


def test_outcomes__every_failed_attempt_counts_retried_or_not_and_stalls_too():
    # 40 attempts failed, all with attempts left (their jobs retried): 40 failures.
    assert attempt_outcomes([_change(failed=40, retried=40)]) == (0, 40)
    assert failing(*attempt_outcomes([_change(failed=40, retried=40)]), DEFAULTS)
    # Jobs failing 4 times then succeeding: 80% of attempts failed, under the ratio.
    assert attempt_outcomes([_change(completed=20, failed=80, retried=80)]) == (20, 80)
    assert not failing(*attempt_outcomes([_change(completed=20, failed=80)]), DEFAULTS)
    # Attempts whose worker died count as failures.
    assert attempt_outcomes([_change(lost=15), _change(failed=5, retried=5)]) == (0, 20)
    assert failing(*attempt_outcomes([_change(lost=20)]), DEFAULTS)
    assert attempt_outcomes([_change(completed=-1, failed=-3, lost=-2)]) == (0, 0)


def test_page_usage__counts_an_attempt_lost_with_its_worker_apart():
    start = Start(level="normal", tenant="acme", ready_ms=0, first_attempt=True)
    events = [
        Event("start", "1", 1_000),
        Event("lost", "1", 31_000),  # the stalled-job check put it back
        Event("start", "1", 31_100),
        Event("end", "1", 31_200, ok=True),
    ]
    use = page_usage(events, {"1": start}, {}, lambda job_id: "email")
    row = "acme\nemail"
    counts = {stat: use.increments.get(("19700101", f"{stat}:{row}"), 0) for stat in "acflt"}
    assert counts == {"a": 2, "c": 1, "f": 0, "l": 1, "t": 100}


def test_page_usage__counts_the_retried_attempts_apart():
    start = Start(level="normal", tenant="acme", ready_ms=0, first_attempt=True)
    events = [
        Event("start", "1", 1_000),
        Event("retry", "1", 1_100),  # failed, attempts left
        Event("start", "1", 1_200),
        Event("end", "1", 1_300, ok=False),  # failed its last attempt
        Event("start", "2", 1_400),
        Event("retry", "2", 1_500),
        Event("start", "2", 1_600),
        Event("end", "2", 1_700, ok=True),
    ]
    again = Start(level="normal", tenant="acme", ready_ms=0, first_attempt=False)
    starts = {"1": start, "2": again}
    use = page_usage(events, starts, {}, lambda job_id: "email")
    day = "19700101"
    row = "acme\nemail"
    counts = {stat: use.increments.get((day, f"{stat}:{row}"), 0) for stat in "acfr"}
    assert counts == {"a": 4, "c": 1, "f": 3, "r": 2}


def test_page_usage__a_delayed_add_is_no_retry_of_anything():
    # A job added with a delay writes the same 'delayed' event as a backed-off retry:
    # without a run (started on this page or remembered), it counts nothing.
    use = page_usage([Event("retry", "7", 1_000)], {}, {}, lambda job_id: "email")
    assert not use
