"""fairqueue's Lua scripts: read from ``lua/`` in this package, composed around BullMQ's.

Each script lives in its own ``.lua`` file under ``fairqueue/broker/lua/`` (shipped as
package data) and says in its header which keys it touches: the scripts fairqueue runs
in ``lua/``, the libraries they share in ``lua/include/`` (pulled in with a
``--- @include name`` line, BullMQ's own convention), and the halves wrapped around
BullMQ's scripts in ``lua/wrap/``. ``{{NAME}}`` stands for a constant filled in from
:mod:`.common`, so Python and Lua share one definition.

A script's arguments have names, declared once in its Lua (its wrapped head's, for a
wrapped script) by ``--- @argv`` lines: the names in ARGV's order, an optional one ending
in ``?`` (only at the end, omitted from the end), the last one ending in ``...`` the rest
of ARGV (a list: records, pairs, sections). The Lua reads ``ARGV.name`` (rendered
``ARGV[i]``); of the rest, ``ARGV.rest[k]`` (its k-th value, from 1) and ``#ARGV.rest``
(how many). Python passes them by name (:meth:`Script.args`, ``conn.script(s)(keys,
name=...)``): an argument missing, unknown or ``None`` is a ``TypeError`` at the call,
not a nil in Lua.

Scripts that write BullMQ's structures wrap BullMQ's own Lua, read from the installed
bullmq package with ``bullmq.redis_connection.loadScript``: a fairqueue head piece
(``lua/wrap/<name>.head.lua``), BullMQ's script (inside a Lua function), a fairqueue tail
piece that calls it (``lua/wrap/<name>.tail.lua``). So the
job hash, the prioritized set entry, the markers and the events are exactly what BullMQ
writes; only the priority is fairqueue's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any

from bullmq.redis_connection import loadScript
from redis.exceptions import NoScriptError

from fairqueue.broker.common import (
    HELD_UNTIL_MS,
    MAX_PRIORITY,
    RETRY_HELD_MS,
    TAG_FLOOR,
    TAG_RESOLUTION,
)
from fairqueue.scheduling.calibration import ERROR_BINS, WAIT_SCALE_FIELD
from fairqueue.scheduling.limits import CATCHUP_AHEAD, TAKEABLE_CAP
from fairqueue.scheduling.order import (
    COST_DEAD_BAND,
    FRONTIER_SCAN,
    MAX_COST_TURNS,
    MIN_COST_TURNS,
    TAG_SCALE,
)
from fairqueue.scheduling.pace import ASKING_LINE_TAIL, ASKING_SCAN
from fairqueue.scheduling.shares import WAIT_EDGES

#: Flows without work that one script call may retire, however many jobs it places
#: (bounded work per call; the rest go on later calls, meanwhile counted as if they still
#: had work).
EXPIRE_PER_CALL = 64
#: A flow's line (its placed ids, for an overdue job to take its flow's first place):
#: how many of its first ids an overdue job looks at, how often ids of jobs that left are
#: trimmed off its front (every so many pushed), and how long a line nothing was added to
#: is kept.
LINE_SCAN = 16
LINE_TRIM_EVERY = 64
LINE_TTL_MS = 3_600_000
#: The loop's release step (``lua/release_held.lua``) visits only the tenants due
#: (``L:due``): at most RELEASE_VISITS a call, and no more once the visits have walked
#: RELEASE_VISIT_WORK released jobs; it reads at most RELEASE_EVENTS of BullMQ's events
#: (each of a released job makes its tenant due) and makes RELEASE_SWEEP_PAGE tenants due
#: per call of a sweep. A tenant that waits for an event is visited at least every
#: RELEASE_BACKSTOP_MS anyway (a job cleaned by ``Queue.clean`` sends none).
RELEASE_VISITS = 64
#: The index walk compacts a second's list of ready ids (drops the blanked ones) only
#: while it holds at most this many entries: LREM moves memory for each blank it drops.
COMPACT_MAX = 2_000
RELEASE_VISIT_WORK = 1_000
RELEASE_EVENTS = 250
RELEASE_SWEEP_PAGE = 100
#: Jobs of BullMQ's wait list a release call looks at (from its tail, where workers take
#: from) for held jobs promoted there by hand (``Queue.promoteJobs``).
RELEASE_WAIT_PAGE = 64
#: ...and the largest payload it reads there of a job fairqueue did not hold or release
#: (``Queue.retryJobs`` puts failed jobs there): a larger one is held by the adoption.
RELEASE_WAIT_PAYLOAD = 1_048_576
RELEASE_BACKSTOP_MS = 30_000
#: How long one release call may hold Redis, about (us): past it, no further tenant is
#: visited or job placed, and the next call goes on (the loop calls again at once while
#: a call stops short), but not before RELEASE_SURE_VISITS visits and RELEASE_SURE_JOBS
#: jobs released. Placing a job costs tens of us at a million waiting jobs.
RELEASE_CALL_US = 2_000
RELEASE_SURE_VISITS = 8
RELEASE_SURE_JOBS = 16
#: How soon the loop's next call comes while tenants are due (ms): a call cut short by
#: RELEASE_CALL_US leaves Redis to other clients at least this long before the next.
RELEASE_AGAIN_MS = 5
#: A pause's scan of the prioritized set starts a page this many members before where it
#: stopped within a run of tied scores, in case some of them left between two calls.
TIE_SLACK = 500
#: The most held jobs a status read looks through for one its tenant's held index lacks
#: (held before the index existed: at the front of the list), so the read stays bounded.
HELD_PLACE_SCAN = 1_000
#: How long past its due time a delayed job stays counted in its flow's index of delayed
#: jobs not placed yet, if the pass never placed it (it was removed): then it goes.
DELAYED_KEEP_MS = 300_000
#: The jobs an estimate places one by one beyond the count asked for (what runs ahead of
#: a job without being on the clock yet: its flow's delayed jobs and outbox rows); past
#: them the flow's pace is carried on, so the read stays bounded whatever is pending.
ESTIMATE_PENDING_STEPS = 128

_CONSTANTS = {
    "FLOOR": TAG_FLOOR,
    "CAP": MAX_PRIORITY,
    "CAP_SCORE": MAX_PRIORITY << 32,
    "SCALE": TAG_SCALE,
    "SUB": TAG_RESOLUTION,
    "EXPIRE_PER_CALL": EXPIRE_PER_CALL,
    "FRONTIER_SCAN": FRONTIER_SCAN,
    "LINE_SCAN": LINE_SCAN,
    "LINE_TRIM_EVERY": LINE_TRIM_EVERY,
    "LINE_TTL_MS": LINE_TTL_MS,
    "MIN_COST": repr(MIN_COST_TURNS),
    "MAX_COST": repr(MAX_COST_TURNS),
    "COST_DEAD_BAND": repr(COST_DEAD_BAND),
    "HELD_MS": HELD_UNTIL_MS,
    "RETRY_HELD_MS": RETRY_HELD_MS,
    "CATCHUP_AHEAD": CATCHUP_AHEAD,
    "TAKEABLE_CAP": TAKEABLE_CAP,
    "HELD_PLACE_SCAN": HELD_PLACE_SCAN,
    "DELAYED_KEEP_MS": DELAYED_KEEP_MS,
    "ESTIMATE_PENDING_STEPS": ESTIMATE_PENDING_STEPS,
    "RELEASE_VISITS": RELEASE_VISITS,
    "COMPACT_MAX": COMPACT_MAX,
    "RELEASE_VISIT_WORK": RELEASE_VISIT_WORK,
    "RELEASE_EVENTS": RELEASE_EVENTS,
    "RELEASE_SWEEP_PAGE": RELEASE_SWEEP_PAGE,
    "RELEASE_WAIT_PAGE": RELEASE_WAIT_PAGE,
    "RELEASE_WAIT_PAYLOAD": RELEASE_WAIT_PAYLOAD,
    "RELEASE_BACKSTOP_MS": RELEASE_BACKSTOP_MS,
    "RELEASE_CALL_US": RELEASE_CALL_US,
    "RELEASE_SURE_VISITS": RELEASE_SURE_VISITS,
    "RELEASE_SURE_JOBS": RELEASE_SURE_JOBS,
    "RELEASE_AGAIN_MS": RELEASE_AGAIN_MS,
    "TIE_SLACK": TIE_SLACK,
    "ERROR_BINS": ERROR_BINS,
    "WAIT_SCALE_FIELD": f"'{WAIT_SCALE_FIELD}'",
    "ASKING_SCAN": ASKING_SCAN,
    "ASKING_LINE_TAIL": ASKING_LINE_TAIL,
    "WAIT_EDGES": "{" + ", ".join(str(edge) for edge in WAIT_EDGES) + "}",
}
_INCLUDE = re.compile(r"^--- @include (\w+)$", re.MULTILINE)
_ARGV_DECLARED = re.compile(r"^--- @argv (.+)$", re.MULTILINE)
_ARGV_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: A named argument in a script's Lua: ``ARGV.name``, ``ARGV.rest[``, ``#ARGV.rest``.
_ARGV_USE = re.compile(r"(#?)\bARGV\.(\w+)(\[?)")
_CONSTANT = re.compile(r"\{\{(\w+)\}\}")
#: One of fairqueue's shared functions, from its definition to the ``end`` at the margin
#: that closes it (the wrappers of BullMQ's scripts, ``fqBullmq*``, hold BullMQ's own
#: margin-level ``end`` lines and are never candidates).
_SHARED_FUNCTION = re.compile(
    r"^local function (fq(?!Bullmq)\w+)\(.*?^end\n", re.MULTILINE | re.DOTALL
)
#: One of fairqueue's values defined on one line without a call (a constant or a table:
#: dropping it drops no command).
_SHARED_VALUE = re.compile(r"^local (fq\w+) = [^\n(]*\n", re.MULTILINE)
#: A Lua comment, a block or to the end of its line (no shipped script has ``--`` in a
#: string literal, which this would cut: test_scripts holds that).
_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Argv:
    """A script's arguments, as its ``--- @argv`` lines name them: ``names`` in ARGV's
    order (the first ``required`` of them required, the others optional), then ``rest``
    (``None``: none), every value from ARGV's ``len(names) + 1``-th on."""

    script: str
    names: tuple[str, ...] = ()
    required: int = 0
    rest: str | None = None

    @classmethod
    def declared(cls, script: str, text: str) -> Argv:
        """The arguments ``text`` (a script's Lua) declares."""
        words = [word for line in _ARGV_DECLARED.findall(text) for word in line.split()]
        names: list[str] = []
        required, rest = 0, None
        for word in words:
            name = word.removesuffix("...").removesuffix("?")
            if not _ARGV_NAME.match(name) or name in names or name == rest or rest:
                raise ValueError(f"{script}: bad @argv name {word!r} in {words}")
            if word.endswith("..."):
                if required < len(names):
                    raise ValueError(f"{script}: @argv has optional names and a rest")
                rest = name
                continue
            if not word.endswith("?"):
                if required < len(names):
                    raise ValueError(f"{script}: @argv {word!r} follows an optional name")
                required += 1
            names.append(name)
        return cls(script, tuple(names), required, rest)

    def render(self, text: str) -> str:
        """``text`` with its named arguments as ARGV's positions; a name not declared, or
        a rest read as one value (or a value as a rest), is refused."""

        def position(match: re.Match[str]) -> str:
            count, name, index = match.groups()
            if name == self.rest and (count or index) and not (count and index):
                offset = len(self.names)
                if not offset:
                    return "#ARGV" if count else "ARGV["
                return f"(#ARGV - {offset})" if count else f"ARGV[{offset} + "
            if name in self.names and not count and not index:
                return f"ARGV[{self.names.index(name) + 1}]"
            raise ValueError(
                f"{self.script}: {match.group(0)!r} reads none of its arguments {self} "
                "(ARGV.name, of the rest ARGV.rest[k] and #ARGV.rest)"
            )

        return _ARGV_USE.sub(position, text)

    def values(self, given: Mapping[str, Any]) -> list[Any]:
        """ARGV for ``given`` (name -> value; the rest a sequence), in the declared order.

        Raises:
            TypeError: an argument missing or unknown, an optional one given without one
                before it (it would take that one's place), a value ``None`` (Lua would
                read nil) or a rest that is not a sequence of values.
        """
        present = [name in given for name in self.names]
        leading = present.index(False) if False in present else len(present)
        if (
            any(name not in self.names and name != self.rest for name in given)
            or leading < self.required
            or any(present[leading:])
            or (self.rest is not None and self.rest not in given)
        ):
            raise TypeError(f"{self.script} takes {self}, was given ({', '.join(given)})")
        for name, value in given.items():
            if value is None:
                raise TypeError(f"{self.script}: argument {name} is None (Lua would read nil)")
        values = [given[name] for name in self.names[:leading]]
        if self.rest is not None:
            rest = given[self.rest]
            if isinstance(rest, str | bytes) or not isinstance(rest, Sequence):
                raise TypeError(f"{self.script}: argument {self.rest}... is {rest!r}, not a list")
            values += rest
        return values

    def __str__(self) -> str:
        names = [*self.names[: self.required], *(f"{n}?" for n in self.names[self.required :])]
        return "(" + ", ".join([*names, *([f"{self.rest}..."] if self.rest else [])]) + ")"


