"""Typed argparse validators shared by fairqueue's commands.

Each names the value and the allowed range, so a bad ``--interval-ms 0`` reads
"argument --interval-ms: '0' is not allowed: expected an integer in 1..3600000".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


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
