"""What an enqueue call may ask for, checked before anything is written: the payload
(JSON as BullMQ stores it, within ``MAX_PAYLOAD_BYTES``), the job options and the keyword
names. Every error names the argument, the value (never the payload's) and what is
allowed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypedDict

from fairqueue.broker import MAX_JOB_ID_LENGTH, RESERVED_JOB_IDS
from fairqueue.conf import get_settings
from fairqueue.enqueue.priority import ResolvedPriority
from fairqueue.exceptions import (
    ConflictingPayloadError,
    InvalidJobOptionError,
    InvalidPayloadError,
    PayloadTooLargeError,
)
from fairqueue.scheduling.levels import (
    MAX_PAYLOAD_DEPTH,
    PAYLOAD_ACCOUNT_KEY,
    PAYLOAD_LEVEL_KEY,
    PAYLOAD_TENANT_KEY,
    PriorityLevel,
    is_strict_utf8,
)

#: The most attempts a job may ask for.
MAX_ATTEMPTS: Final = 1_000
#: The longest delay (and fixed backoff) a job may ask for: a year.
MAX_DELAY_MS: Final = 365 * 24 * 3600 * 1000


_JSON_SCALARS: Final = frozenset({int, float, bool, type(None)})


def check_json_tree(
    data: object, *, text: bool = False, what: str = "payload", depth: int = 1
) -> None:
    """Refuse what ``json.dumps`` would accept but store wrongly, or fail on deep down.

    Non-string keys at any depth (``{1: "a", "1": "b"}`` becomes two ``"1"`` keys) and
    nesting deeper than ``MAX_PAYLOAD_DEPTH`` (instead of a ``RecursionError`` at ~1,000
    levels); with ``text``, also strings and keys that are not valid UTF-8 (a lone
    surrogate: stored, then every page and reader that decodes it fails). Only
    containers are walked (``type`` checks, no ABC lookups on the common types), so the
    walk costs a fraction of the serialisation. Messages never echo the payload; they
    name ``what`` (a task argument's name), found at ``depth`` of the payload.
    """
    leaves = _JSON_SCALARS if text else _JSON_SCALARS | {str}
    stack: list[tuple[object, int]] = [(data, depth)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)
        if kind is str or isinstance(node, str):
            if not is_strict_utf8(node):  # type: ignore[arg-type]
                raise InvalidPayloadError(
                    f"{what} is not allowed: a string at depth {depth} is not valid UTF-8 "
                    "(it holds a lone surrogate)"
                )
            continue
        is_map = kind is dict or (kind not in (list, tuple) and isinstance(node, Mapping))
        if not is_map and not isinstance(node, list | tuple):
            continue  # a scalar, or something json.dumps refuses with its own error
        if depth > MAX_PAYLOAD_DEPTH:
            raise InvalidPayloadError(
                f"{what} is not allowed: it nests deeper than {MAX_PAYLOAD_DEPTH} levels "
                "of dicts and lists (MAX_PAYLOAD_DEPTH)"
            )
        if is_map:
            for key, value in node.items():  # type: ignore[attr-defined]
                if type(key) is not str and not isinstance(key, str):
                    raise InvalidPayloadError(
                        f"{what} is not allowed: a key of type {type(key).__name__} at depth "
                        f"{depth}; every key must be a string (JSON would turn it into a "
                        "string, possibly a duplicate key)"
                    )
                if text and not is_strict_utf8(key):
                    raise InvalidPayloadError(
                        f"{what} is not allowed: a key at depth {depth} is not valid UTF-8 "
                        "(it holds a lone surrogate)"
                    )
                if type(value) not in leaves:
                    stack.append((value, depth + 1))
        else:
            stack.extend((item, depth + 1) for item in node if type(item) not in leaves)  # type: ignore[attr-defined]


def merged_payload(payload: object, resolved: ResolvedPriority) -> tuple[dict[str, Any], str]:
    """The job's data (the payload with its tenant and level, and its account when it has
    one) and its JSON as BullMQ stores it, checked."""
    if not isinstance(payload, Mapping):
        raise InvalidPayloadError(
            f"payload of type {type(payload).__name__} is not allowed: expected a JSON object "
            "(a dict with string keys)"
        )
    check_json_tree(payload)
    account = resolved.account_id
    checked = [(PAYLOAD_TENANT_KEY, resolved.tenant_id), (PAYLOAD_LEVEL_KEY, resolved.level)]
    if account is not None:
        checked.append((PAYLOAD_ACCOUNT_KEY, account))
    for key, value in checked:
        if key in payload and payload[key] != value:
            # Never echo the payload's value: it may be a tenant id.
            raise ConflictingPayloadError(
                f"payload[{key!r}] is not allowed: it differs from the value fairqueue "
                f"resolved; drop the key or pass the same value as the {key} argument"
            )
    level = resolved.level
    # The level and tenant first, so a reader of the stored JSON (bull-board, redis-cli)
    # sees whose job it is at once.
    data = {
        PAYLOAD_LEVEL_KEY: level.value if isinstance(level, PriorityLevel) else level,
        PAYLOAD_TENANT_KEY: resolved.tenant_id,
        **payload,
    }
    if account is not None:
        # Only then: a job without an account keeps its data as it was (its payload's
        # own accountId included).
        data[PAYLOAD_ACCOUNT_KEY] = account
    try:
        # Serialised as bullmq does when it stores the job, so the size below is the
        # size of the job's ``data`` field in Redis.
        serialized = json.dumps(data, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayloadError(
            f"payload is not allowed: it must be JSON-serialisable ({type(exc).__name__}: "
            "only dicts with string keys, lists, strings, finite numbers, booleans and None)"
        ) from None
    if "\\ud" in serialized:
        # JSON escapes every non-ASCII character; only a surrogate escape can hide a
        # lone surrogate, so the exact (slower) walk over the strings runs only then.
        check_json_tree(data, text=True)
    # json.dumps escapes every non-ASCII character (ensure_ascii), so the text is ASCII
    # and its length is its size in bytes: no encoded copy per job.
    size = len(serialized)
    limit = get_settings().max_payload_bytes
    if size > limit:
        # Never echo the payload: it is user data.
        raise PayloadTooLargeError(
            f"payload of {size} bytes is not allowed: its JSON (with tenantId and "
            f"priorityLevel) may be at most {limit} bytes "
            "(FAIRQUEUE['MAX_PAYLOAD_BYTES'] or FAIRQUEUE_MAX_PAYLOAD_BYTES)"
        )
    return data, serialized


#: BullMQ's built-in backoff strategies (what stock Python and Node workers compute).
BACKOFF_TYPES: Final = ("fixed", "exponential")


def parse_backoff(backoff: object, *, argument: str = "backoff") -> dict[str, Any] | None:
    """BullMQ's ``backoff`` job option, validated: ``None`` (retry at once), a delay in ms
    (a fixed backoff, as BullMQ reads a number) or ``{"type": "fixed" | "exponential",
    "delay": ms}``. Returned in the dict form BullMQ stores, so a Node worker reading the
    job computes the same delays as a Python one."""
    if backoff is None:
        return None
    if isinstance(backoff, int) and not isinstance(backoff, bool):
        backoff = {"type": "fixed", "delay": backoff}
    if isinstance(backoff, Mapping) and set(backoff) == {"type", "delay"}:
        kind, delay = backoff["type"], backoff["delay"]
        if (
            kind in BACKOFF_TYPES
            and isinstance(delay, int)
            and not isinstance(delay, bool)
            and 0 <= delay <= MAX_DELAY_MS
        ):
            return {"type": kind, "delay": delay}
    raise InvalidJobOptionError(
        f"{argument}={backoff!r} is not allowed: expected None, a delay in ms (0.."
        f"{MAX_DELAY_MS}) or {{'type': 'fixed' | 'exponential', 'delay': ms}}"[:400]
    )


#: The largest ``cost=`` (seconds of worker time a job is expected to take): a day.
MAX_COST_S: Final = 86_400


def parse_cost(cost: object) -> int | None:
    """``cost=``, the caller's estimate of a job's worker time in seconds (a positive
    number), as the whole milliseconds the add script takes; ``None``: the flow's
    measured estimate."""
    if cost is None:
        return None
    if (
        isinstance(cost, int | float)
        and not isinstance(cost, bool)
        and math.isfinite(cost)
        and 0 < cost <= MAX_COST_S
    ):
        return max(1, round(cost * 1000))
    raise InvalidJobOptionError(
        f"cost={cost!r} is not allowed: expected None or a number of seconds in (0, {MAX_COST_S}]"[
            :300
        ]
    )


def check_options(job_id: object, delay_ms: object, attempts: object) -> None:
    """``job_id``, ``delay_ms`` and ``attempts``, checked (BullMQ takes them as given)."""
    if job_id is not None and (
        not isinstance(job_id, str)
        or not job_id
        or len(job_id) > MAX_JOB_ID_LENGTH
        or job_id.isdigit()
        or ":" in job_id
    ):
        raise InvalidJobOptionError(
            f"job_id={job_id!r} is not allowed: expected None or a non-empty string of at "
            f"most {MAX_JOB_ID_LENGTH} characters, not all digits and without ':' "
            "(BullMQ reserves integer ids for its own)"
        )
    if job_id is not None and not is_strict_utf8(job_id):
        raise InvalidJobOptionError(
            f"job_id of {len(job_id)} characters is not allowed: expected valid UTF-8 text "
            "(it holds a lone surrogate)"
        )
    if job_id in RESERVED_JOB_IDS:
        # A job's hash is ``prefix:queue:<id>``, so these ids would overwrite (or be)
        # BullMQ's own keys of the queue: ``wait`` stops every worker (WRONGTYPE),
        # ``meta`` drops the job, ``completed`` strands later jobs.
        raise InvalidJobOptionError(
            f"job_id={job_id!r} is not allowed: it names one of the queue's own Redis keys; "
            f"reserved ids are {', '.join(sorted(RESERVED_JOB_IDS))}"
        )
    for name, value, low, high in (
        ("delay_ms", delay_ms, 0, MAX_DELAY_MS),
        ("attempts", attempts, 1, MAX_ATTEMPTS),
    ):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
        ):
            raise InvalidJobOptionError(
                f"{name}={value!r} is not allowed: expected None or an integer in {low}..{high}"
            )


class EnqueueOptions(TypedDict, total=False):
    """Keyword options of every enqueue function (see :func:`enqueue_job`)."""

    tenant_id: str | None
    internal: bool
    priority: int | None
    priority_level: str | PriorityLevel | None
    priority_override: str | PriorityLevel | None
    tenant_weight: int | None
    account_id: str | None
    job_id: str | None
    delay_ms: int | None
    attempts: int | None
    backoff: int | Mapping[str, Any] | None
    cost: float | None
    source: str | None
    actor: object


def check_keywords(function: str, options: Mapping[str, object], extra: Sequence[str] = ()) -> None:
    """Name an unknown keyword (``delay=`` for ``delay_ms=``) and the allowed ones
    (``extra``: the function's own keyword-only arguments), instead of a bare
    ``TypeError`` from a private function."""
    unknown = sorted(set(options) - set(EnqueueOptions.__annotations__))
    if unknown:
        allowed = sorted([*EnqueueOptions.__annotations__, *extra])
        raise InvalidJobOptionError(
            f"{function}() got unknown keyword {unknown[0]}={options[unknown[0]]!r}"[:300]
            + f": allowed keywords are {', '.join(allowed)}"
        )
