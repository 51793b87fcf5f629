"""What an operator should look at first on a queue's page, in words: built from the
figures the page shows, so a warning never disagrees with the numbers beside it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Final

from fairqueue.broker import MemoryState

#: A last pass older than this many intervals means the loop looks dead.
STALE_PASS_INTERVALS: Final = 3


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def queue_warnings(stats: dict[str, Any]) -> list[str]:
    """What an operator should look at first, most urgent first."""
    warnings = []
    memory = stats["redis_memory"]
    if memory and memory["refuses_writes"]:
        warnings.append(
            f"Redis is out of memory: it uses {_mib(memory['used_bytes'])} of its maxmemory "
            f"{_mib(memory['max_bytes'])} with maxmemory-policy noeviction, so it refuses "
            "every write (enqueues, passes, workers finishing jobs; the outbox keeps durable "
            "jobs) while reads work: this page shows what Redis holds. Free memory (fewer "
            "kept jobs: KEEP_COMPLETED, KEEP_FAILED) or raise maxmemory."
        )
    if stats["paused"]:
        warnings.append(
            "The queue is paused (queue.pause()): workers take no job until it is resumed "
            "(queue.resume()). Passes still place the jobs that arrive, so they run in the "
            "fair order once it resumes; their wait keeps counting toward the bound."
        )
    overdue = stats["overdue_total"]
    if overdue:
        warnings.append(
            f"{overdue} waiting job(s) have waited longer than the "
            f"{stats['max_wait']} bound (QUEUE_FAIR_MAX_WAIT_MS)."
        )
    last = stats["last_pass"]
    stale_ms = STALE_PASS_INTERVALS * stats["interval_ms"]
    holder = stats["lock"]["holder"]
    if stats["waiting_total"] and (last is None or (last["age_ms"] or 0) > stale_ms):
        since = "No pass has been recorded" if last is None else f"No pass for {last['age']}"
        if holder:
            warnings.append(f"{since}, yet {holder} holds the leader lock: is it stuck?")
        else:
            warnings.append(
                f"{since} and no rebalancer holds the leader lock: is the rebalance loop "
                "(manage.py rebalance_fair) or its Celery beat task running?"
            )
    drift = stats["order"]["drift_count"]
    if drift:
        warnings.append(
            f"{drift} of the first {stats['order']['compared']} jobs wait outside the fair "
            "order (other producers' or promoted delayed jobs); the next pass places them."
        )
    unparsed = stats["unparsed"]
    if unparsed and unparsed["waiting"]:
        warnings.append(
            f"{unparsed['waiting']} waiting job(s) have unreadable fairqueue metadata; "
            "passes place them as normal jobs without a tenant."
        )
    return warnings


def memory_figures(state: MemoryState | None) -> dict[str, Any] | None:
    """Redis's memory for the page and its out-of-memory warning."""
    return None if state is None else {**asdict(state), "refuses_writes": state.refuses_writes}
