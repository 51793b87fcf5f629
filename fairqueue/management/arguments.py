"""Typed argparse validators shared by fairqueue's commands.

Each names the value and the allowed range, so a bad ``--interval-ms 0`` reads
"argument --interval-ms: '0' is not allowed: expected an integer in 1..3600000".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.core.management.base import CommandError

from fairqueue.conf import get_settings

T = TypeVar("T")


def int_in_range(low: int, high: int, what: str = "an integer") -> Callable[[str], int]:
    """An argparse ``type=`` that accepts integers in ``low..high``."""
    return number_in_range(low, high, what, kind=int)


def number_in_range(
    low: float, high: float, what: str, *, kind: Callable[[str], Any] = float
) -> Callable[[str], Any]:
    """An argparse ``type=`` that accepts numbers (``kind``) in ``low..high``."""

    def parse(value: str) -> Any:
        try:
            parsed = kind(str(value).strip())
        except ValueError:
            parsed = None
        if parsed is None or not low <= parsed <= high:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not allowed: expected {what} in {low}..{high}"
            )
        return parsed

    return parse


#: ``--interval-ms`` of the loops: 1 ms to an hour.
interval_ms = int_in_range(1, 3_600_000)
#: ``--metrics-port`` of the long-running commands.
port = int_in_range(1, 65_535, "a TCP port")


def recheck(option: str, value: object, parse: Callable[[Any], T]) -> T:
    """``value`` through ``parse`` (an argparse ``type=``) again, failing as argparse
    would: ``call_command(name, interval_ms=0)`` bypasses argparse's type check.

    Raises:
        CommandError: "argument --interval-ms: 0 is not allowed: expected ...".
    """
    try:
        return parse(value)
    except argparse.ArgumentTypeError as exc:
        raise CommandError(f"argument {option}: {exc}") from None


def configured_job_types(job_types: Sequence[str] | None) -> list[str]:
    """``--queue`` values (default: every configured job type), each checked against
    ``FAIRQUEUE['QUEUES']``."""
    queues = get_settings().queues
    chosen = list(job_types or queues)
    unknown = [job_type for job_type in chosen if job_type not in queues]
    if unknown:
        raise CommandError(
            f"--queue {unknown[0]!r} is not allowed: expected one of {sorted(queues)}"
        )
    return chosen