@dataclass(frozen=True, slots=True)
class Script:
    """A script's source, its arguments and the SHA1 Redis knows it by (for EVALSHA),
    hashed once."""

    name: str
    source: str
    argv: Argv
    sha: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", script_sha(self.source))

    def args(self, **given: Any) -> list[Any]:
        """ARGV for the arguments ``given`` by name (:meth:`Argv.values`)."""
        return self.argv.values(given)


def script_sha(source: str) -> str:
    """The SHA1 Redis knows ``source`` by."""
    return hashlib.sha1(source.encode()).hexdigest()  # noqa: S324


async def call_script(
    client: Any, sha: str, source: str, keys: Sequence[Any], args: Sequence[Any], **options: Any
) -> Any:
    """Run a script by its SHA1 (EVALSHA), the one way fairqueue runs its scripts: where
    Redis lost its script cache (a restart, ``SCRIPT FLUSH``: nothing ran), load the
    source and run it again. ``options`` go to redis-py (``NEVER_DECODE``: a reply in
    bytes)."""
    command = ("EVALSHA", sha, len(keys), *keys, *args)
    try:
        return await client.execute_command(*command, **options)
    except NoScriptError:
        await client.script_load(source)
        return await client.execute_command(*command, **options)


async def call_script_many(
    client: Any, script: Script, calls: Sequence[tuple[Sequence[Any], dict[str, Any]]]
) -> list[Any]:
    """``script`` once per ``(keys, arguments by name)`` of ``calls``, in one pipeline:
    one round trip, each call atomic on its own (other clients' commands run between
    them), loading the script first where Redis lost it (:func:`call_script`)."""
    for attempt in (1, 2):
        async with client.pipeline(transaction=False) as pipe:
            for keys, named in calls:
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *script.args(**named))
            replies = await pipe.execute(raise_on_error=False)
        if attempt == 2 or not any(isinstance(reply, NoScriptError) for reply in replies):
            break
        await client.script_load(script.source)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return list(replies)


