"""What fairqueue's long-running commands share on the command side: ``--once`` and
``--interval-ms`` (parsed and checked here, once) and one logging setup. The loops
themselves are :class:`fairqueue.loop.Loop` s; a command parses its arguments, builds
its loop and runs it (django-tasks' ``db_worker`` split).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, TextIO

from django.core.management.base import BaseCommand, CommandParser, OutputWrapper

from fairqueue.management.arguments import interval_ms, recheck

#: fairqueue's package logger: the loops' own (``fairqueue.rebalance``,
#: ``fairqueue.outbox``, ``fairqueue.worker``) and what they call (the relay inside
#: ``rebalance_fair``, the broker) all propagate to it.
PACKAGE_LOGGER: Final = "fairqueue"
LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(message)s"


def verbosity_level(verbosity: int) -> int:
    """``--verbosity`` as a log level: 0 warnings, 1 info, 2 and more debug."""
    return {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)


class CommandLogHandler(logging.StreamHandler):
    """Log lines on a command's stream, unstyled: Django's stderr wrapper would colour
    every line as an error on a terminal."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = self.stream
        if not isinstance(stream, OutputWrapper):
            super().emit(record)
            return
        try:
            stream.write(self.format(record), style_func=_plain)
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def _plain(text: str) -> str:
    return text


@contextmanager
def command_logging(verbosity: int, stream: TextIO) -> Iterator[None]:
    """fairqueue's log level from ``--verbosity`` and, when nothing would show its
    records (no handler on the logger or above it), a timestamped handler on ``stream``.

    A ``LOGGING`` that handles fairqueue's records keeps its handlers (only the level
    follows ``--verbosity``, as the option promises). Both are undone on exit, so
    ``call_command`` in a shell or a test leaves logging as it found it.
    """
    package = logging.getLogger(PACKAGE_LOGGER)
    previous_level = package.level
    package.setLevel(verbosity_level(verbosity))
    handler: logging.Handler | None = None
    if not package.hasHandlers():
        handler = CommandLogHandler(stream)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        package.addHandler(handler)
    try:
        yield
    finally:
        if handler is not None:
            package.removeHandler(handler)
        package.setLevel(previous_level)


class LoopCommand(BaseCommand):
    """Base of the long-running commands: logging set up by :func:`command_logging`
    around :meth:`handle_loop`, and (for loops with rounds) ``--once``, ``--interval-ms``
    and ``--queue``.

    Subclasses add their arguments (calling :meth:`add_loop_arguments` for the three) and
    implement :meth:`handle_loop`; errors a user can act on are ``CommandError`` s.
    """

    def add_loop_arguments(
        self, parser: CommandParser, *, verb: str, once_help: str, interval_help: str
    ) -> None:
        """``--once``, ``--interval-ms`` and ``--queue`` (each loop runs over job types:
        ``verb`` says what it does to one)."""
        parser.add_argument("--once", action="store_true", help=once_help)
        parser.add_argument("--interval-ms", type=interval_ms, help=interval_help)
        parser.add_argument(
            "--queue",
            action="append",
            dest="job_types",
            metavar="NAME",
            help=f"Job type to {verb} (repeatable; default: every configured job type).",
        )

    def interval_ms(self, options: Mapping[str, Any], default: int) -> int:
        """``--interval-ms``, or ``default``; checked again when ``call_command`` passed
        it (argparse did not)."""
        value = options.get("interval_ms")
        if value is None:
            return default
        return recheck("--interval-ms", value, interval_ms)

    def handle(self, *args: Any, **options: Any) -> None:
        with command_logging(options["verbosity"], self.stderr):
            self.handle_loop(**options)

    def handle_loop(self, **options: Any) -> None:
        raise NotImplementedError
