"""The base of fairqueue's long-running loops (``rebalance_fair``'s, ``fairqueue_relay``'s,
and the parts ``fairqueue_worker``'s asyncio worker can share), written once so the
three behave alike for an operator:

* the first SIGINT/SIGTERM finishes the round in flight and returns; a second exits at
  once (status 128 + the signal);
* a random start-up delay of up to a second (an interval, if shorter), so loops a
  deploy starts together do not all hit Redis at once;
* Redis unreachable: logged once when it goes and once when it comes back, retried with
  one capped backoff; any other failure of a round is logged once per kind (by class
  name: messages may quote data) and the loop goes on;
* stale database connections closed before and after each round, as Django does around
  a request, so a loop that runs for weeks never holds a dead or ancient connection.

It sits beside the packages whose loops build on it (``rebalance``, ``enqueue``,
``worker``) rather than in ``management``, which only parses arguments and calls them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import random
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, Final

from django.db import close_old_connections

from fairqueue.conf import get_settings
from fairqueue.exceptions import BrokerRejectedError, BrokerUnavailableError

#: The longest pause between two tries while Redis is unreachable or refusing.
MAX_BACKOFF_MS: Final = 30_000
#: The start-up delay is random in 0..min(interval, this).
MAX_STARTUP_DELAY_MS: Final = 1_000
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
#: How long a second signal waits for its log line to be written before exiting.
_LAST_WORDS_S: Final = 1.0

#: What a ``signal.signal`` handler leaves for the reporter thread: a line to log, what
#: to do next, an event set when both are done (None: the reporter ends).
_Reporter = queue.SimpleQueue[tuple[str, Callable[[], None] | None, threading.Event] | None]


def backoff_ms(interval_ms: int, failures: int) -> int:
    """The pause after ``failures`` failed rounds in a row: twice the interval, doubling
    with each failure, never more than :data:`MAX_BACKOFF_MS`."""
    return min(interval_ms * 2 ** min(failures, 10), MAX_BACKOFF_MS)


def startup_delay_s(interval_ms: int) -> float:
    """A random start-up delay in seconds (a thundering herd's remedy, not a schedule)."""
    return random.uniform(0, min(interval_ms, MAX_STARTUP_DELAY_MS)) / 1000  # noqa: S311


def unavailable_reason(exc: BrokerUnavailableError) -> str:
    """Why Redis could not be reached, as the underlying error's class name."""
    cause = exc.__cause__
    return type(cause).__name__ if cause is not None else str(exc)


class Backoff:
    """Redis's availability as a loop sees it, and the pause before the next try.

    An outage is logged twice, not once per failed round: when it starts (naming the
    server as ``host:port/db``, never a password) and when Redis answers again.
    """

    def __init__(self, logger: logging.Logger, *, interval_ms: int, resumed: str) -> None:
        self.logger = logger
        self.interval_ms = interval_ms
        self.resumed = resumed
        #: Failed rounds in a row (unreachable or refusing); 0 once a round succeeds.
        self.failures = 0
        #: Whether Redis is unreachable (as of the last round).
        self.down = False

    def unreachable(self, exc: BrokerUnavailableError) -> int:
        """A round found Redis unreachable: the pause before the next, in ms."""
        if not self.down:
            self.logger.warning(
                "Redis at %s is unreachable (%s); retrying with backoff up to %d s",
                get_settings().redis.described,
                unavailable_reason(exc),
                MAX_BACKOFF_MS // 1000,
            )
        self.down = True
        return self._failed()

    def refused(self, exc: BrokerRejectedError) -> int:
        """Redis answered a round with an error (out of memory, a replica...): the pause."""
        self.logger.warning("Redis refused a command (%s); retrying", exc.redis_error)
        return self._failed()

    def succeeded(self) -> None:
        if self.down:
            self.logger.info("Redis is reachable again; %s", self.resumed)
        self.down, self.failures = False, 0

    def _failed(self) -> int:
        self.failures += 1
        return backoff_ms(self.interval_ms, self.failures)


class RepeatedFailure:
    """A failure that may repeat every round, logged once per kind (its class name:
    messages may quote data) and once when it is over, instead of once per round."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self.error: str | None = None

    def failed(self, exc: BaseException) -> None:
        error = type(exc).__name__
        if error != self.error:
            self.logger.error("%s failed (%s); retrying every round", self.what, error)
        self.error = error

    def succeeded(self) -> None:
        if self.error is not None:
            self.logger.info("%s works again", self.what)
            self.error = None


class GracefulStop:
    """The stop rule of every loop: the first SIGINT/SIGTERM (or :meth:`request`) asks
    it to stop once the work in flight is done; a signal after that exits at once.

    ``finishing`` ends the first signal's line ("SIGTERM: stopping <finishing>"),
    ``forced`` the second's ("SIGTERM again: exiting now<forced>"). ``on_request`` wakes
    the loop (from any thread).

    Under ``signal.signal`` (:meth:`install`) the handler only sets a flag and hands the
    rest to a reporter thread: it runs in the main thread between two bytecodes, maybe
    inside a write to the stream it would log to ("reentrant call") or holding the lock
    of the event it would set (a deadlock).
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        finishing: str,
        on_request: Callable[[], None],
        forced: str = "",
    ) -> None:
        self.logger = logger
        self.finishing = finishing
        self.forced = forced
        self._on_request = on_request
        self.requested = False
        self._reporter: _Reporter | None = None

    def request(self) -> None:
        """Stop after the work in flight. Safe from any thread (not from a
        ``signal.signal`` handler: :meth:`on_signal` is that)."""
        self.requested = True
        self._on_request()

    def on_signal(self, signum: int, frame: Any = None) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            self._act(f"{name} again: exiting now{self.forced}", None, wait=True)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, RuntimeError, ValueError):
                    pass  # a reentrant or closed stream: exit all the same
            os._exit(128 + signum)
        self.requested = True
        self._act(
            f"{name}: stopping {self.finishing} (send it again to exit now)", self._on_request
        )

    def _act(self, message: str, then: Callable[[], None] | None, *, wait: bool = False) -> None:
        """Log ``message``, then call ``then``: here on an asyncio loop, on the reporter
        thread under ``signal.signal`` (``wait``: until it is done, a second at most)."""
        reporter = self._reporter
        if reporter is None:
            self.logger.warning("%s", message)
            if then is not None:
                then()
            return
        done = threading.Event()
        reporter.put((message, then, done))  # SimpleQueue.put is reentrant
        if wait:
            done.wait(_LAST_WORDS_S)

    def install(self) -> Callable[[], None]:
        """Take SIGINT/SIGTERM with ``signal.signal`` (main thread only; elsewhere this
        does nothing); return a function that puts the previous handlers back."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        reporter: _Reporter = queue.SimpleQueue()
        thread = threading.Thread(
            target=self._report, args=(reporter,), name="fairqueue-signals", daemon=True
        )
        thread.start()
        self._reporter = reporter
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.on_signal)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            self._reporter = None
            reporter.put(None)
            thread.join(_LAST_WORDS_S)

        return restore

    def install_on(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        """Take SIGINT/SIGTERM on an asyncio loop (main thread only); return a function
        that puts the previous handlers back.

        ``loop.add_signal_handler`` (not ``signal.signal``) so the loop wakes at once
        whichever thread the kernel delivers the signal to, even while every job runs in
        a thread pool; the handler then runs as a callback of the loop, where logging is
        safe.
        """
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self.on_signal, sig)

        def restore() -> None:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

        return restore

    def _report(self, reporter: _Reporter) -> None:
        while (item := reporter.get()) is not None:
            message, then, done = item
            try:
                self.logger.warning("%s", message)
                if then is not None:
                    then()
            finally:
                done.set()


class Loop:
    """A round (:meth:`run_once`) every ``interval_ms`` until stopped, or once.

    Subclasses implement :meth:`run_once` and may override :meth:`start_line` (logged
    once at start), :meth:`pause_ms` (the wait after a round), :meth:`wait` (what to do
    while waiting) and :meth:`finish` (after the last round, however it ended); the
    class attributes name the loop's logger and complete its log lines.

    With ``once``, one round runs and its errors are raised to the caller (a command says
    them once, as its error): no start-up delay, no signal handlers, no retry.
    """

    logger: logging.Logger = logging.getLogger("fairqueue")
    #: What a round is, in "<round_name> failed (OperationalError)".
    round_name = "round"
    #: The end of "Redis is reachable again; <resumed>".
    resumed = "resumed"
    #: The end of "SIGTERM: stopping <finishing> (send it again to exit now)".
    finishing = "after the round in flight"
    #: The end of "SIGTERM again: exiting now<forced>" (what becomes of the work in flight).
    forced = ""

    def __init__(self, *, interval_ms: int, install_signal_handlers: bool = True) -> None:
        self.interval_ms = interval_ms
        self.once = False
        self.backoff = Backoff(self.logger, interval_ms=interval_ms, resumed=self.resumed)
        self.failure = RepeatedFailure(self.logger, self.round_name)
        #: Rounds run (successful or not); tests and monitors may watch it.
        self.rounds = 0
        self._stop = threading.Event()
        self._install_signals = install_signal_handlers
        self.graceful = GracefulStop(
            self.logger, finishing=self.finishing, forced=self.forced, on_request=self._stop.set
        )

    # -- what a loop defines --------------------------------------------------------------

    def run_once(self) -> Any:
        """One round. Raises BrokerUnavailableError/BrokerRejectedError as Redis does."""
        raise NotImplementedError

    def start_line(self) -> str | None:
        """What the loop will do, logged once at start (no password, no tenant ids)."""
        return None

    def pause_ms(self, result: Any) -> int:
        """The wait after a round that returned ``result``."""
        return self.interval_ms

    def wait(self, pause_ms: int) -> None:
        """Wait ``pause_ms`` for the next round, returning at once when stopped."""
        self._stop.wait(pause_ms / 1000)

    def finish(self) -> None:
        """After the last round, however the loop ended (release what it holds)."""

    # -- running --------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        # The flag is set in the signal handler itself, the event a moment later.
        return self.graceful.requested or self._stop.is_set()

    def request_stop(self) -> None:
        """Stop after the round in flight. Safe from any thread."""
        self.graceful.request()

    def run(self, *, once: bool = False) -> Any:
        """Run rounds until stopped (or one, ``once``); return the last round's result.

        Signal handlers, when taken (main thread, not ``once``), are taken before the
        start line is logged and put back on return.
        """
        self.once = once
        take = self._install_signals and not once
        restore_signals = self.graceful.install() if take else (lambda: None)
        result: Any = None
        try:
            line = self.start_line()
            if line:
                self.logger.info("%s", line)
            if not once:
                self._stop.wait(startup_delay_s(self.interval_ms))
            while not self.stopping:
                result, pause = self._round()
                if once or self.stopping:
                    break
                self.wait(pause)
        finally:
            try:
                self.finish()
            finally:
                restore_signals()
        return result

    def _round(self) -> tuple[Any, int]:
        close_old_connections()
        try:
            result = self.run_once()
        except BrokerUnavailableError as exc:
            if self.once:
                raise
            return None, self.backoff.unreachable(exc)
        except BrokerRejectedError as exc:  # e.g. out of memory taking a lock
            if self.once:
                raise
            return None, self.backoff.refused(exc)
        except Exception as exc:  # a database hiccup must not end the loop
            if self.once:
                raise
            self.failure.failed(exc)
            return None, self.interval_ms
        finally:
            self.rounds += 1
            close_old_connections()
        self.backoff.succeeded()
        self.failure.succeeded()
        return result, self.pause_ms(result)