def call_script_sync(
    client: Any, sha: str, source: str, keys: Sequence[Any], args: Sequence[Any]
) -> Any:
    """:func:`call_script` with a blocking client (the enqueue path of sync callers)."""
    command = ("EVALSHA", sha, len(keys), *keys, *args)
    try:
        return client.execute_command(*command)
    except NoScriptError:
        client.script_load(source)
        return client.execute_command(*command)


def load_lua(name: str) -> str:
    """The text of ``lua/<name>.lua`` (``name`` may start with its folder,
    ``wrap/add_jobs.head``), each ``--- @include x`` replaced by ``lua/include/x.lua`` and
    constants filled in."""
    return _CONSTANT.sub(lambda match: str(_CONSTANTS[match.group(1)]), _included(name, set()))


def _included(name: str, done: set[str]) -> str:
    """``lua/<name>.lua`` with its includes in, each include once per script: the first
    ``--- @include x`` of an ``x`` brings its text, a later one (an include that another
    include also pulls in, such as ``wire``) nothing, as each would define its functions
    again."""
    path = files(__package__).joinpath("lua", *f"{name}.lua".split("/"))

    def include(match: re.Match[str]) -> str:
        if match.group(1) in done:
            return ""
        done.add(match.group(1))
        return _included(f"include/{match.group(1)}", done)

    return _INCLUDE.sub(include, path.read_text(encoding="utf-8"))


