"""What every part of the broker shares: fairqueue's priority bands and small helpers."""

from __future__ import annotations

import json
from typing import Any, Final, TypeVar

from ..exceptions import BrokerUnavailableError
from ..levels import PriorityLevel

T = TypeVar("T")

#: BullMQ's largest priority (2**21 - 1).
MAX_PRIORITY: Final = 2_097_151
#: First priority of the tag band; the window band lies below it.
WINDOW_BAND_TOP: Final = 1 << 19
#: Where a job goes when it cannot be placed by tag (delayed jobs, place failures):
#: behind everything, FIFO among equals. The next pass (or the wait bound) places it.
BACK_OF_LINE: Final = MAX_PRIORITY
#: Enqueue-time tag step per level: 48 / weight, so 4:3:2:1 service in the tag band.
#: Priorities are ``tag + offset``; tags stay multiples of 4 so levels never collide
#: and equal tags go to the higher weight first (SPEC decision 7's tie rule).
TAG_STEP: Final = {
    PriorityLevel.CRITICAL: 12,
    PriorityLevel.HIGH: 16,
    PriorityLevel.NORMAL: 24,
    PriorityLevel.LOW: 48,
}
TAG_OFFSET: Final = {
    PriorityLevel.CRITICAL: 0,
    PriorityLevel.HIGH: 1,
    PriorityLevel.NORMAL: 2,
    PriorityLevel.LOW: 3,
}
#: When the tag band's head passes this, the next pass shifts the band back down.
REBASE_THRESHOLD: Final = WINDOW_BAND_TOP + (1 << 20)

_SCORE_BASE: Final = 1 << 32
_JOB_FIELDS: Final = ("name", "data", "timestamp", "priority", "atm", "opts")


def _unavailable(exc: BaseException) -> BrokerUnavailableError:
    return BrokerUnavailableError(f"Redis is unavailable ({type(exc).__name__})")


def parse_job_data(raw: str | None) -> dict[str, Any] | None:
    """Decode a job's ``data`` field; ``None`` when it is not a JSON object."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _int_or(value: Any, default: int | None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
