"""What every part of the broker shares: fairqueue's priority bands and small helpers."""

from __future__ import annotations

import json
import re
from typing import Any, Final, TypeVar, overload

import redis
from bullmq.queue_keys import QueueKeys
from redis.exceptions import ClusterDownError, NoPermissionError, RedisClusterException

from fairqueue.exceptions import BrokerError, BrokerRejectedError, BrokerUnavailableError
from fairqueue.redis_target import RedisTarget

T = TypeVar("T")

#: BullMQ's largest priority (2**21 - 1).
MAX_PRIORITY: Final = 2_097_151
#: First priority fairqueue places jobs at. Other producers' small priorities (the
#: JOB_PRIORITY_* constants 1, 3, 5, 10...) lie below and run first until a pass adopts them.
TAG_FLOOR: Final = 1_024
#: Where a job waits when fair_clock has no room for it (and where delayed jobs go until
#: BullMQ promotes them): behind everything, FIFO. The pass adopts them.
BACK_OF_LINE: Final = MAX_PRIORITY
#: When held jobs (a tenant at its limits) are "due" in BullMQ's delayed set: the last
#: second of the year 9999, so BullMQ tools show them as delayed and no stock worker ever
#: promotes them; only ``release_held.lua`` moves them on.
HELD_UNTIL_MS: Final = 253_402_300_799_000
#: The backoff a job of a limited or paused tenant carries once released (``fixed``, ten
#: years; its own backoff is kept in its opts as ``fqBackoff``): a worker's failed attempt
#: with attempts left then goes to BullMQ's delayed set, out of every worker's reach,
#: instead of straight back where an idle worker takes it at once, and the release step
#: holds it again, due after its own backoff, so every attempt starts through the
#: tenant's limits (``lua/include/tenant_limits.lua``). Its delayed score stays below 2**53.
RETRY_HELD_MS: Final = 315_360_000_000
#: Score units per unit of virtual time: a job's score is
#: ``TAG_FLOOR * 2**32 + floor((tag - base) * TAG_RESOLUTION) * 4 + level rank``, so the
#: fair order keeps 1/1024 of a tag (a lone low tenant's job is 12) at any backlog and
#: the scores run out only after about 10**11 jobs (see ``lua/include/fair_clock.lua``).
TAG_RESOLUTION: Final = 1_024
#: A pass starts a paged rebase once the virtual time is this far (in tag units) above
#: the base, about halfway to the cap, so scores never reach it on a queue that never
#: empties.
REBASE_THRESHOLD: Final = 1 << 40
#: Tag units a rebase keeps below the virtual time (retried jobs come back a little
#: below it, at the score they had).
REBASE_MARGIN: Final = 64

#: A prioritized job's score is ``priority * SCORE_BASE + counter`` (BullMQ's layout).
SCORE_BASE: Final = 1 << 32
#: The fields of a job's hash that the pass and the dashboard read of every job.
JOB_FIELDS: Final = ("name", "data", "timestamp", "priority", "atm", "opts")
#: The longest job id an enqueue or a dashboard lookup accepts.
MAX_JOB_ID_LENGTH: Final = 255


def unavailable(reason: str, target: RedisTarget | None = None) -> BrokerUnavailableError:
    """ "Redis is unavailable", naming where it was looked for (``host:port/db``, never a
    password) and the setting that said so, so the message alone says what to fix."""
    if target is None:
        return BrokerUnavailableError(f"Redis is unavailable ({reason})")
    return BrokerUnavailableError(f"Redis is unavailable at {target.described}: {reason}")


#: Errors that mean Redis was not reached or did not answer (redis-py's connection and
#: timeout errors, socket errors; on a cluster also CLUSTERDOWN / MASTERDOWN replies and
#: redis-py's cluster errors, such as no startup node reachable or a slot no master
#: serves, which are not ``RedisError``); every other ``RedisError`` is an error reply.
UNREACHABLE_ERRORS: Final = (
    redis.ConnectionError,
    redis.TimeoutError,
    OSError,
    ClusterDownError,
    RedisClusterException,
)
#: Everything :func:`broker_error` translates.
REDIS_ERRORS: Final = (redis.RedisError, OSError, RedisClusterException)


