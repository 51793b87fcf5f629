"""The loop base every long-running command shares (fairqueue.loop) and its command side
(fairqueue.management.base): backoff, start-up delay, database connections, the stop
rule in real processes, logging by --verbosity, and --interval-ms checked once."""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import textwrap
import threading
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, ManagementUtility, call_command
from django.core.management.base import OutputWrapper

from fairqueue import loop as loop_module
from fairqueue.conf import get_settings
from fairqueue.exceptions import BrokerRejectedError, BrokerUnavailableError
from fairqueue.loop import MAX_BACKOFF_MS, Loop, backoff_ms, startup_delay_s
from fairqueue.management.base import command_logging
from tests.helpers import read_until, spawner

ROOT = Path(__file__).resolve().parents[2]
# Every round closes stale database connections: the loops may touch the database.
pytestmark = pytest.mark.django_db


def unavailable() -> BrokerUnavailableError:
    try:
        raise ConnectionRefusedError("refused")
    except ConnectionRefusedError as cause:
        exc = BrokerUnavailableError("Redis is unavailable (ConnectionRefusedError)")
        exc.__cause__ = cause
        return exc


class Scripted(Loop):
    """A loop whose rounds return or raise what the test scripted, then stop; its waits
    are recorded instead of slept."""

    logger = logging.getLogger("fairqueue.test_loop")
    round_name = "scripted round"
    resumed = "scripted rounds resumed"

    def __init__(self, outcomes, **kwargs) -> None:
        super().__init__(interval_ms=kwargs.pop("interval_ms", 1), **kwargs)
        self.outcomes = list(outcomes)
        self.pauses: list[int] = []
        self.finished = 0

    def run_once(self):
        outcome = self.outcomes.pop(0)
        if not self.outcomes:
            self.request_stop()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def pause_ms(self, result):
        return 0 if result == "more" else self.interval_ms

    def wait(self, pause_ms: int) -> None:
        self.pauses.append(pause_ms)

    def finish(self) -> None:
        self.finished += 1


def messages(caplog, name="fairqueue.test_loop"):
    return [r.getMessage() for r in caplog.records if r.name == name]


# -- the rules ----------------------------------------------------------------------------


def test_backoff__doubles_from_twice_the_interval_and_is_capped():
    assert [backoff_ms(100, n) for n in range(1, 6)] == [200, 400, 800, 1_600, 3_200]
    assert backoff_ms(100, 9) == 30_000 == MAX_BACKOFF_MS
    assert backoff_ms(1, 50) == 1_024  # the exponent stops at 10
    assert backoff_ms(3_600_000, 1) == MAX_BACKOFF_MS


def test_startup_delay__random_within_a_second_or_one_interval():
    delays = [startup_delay_s(5_000) for _ in range(200)]
    assert all(0 <= d <= 1.0 for d in delays) and len(set(delays)) > 100
    assert all(0 <= startup_delay_s(20) <= 0.02 for _ in range(200))


def test_outage__logged_once_going_and_once_back_with_the_backoff_pauses(caplog):
    loop = Scripted([unavailable(), unavailable(), unavailable(), "ok", "ok"], interval_ms=10)
    with caplog.at_level(logging.INFO, logger="fairqueue.test_loop"):
        loop.run()
    assert loop.pauses == [20, 40, 80, 10]  # the last round stopped the loop: no wait
    assert loop.rounds == 5 and loop.finished == 1
    lines = messages(caplog)
    down = [m for m in lines if "unreachable" in m]
    assert down == [
        f"Redis at {get_settings().redis.described} is unreachable (ConnectionRefusedError); "
        "retrying with backoff up to 30 s"
    ], lines
    assert lines.count("Redis is reachable again; scripted rounds resumed") == 1
    assert (loop.backoff.down, loop.backoff.failures) == (False, 0)


def test_refused__logged_each_time_backed_off_and_not_an_outage(caplog):
    refused = BrokerRejectedError("no", redis_error="OutOfMemoryError")
    loop = Scripted([refused, refused, "more", "ok"])
    with caplog.at_level(logging.INFO, logger="fairqueue.test_loop"):
        loop.run()
    assert loop.pauses == [2, 4, 0]  # a round that moved work runs the next at once
    lines = messages(caplog)
    assert lines.count("Redis refused a command (OutOfMemoryError); retrying") == 2
    assert not [m for m in lines if "reachable again" in m]


def test_other_failures__once_per_kind_by_class_name_and_the_loop_goes_on(caplog):
    from django.db import OperationalError

    outcomes = [OperationalError("secret table"), OperationalError("x"), KeyError("k"), "ok"]
    loop = Scripted(outcomes)
    with caplog.at_level(logging.INFO, logger="fairqueue.test_loop"):
        loop.run()
    assert loop.rounds == 4 and loop.pauses == [1, 1, 1]
    assert messages(caplog) == [
        "scripted round failed (OperationalError); retrying every round",
        "scripted round failed (KeyError); retrying every round",
        "scripted round works again",
    ]
    assert "secret" not in caplog.text


def test_once__one_round_errors_raised_no_retry_and_finish_runs():
    loop = Scripted([unavailable(), "never"])
    with pytest.raises(BrokerUnavailableError):
        loop.run(once=True)
    assert (loop.rounds, loop.pauses, loop.finished) == (1, [], 1)
    assert Scripted(["ok", "never"]).run(once=True) == "ok"