def without_unused(source: str) -> str:
    """``source`` less the included functions nothing in it calls.

    Redis runs a script's whole body on every call, so each ``local function`` and table
    of an include is made again (an allocation the garbage collector then sweeps) each
    time, used or not: the add script paid for helpers of the pass and of tenant_limits
    on every job, and history_commit for the whole fair clock. A function, or a value
    defined on one line, is dropped when its name appears nowhere but its definition
    (comments aside), until none is left to drop.
    """
    while True:
        code = _COMMENT.sub("", source)
        unused = [
            match
            for pattern in (_SHARED_FUNCTION, _SHARED_VALUE)
            for match in pattern.finditer(source)
            if len(re.findall(rf"\b{match.group(1)}\b", code)) == 1
        ]
        if not unused:
            return source
        for match in sorted(unused, key=lambda match: match.start(), reverse=True):
            source = source[: match.start()] + source[match.end() :]


def bullmq_source(bullmq_script: str, edit: tuple[str, str] | None = None) -> str:
    """BullMQ's script as the installed bullmq ships it, with fairqueue's one pinned
    text edit (if any) applied: refused, not silently skipped, where the edit is absent."""
    bullmq = loadScript(bullmq_script)
    if edit is not None:
        old, new = edit
        if bullmq.count(old) != 1:  # the pinned range has it once (test_broker_contract)
            raise RuntimeError(f"{bullmq_script} of this bullmq version lacks {old!r}")
        bullmq = bullmq.replace(old, new)
    return bullmq


