"""fairqueue's Lua scripts: read from ``lua/`` in this package, composed around BullMQ's.

Each script lives in its own ``.lua`` file under ``fairqueue/broker/lua/`` (shipped as
package data). The add and change scripts wrap BullMQ's own Lua, read from the
installed bullmq package with ``bullmq.redis_connection.loadScript``: a fairqueue head
piece, BullMQ's script, a fairqueue tail piece.
"""

from __future__ import annotations

import hashlib
from importlib.resources import files
from typing import Final

from bullmq.redis_connection import loadScript

from .common import BACK_OF_LINE, TAG_STEP, WINDOW_BAND_TOP


def load_lua(name: str) -> str:
    """The text of ``lua/<name>`` in this package."""
    return files(__package__).joinpath("lua", name).read_text(encoding="utf-8")


def script_sha(source: str) -> str:
    """The SHA1 Redis knows ``source`` by (for EVALSHA)."""
    return hashlib.sha1(source.encode()).hexdigest()  # noqa: S324


#: fairqueue's add script wraps BullMQ's own addPrioritizedJob script (see
#: :func:`add_script_source`) and runs it once per job of a batch, in one EVALSHA.
#: Before each run it sets the job's ``priority`` option to the job's level's next
#: virtual finish tag, ``max(level's last tag, virtual time) + step``, the virtual time
#: being the start tag of the tag band's head job (WFQ's "tag of the job in service").
#: A level that was idle restarts there (no credit for idleness); an empty tag band
#: resets the per-level tags, so they do not creep towards BullMQ's cap. A job id that
#: already exists is left to BullMQ (it keeps the existing job) and uses no tag.
#:
#: KEYS[1..9] are addPrioritizedJob's, KEYS[10] is fairqueue's per-level tag hash.
#: ARGV[1] is the number of jobs n; then, per job, BullMQ's four arguments (packed
#: args, JSON data, packed opts, timestamp) and the level name. Returns, per job, the
#: job id and the priority given (0: the id existed and nothing was added).
#:
#: A Python %-template (the tag steps, the tag band floor and the back of the line).
ADD_SCRIPT_HEAD: Final = load_lua("add_jobs.head.lua")
ADD_SCRIPT_TAIL: Final = load_lua("add_jobs.tail.lua")


def add_script_source() -> str:
    """fairqueue's add script: BullMQ's own addPrioritizedJob, wrapped.

    BullMQ's script is read from the installed bullmq package, so the job hash, the
    prioritized set entry and the events are exactly what BullMQ writes; only the
    ``priority`` option it is given is fairqueue's.
    """
    head = ADD_SCRIPT_HEAD % {
        **{level.value: step for level, step in TAG_STEP.items()},
        "floor": WINDOW_BAND_TOP,
        "back": BACK_OF_LINE,
    }
    return head + loadScript("addPrioritizedJob-9.lua") + ADD_SCRIPT_TAIL


def delayed_script_source() -> str:
    """BullMQ's own addDelayedJob, as is (delayed jobs go in one per EVALSHA)."""
    return loadScript("addDelayedJob-6.lua")


#: Page through the prioritized set returning jobs whose BullMQ ``timestamp`` is older
#: than the cutoff. Runs inside Redis so a 100,000-job backlog is scanned in a few
#: round trips instead of 100,000.
OVERDUE_SCRIPT: Final = load_lua("overdue_page.lua")

#: Read what the rebalance pass needs of each job, parsing the payload inside Redis so
#: payloads never cross the wire on the hot path. Per job id (ARGV[2..]) it returns
#: id, name, timestamp, priority, attempts made, a data flag (1: JSON object, 0: not),
#: the tenant (a string, or '' with flag 0 for missing/null, 2 for not a string), the
#: level ('' when missing) and, for jobs without a level, the priority their producer
#: asked for (-1 when unknown). Gone jobs are left out.
META_SCRIPT: Final = load_lua("job_meta.lua")
_META_WIDTH: Final = 10

#: BullMQ's own changePriority script, run once per (job id, priority) pair of a batch
#: in one EVALSHA (see :func:`change_script_source`). ARGV[1] is the job key prefix,
#: then pairs; returns BullMQ's code per job (0 ok, -1 missing).
CHANGE_SCRIPT_HEAD: Final = load_lua("change_priorities.head.lua")
CHANGE_SCRIPT_TAIL: Final = load_lua("change_priorities.tail.lua")


def change_script_source() -> str:
    """BullMQ's changePriority, looped over a batch (job hashes and sets as BullMQ
    writes them; one round trip for the batch)."""
    return CHANGE_SCRIPT_HEAD + loadScript("changePriority-7.lua") + CHANGE_SCRIPT_TAIL


#: Shift every tag-band job (and the per-level tags) down by ARGV[2], so tags never
#: reach BullMQ's cap on a queue that is never empty. Relative order is unchanged.
REBASE_SCRIPT: Final = load_lua("rebase_tag_band.lua")

#: Release a lock only if we still hold it.
RELEASE_LOCK_SCRIPT: Final = load_lua("lock_release.lua")
#: Renew a lock only if we still hold it.
RENEW_LOCK_SCRIPT: Final = load_lua("lock_renew.lua")

#: The jobs at pop positions ARGV[1]..ARGV[2] (0-based, inclusive), read atomically:
#: the wait list first (BullMQ pops it from its right end), then the prioritized set.
#: Returns the wait list's length and flat (id, score) pairs, score "0" for wait jobs.
DASHBOARD_PAGE_SCRIPT: Final = load_lua("dashboard_page.lua")

#: One page of a backlog scan, over the wait list (ARGV[1] = 'list', cursor = index)
#: or the prioritized set (ARGV[1] = 'zset', cursor = exclusive score bound, so jobs
#: popped meanwhile do not shift the pages). Classifies each job as
#: ``rebalance.pending_from_job`` does (data's tenantId/priorityLevel, else the
#: requested or stored priority through normalize_priority; '?' when unreadable) and
#: returns {count, next cursor, [level, waiting, overdue, oldest ts]...,
#: [level, tenant, waiting]..., [id, ts, level, tenant] of each overdue job}.
DASHBOARD_SCAN_SCRIPT: Final = load_lua("dashboard_scan.lua")