def test_database_connections__closed_before_and_after_every_round(monkeypatch):
    calls = []
    monkeypatch.setattr(loop_module, "close_old_connections", lambda: calls.append(loop.rounds))
    loop = Scripted(["ok", unavailable(), ValueError("v"), "ok"])
    loop.run()
    # Before each round (rounds done so far) and after it (counted by then).
    assert calls == [0, 1, 1, 2, 2, 3, 3, 4]


def test_request_stop__from_another_thread_ends_the_wait_at_once():
    class Idle(Loop):
        def run_once(self):
            return None

    idle = Idle(interval_ms=3_600_000)
    thread = threading.Thread(target=idle.run, daemon=True)
    thread.start()
    assert _wait(lambda: idle.rounds == 1)
    idle.request_stop()
    idle.request_stop()  # a second request is no signal: nothing exits
    thread.join(5)
    assert not thread.is_alive()


def _wait(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# -- the stop rule, in real processes ---------------------------------------------------

LOOP_SCRIPT = """
import os, sys, time
import django

django.setup()
from fairqueue.loop import Loop
from fairqueue.management.base import command_logging

class Slow(Loop):
    def run_once(self):
        print(f"round {self.rounds + 1} start", flush=True)
        time.sleep(float(sys.argv[1]))
        print(f"round {self.rounds + 1} end", flush=True)

with command_logging(1, sys.stderr):
    Slow(interval_ms=10).run()
print("returned", flush=True)
"""


@pytest.fixture
def slow_loop():
    with spawner() as spawn:
        yield lambda round_s: spawn(
            [sys.executable, "-c", textwrap.dedent(LOOP_SCRIPT), str(round_s)],
            cwd=ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        )


def test_first_signal__the_round_in_flight_finishes_then_run_returns(slow_loop):
    process = slow_loop(1.0)
    before = read_until(process, "round 1 start")
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=30)
    output = "".join(before) + rest
    assert process.returncode == 0, output
    assert "round 1 end" in output and "round 2 start" not in output, output
    assert "returned" in output
    stopping = [line for line in output.splitlines() if "SIGTERM: stopping" in line]
    assert len(stopping) == 1, output
    # One format for every loop: a timestamp, the level, the message.
    assert stopping[0].endswith(
        "WARNING SIGTERM: stopping after the round in flight (send it again to exit now)"
    ), output
    assert stopping[0][:4].isdigit(), output


@pytest.mark.serial  # a subprocess or a live loop against a deadline
def test_second_signal__exits_at_once_with_128_plus_the_signal(slow_loop):
    process = slow_loop(60.0)
    read_until(process, "round 1 start")
    process.send_signal(signal.SIGINT)
    read_until(process, "SIGINT: stopping")
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    rest, _ = process.communicate(timeout=10)
    assert process.returncode == 128 + signal.SIGINT, rest
    assert time.monotonic() - started < 3
    assert "SIGINT again: exiting now" in rest and "round 1 end" not in rest, rest


# -- logging ------------------------------------------------------------------------------


def bare_fairqueue_logger(monkeypatch):
    """fairqueue's logger as in a project whose LOGGING leaves it alone: nothing above it
    handles its records (pytest's capture sits on the root logger). Called in the test's
    body: pytest attaches its capture to loggers that do not propagate when a phase
    starts."""
    package = logging.getLogger("fairqueue")
    monkeypatch.setattr(package, "propagate", False)
    monkeypatch.setattr(package, "handlers", [])
    return package


@pytest.mark.parametrize(
    ("verbosity", "shown"),
    [
        (0, ["WARNING one"]),
        (1, ["WARNING one", "INFO two"]),
        (3, ["WARNING one", "INFO two", "DEBUG three"]),
    ],
)
def test_command_logging__level_from_verbosity_timestamps_and_undone(monkeypatch, verbosity, shown):
    package = bare_fairqueue_logger(monkeypatch)
    stream = StringIO()
    before = package.level
    with command_logging(verbosity, OutputWrapper(stream)):
        log = logging.getLogger("fairqueue.outbox")  # any of fairqueue's loggers
        log.warning("one")
        log.info("two")
        log.debug("three")
    lines = stream.getvalue().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == shown  # after date and time
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", line) for line in lines)
    assert package.handlers == [] and package.level == before


def test_command_logging__a_users_handler_is_left_alone(monkeypatch):
    package = bare_fairqueue_logger(monkeypatch)
    users = logging.StreamHandler(StringIO())
    package.addHandler(users)
    stream = StringIO()
    with command_logging(1, stream):
        assert package.handlers == [users]
        logging.getLogger("fairqueue.rebalance").info("hello")
    assert stream.getvalue() == "" and users.stream.getvalue() == "hello\n"


# -- arguments, checked once --------------------------------------------------------------


@pytest.mark.parametrize("command", ["rebalance_fair", "fairqueue_relay"])
def test_interval_ms__named_error_on_the_command_line(command, capsys):
    utility = ManagementUtility(["manage.py", command, "--once", "--interval-ms", "0"])
    with pytest.raises(SystemExit) as info:
        utility.execute()
    assert info.value.code == 2
    assert (
        "argument --interval-ms: '0' is not allowed: expected an integer in 1..3600000"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("command", ["rebalance_fair", "fairqueue_relay"])
@pytest.mark.parametrize("value", [0, 3_600_001, "x", True])
def test_interval_ms__call_command_keyword_is_checked_again(command, value):
    with pytest.raises(CommandError) as info:
        call_command(command, once=True, interval_ms=value)
    assert str(info.value) == (
        f"argument --interval-ms: {value!r} is not allowed: expected an integer in 1..3600000"
    )