def _wrapping(name: str, bullmq_script: str, edit: tuple[str, str] | None = None) -> Script:
    """fairqueue's head, BullMQ's script, fairqueue's tail; the head declares the
    arguments (BullMQ's, where fairqueue passes them, keep BullMQ's positions)."""
    head, tail = load_lua(f"wrap/{name}.head"), load_lua(f"wrap/{name}.tail")
    argv = Argv.declared(name, head)
    source = argv.render(head) + bullmq_source(bullmq_script, edit) + argv.render(tail)
    return Script(name, without_unused(source), argv)


def _own(name: str) -> Script:
    """One of fairqueue's own scripts, ``lua/<name>.lua``, its arguments named."""
    text = load_lua(name)
    argv = Argv.declared(name, text)
    return Script(name, without_unused(argv.render(text)), argv)


#: BullMQ's add writes the prioritized set's entry once; fairqueue's score is given to that
#: one ZADD (``fqScoreText``, set by add_jobs.tail per job; nil: BullMQ's own score), where
#: a second ZADD over it used to cost a zset update and a command per job.
ADD_SCORE_EDIT = (
    'rcall("ZADD", prioritizedKey, score, jobId)',
    'rcall("ZADD", prioritizedKey, fqScoreText or score, jobId)',
)


@cache
def add_jobs_script() -> Script:
    """Adds a batch of jobs at their fair places (wraps ``addPrioritizedJob``)."""
    return _wrapping("add_jobs", "addPrioritizedJob-9.lua", ADD_SCORE_EDIT)


@cache
def add_delayed_script() -> Script:
    """Adds one delayed job, parked and indexed (wraps ``addDelayedJob``)."""
    return _wrapping("add_delayed", "addDelayedJob-6.lua")


@cache
def adopt_page_script() -> Script:
    """The pass: adopts a page of untagged jobs (wraps ``changePriority``)."""
    return _wrapping("adopt_page", "changePriority-7.lua")


@cache
def stalled_page_script() -> Script:
    """The pass: recovers stalled jobs into the fair order (wraps
    ``moveStalledJobsToWait``)."""
    return _wrapping("stalled_page", "moveStalledJobsToWait-9.lua")


@cache
def plain_script(name: str) -> Script:
    """One of fairqueue's own scripts, ``lua/<name>.lua`` (every file of ``lua/`` but the
    includes and the wrapped halves)."""
    return _own(name)
