"""Quotas within one job: the worker time of a tenant's attempts running now counts toward
its quota, so its action is taken when ended plus running time reaches the quota, while
the attempt that crossed it still runs (docs/usage.md#quotas).

The ledger counts an attempt's time when it ends; the history step keeps the attempts
running now in ``fq:run``, with their starts on Redis's clock. After each ledger write
the quota step notes here every tenant with a quota whose row the write changed (an
attempt started or ended) and that is not over yet, with its ended worker time of the
period as the database holds it. :meth:`QuotaWatch.check` then reads those tenants'
running attempts (``lua/usage_running.lua``: one call per queue, O(runs)), takes the
quota's action on those whose ended plus running time reached it (:data:`LEAD_S` ahead),
forgets those with nothing running (a start brings them back at the next write), and
predicts when each other one crosses its quota at the earliest: with ``k`` attempts
running and ``r`` ms left, in ``r / k`` ms (more starts only bring it closer, and a
start is seen at the next write). The loop checks again then
(:meth:`QuotaWatch.due_in_s`), reading only the tenants within reach of their quota by
that time. So the work is bounded by the attempts running, not by the tenants, and a
tenant over its quota gets at most the rest of the attempts it had running then (one job
per slot), plus, for an attempt that started and crossed the quota before the history
step read its start, the time until that step (every 250 ms).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from fairqueue.broker import get_sync_broker
from fairqueue.usage.holds import now, queues_of

logger = logging.getLogger("fairqueue.quotas")

#: A predicted crossing within this of a check is checked by it (seconds).
SLACK_S: Final = 0.005
#: How far ahead of a crossing the check acts (seconds of each running attempt): the
#: loop's reaction (its wake-up, the read, the hold's pull-back) must come before the
#: crossing attempt ends, or its slot takes the next job. A tenant stopped early by this
#: still gets the rest of the attempts it has running; it loses at most LEAD_S per slot
#: only when such an attempt ends within LEAD_S of reaching the quota.
LEAD_S: Final = 0.1
#: After a check that failed, the next between the loop's steps (seconds).
RETRY_S: Final = 0.25


@dataclass(slots=True)
class Watched:
    """A tenant with a quota, not over it, with attempts running or just started."""

    quota: Any  # fairqueue.usage.quotas.Quota
    quota_ms: int
    #: Its ended worker time in the period, as the database held it at the last write.
    ended_ms: int
    #: When the period ends (UTC): the entry is dropped then.
    until: dt.datetime
    job_type: str
    #: When it could cross its quota at the earliest (time.monotonic()).
    crossing: float = 0.0
    #: The tenants whose running attempts count (an account's; empty: the key's own).
    members: tuple[str, ...] = ()


class QuotaWatch:
    """The loop process's tenants (or accounts, each with its tenants as ``members``) to
    check for running time (one loop per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, Watched] = {}

    def note(self, tenant_id: str, watched: Watched) -> None:
        """Watch ``tenant_id`` (its row changed at the last write; not over quota)."""
        with self._lock:
            self._tenants[tenant_id] = watched

    def drop(self, tenant_ids: Iterable[str]) -> None:
        with self._lock:
            for tenant_id in tenant_ids:
                self._tenants.pop(tenant_id, None)

    def clear(self) -> None:
        with self._lock:
            self._tenants.clear()

    def __len__(self) -> int:
        return len(self._tenants)

    def due_in_s(self) -> float:
        """Seconds until the earliest predicted crossing (``inf``: none watched)."""
        with self._lock:
            soonest = min((w.crossing for w in self._tenants.values()), default=math.inf)
        return soonest - time.monotonic()

    def check(self, act: Callable[[str, Any, int, str], None], *, due_only: bool = False) -> int:
        """Read the watched tenants' running attempts (with ``due_only``, only those whose
        predicted crossing has come) and call ``act(tenant_id, quota, used_ms, job_type)``
        for those over their quota (:func:`fairqueue.usage.quotas.exceed`). Returns how many.

        Raises:
            BrokerError: Redis failed (nothing changed: the next check reads again).
        """
        at = time.monotonic()
        with self._lock:
            expired = [t for t, w in self._tenants.items() if w.until <= now()]
            for tenant_id in expired:
                del self._tenants[tenant_id]
            wanted = {
                t: w for t, w in self._tenants.items() if not due_only or w.crossing <= at + SLACK_S
            }
        if not wanted:
            return 0
        for watched in wanted.values():  # a failed read waits for the next write's check
            watched.crossing = at + RETRY_S
        running = _running(sorted({m for t, w in wanted.items() for m in w.members or (t,)}))
        over = 0
        for tenant_id, watched in wanted.items():
            counted = [running.get(m, (0, 0)) for m in watched.members or (tenant_id,)]
            count, ms = sum(c for c, _ in counted), sum(m for _, m in counted)
            used = watched.ended_ms + ms
            if count and used + count * LEAD_S * 1000 >= watched.quota_ms:
                act(tenant_id, watched.quota, used, watched.job_type)
                self.drop([tenant_id])
                over += 1
            elif not count:
                self.drop([tenant_id])  # nothing running: its next start is a change
            else:
                watched.crossing = at + (watched.quota_ms - used) / count / 1000 - LEAD_S
        return over


def _running(tenants: list[str]) -> dict[str, tuple[int, int]]:
    """tenant -> (attempts running, their worker ms so far), over every queue."""
    sync_broker = get_sync_broker()
    store = sync_broker.broker.usage
    out: dict[str, tuple[int, int]] = {}
    for queue in queues_of(""):
        found = sync_broker.run(store.running, queue, tenants)
        for tenant_id, (count, ms) in found.items():
            before = out.get(tenant_id, (0, 0))
            out[tenant_id] = (before[0] + count, before[1] + ms)
    return out