def broker_error(exc: BaseException, target: RedisTarget | None = None) -> BrokerError:
    """fairqueue's error for a redis-py (or socket) error, raised ``from`` it.

    The message carries the Redis error class and, for an error reply, its code word
    (``WRONGTYPE``, ``ERR``, ``BUSY``...): never the reply's text, which may quote a
    key (a job id) or a script line, and never the URL; "unavailable" names ``target``'s
    ``host:port/db`` and the setting it came from (no password). An ACL refusal also names the
    refused command (a command name is no data) and what to grant, because "no
    permission" alone leaves an operator guessing which of dozens of commands it was.
    """
    if isinstance(exc, UNREACHABLE_ERRORS):
        return unavailable(type(exc).__name__, target)
    permission = _permission_message(exc)
    if permission is not None:
        return BrokerRejectedError(permission, redis_error="NoPermissionError")
    name = type(exc).__name__
    code = str(exc).split(" ", 1)[0]
    shown = f"{name} {code}" if code.isalpha() and code.isupper() and code != name else name
    return BrokerRejectedError(f"Redis refused the command ({shown})", redis_error=name)


#: The command a NOPERM reply names (``this user has no permissions to run the 'zadd'
#: command``); subcommands read ``'client|setname'``.
_NOPERM_COMMAND: Final = re.compile(r"permissions to run the '([A-Za-z0-9_|.-]{1,64})' command")
#: How Redis words an ACL refusal of a command a Lua script runs (a plain error reply).
_SCRIPT_NOPERM: Final = "The user executing the script can't"


def _permission_message(exc: BaseException) -> str | None:
    """The message of an ACL refusal (``NOPERM``), or ``None`` for any other error."""
    text = str(exc)
    in_script = text.startswith(_SCRIPT_NOPERM)
    if not isinstance(exc, NoPermissionError) and not in_script:
        return None
    found = _NOPERM_COMMAND.search(text)
    if found is not None:
        command = found.group(1)
        return (
            f"Redis refused the command (NoPermissionError NOPERM): the Redis user may not "
            f"run {command.upper().replace('|', ' ')}; grant it (ACL SETUSER <user> "
            f"+{command.lower()}) or the command categories fairqueue needs "
            "(docs/operations.md, Redis ACL)"
        )
    if "key" in text:
        return (
            "Redis refused the command (NoPermissionError NOPERM): the Redis user may not "
            "access one of fairqueue's keys; grant the prefix's keys (ACL SETUSER <user> "
            "'~<PREFIX>:*') (docs/operations.md, Redis ACL)"
        )
    if in_script:
        return (
            "Redis refused the command (NoPermissionError NOPERM): the Redis user may not "
            "run a command inside one of fairqueue's or BullMQ's Lua scripts; ACL LOG on "
            "the server names it: grant it (docs/operations.md, Redis ACL)"
        )
    return (
        "Redis refused the command (NoPermissionError NOPERM): the Redis user lacks a "
        "permission; ACL LOG on the server names it (docs/operations.md, Redis ACL)"
    )


def permission_error(exc: BaseException) -> BrokerRejectedError | None:
    """fairqueue's error for an ACL refusal (``NOPERM``, raw or already translated), or
    ``None`` for any other error: what a burst worker stops on (no retry can help)."""
    if isinstance(exc, BrokerRejectedError):
        return exc if exc.redis_error == "NoPermissionError" else None
    message = _permission_message(exc)
    return (
        None if message is None else BrokerRejectedError(message, redis_error="NoPermissionError")
    )


#: Redis errors that refuse every write of the server, whatever the job: out of memory
#: under ``noeviction``, a read-only replica, an ACL refusal, a master without its
#: replicas or a failed save (``MISCONF``), a script running too long (``BUSY``).
#: Retrying the next job is pointless until the condition ends.
SERVER_REFUSALS: Final = frozenset(
    {"OutOfMemoryError", "ReadOnlyError", "NoPermissionError", "MasterDownError"}
)
_SERVER_REFUSAL_CODES: Final = frozenset(
    {"OOM", "READONLY", "NOPERM", "MISCONF", "NOREPLICAS", "BUSY"}
)


