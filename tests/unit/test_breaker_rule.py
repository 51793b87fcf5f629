"""The breaker's rule, pure: it counts jobs' outcomes (completed, or failed after their
last attempt), not attempts (docs/usage.md, "The breaker")."""

from __future__ import annotations

import datetime as dt

from fairqueue.breaker import failing, job_outcomes
from fairqueue.ledger import Change
from fairqueue.scheduling.attempts import Event, Start
from fairqueue.scheduling.usage import page_usage
from fairqueue.usage_settings import BreakerSettings

DEFAULTS = BreakerSettings(enabled=True)
DAY = dt.date(2025, 1, 2)


def _change(completed=0, failed=0, retried=0):
    return Change("acme", "email", DAY, completed, failed, 0, retried)


def test_rule__opens_at_the_ratio_of_jobs_once_enough_ended():
    assert DEFAULTS.min_jobs == 20 and DEFAULTS.failure_ratio == 0.95
    assert not failing(0, 19, DEFAULTS)  # too few jobs ended
    assert failing(0, 20, DEFAULTS)
    assert failing(1, 19, DEFAULTS)  # 95%
    assert not failing(2, 18, DEFAULTS)  # 90%
    assert failing(5, 95, DEFAULTS)
    strict = BreakerSettings(enabled=True, min_jobs=1, failure_ratio=1.0)
    assert failing(0, 1, strict) and not failing(1, 99, strict)


def test_outcomes__a_retried_attempt_is_no_failure_until_its_job_fails_its_last():
    # 40 attempts failed, all with attempts left (their jobs retried), none completed:
    # no job ended, whatever share of attempts failed.
    assert job_outcomes([_change(failed=40, retried=40)]) == (0, 0)
    assert not failing(*job_outcomes([_change(failed=40, retried=40)]), DEFAULTS)
    # Jobs failing 4 times then succeeding: 20 completed, 80 failed attempts, all retried.
    assert job_outcomes([_change(completed=20, failed=80, retried=80)]) == (20, 0)
    # Jobs of 3 attempts always failing: 2 retried and the last failed, per job.
    outcomes = job_outcomes([_change(failed=40, retried=26), _change(failed=20, retried=14)])
    assert outcomes == (0, 20)
    assert failing(*outcomes, DEFAULTS)
    # A row counted before the retried counter existed: its failures are jobs'.
    assert job_outcomes([_change(completed=1, failed=5)]) == (1, 5)
    assert job_outcomes([_change(failed=1, retried=3)]) == (0, 0)  # never negative


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