def refuses_every_write(exc: BaseException) -> bool:
    """Whether ``exc`` (a :class:`BrokerRejectedError` or the redis-py error behind it)
    says the server refuses writes in general rather than this one command's data."""
    cause = exc.__cause__ if isinstance(exc, BrokerError) and exc.__cause__ else exc
    if isinstance(exc, BrokerRejectedError) and exc.redis_error in SERVER_REFUSALS:
        return True
    if type(cause).__name__ in SERVER_REFUSALS or _permission_message(cause) is not None:
        return True
    return str(cause).split(" ", 1)[0] in _SERVER_REFUSAL_CODES


def parse_job_data(raw: str | None) -> dict[str, Any] | None:
    """Decode a job's ``data`` field; ``None`` when it is not a JSON object.

    A lone surrogate escape (``"\\ud800"``, which JSON allows and another producer or an
    older fairqueue may have written) becomes ``"?"``, so what is read always encodes as
    UTF-8: a page that shows it, and a script that is passed it, cannot fail on it.
    """
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (TypeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    if "\\u" in raw:  # only escapes can make a lone surrogate
        try:
            data = _replace_lone_surrogates(data)
        except RecursionError:
            return None
    return data


def as_text(value: str | bytes) -> str:
    """A reply as text, whether the client decodes replies (``str``) or not (``bytes``)."""
    return value.decode() if isinstance(value, bytes) else value


def tenant_in_data(data: str | bytes | None) -> str | None:
    """The ``tenantId`` a job's raw ``data`` field names; ``None`` for none (or not a
    non-empty string)."""
    parsed = parse_job_data(None if data is None else as_text(data))
    if not isinstance(parsed, dict):
        return None
    tenant = parsed.get("tenantId")
    return tenant if isinstance(tenant, str) and tenant else None


def _replace_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_replace_lone_surrogates(k): _replace_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_lone_surrogates(item) for item in value]
    return value


@overload
def int_or(value: Any, default: int) -> int: ...
@overload
def int_or(value: Any, default: None) -> int | None: ...
def int_or(value: Any, default: int | None) -> int | None:
    """``value`` as an ``int`` (a Redis reply, a BullMQ attribute), or ``default``."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


#: Job ids that are a queue's own key suffixes: a job's hash is ``prefix:queue:<id>``, so
#: such an id would write over (or into) BullMQ's ``wait`` list, ``meta`` hash, ... or
#: fairqueue's ``fq`` keys. BullMQ's key list (from the installed package) plus the
#: suffixes its Lua scripts use without listing them, and fairqueue's own.
RESERVED_JOB_IDS: Final = frozenset(
    {name for name in QueueKeys().getKeys("q") if name} | {"metrics", "dn", "lock", "logs", "fq"}
)

#: fairqueue's own keys beside a queue's (see ``lua/include/fair_clock.lua``): the clock state,
#: the flows with work and their counted weights, the ready-time index (job ids by the
#: second they became ready) and the delayed jobs' meta.
FAIR_KEYS: Final = ("state", "flows", "fweights", "ready", "jobs")


def fair_key(prefix: str, queue: str, suffix: str) -> str:
    """A key fairqueue owns beside ``queue``'s BullMQ keys."""
    return f"{prefix}:{queue}:fq:{suffix}"


def fair_keys(prefix: str, queue: str) -> list[str]:
    """:data:`FAIR_KEYS` of ``queue``, in that order (the scripts take them so)."""
    return [fair_key(prefix, queue, suffix) for suffix in FAIR_KEYS]


def limits_key(prefix: str, queue: str) -> str:
    """The queue's limits hash; the other limit keys hang beside it (``tenant_limits.lua``)."""
    return fair_key(prefix, queue, "lim")
