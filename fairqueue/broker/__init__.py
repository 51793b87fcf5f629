"""The one package that talks to BullMQ and Redis; this module is its only public door.

Everything else in fairqueue speaks its own types (``NewJob``, ``WaitingJob``, ...);
BullMQ's camelCase API, its key names and its priority score format stay in here.

How fairqueue uses BullMQ's priority (pinned: ``bullmq>=3.4.4,<3.5``, checked by
``tests/test_broker_contract.py``):

* BullMQ pops its ``wait`` list (priority 0) before anything in the ``prioritized``
  sorted set, whose score is ``priority * 2**32 + counter``; priorities run 1..2**21-1.
* fairqueue splits that range in two bands. The **window band** ``1 .. WINDOW_BAND_TOP-1``
  holds the jobs a rebalance pass has put in exact fair order. The **tag band**
  ``WINDOW_BAND_TOP .. MAX_PRIORITY`` holds newly enqueued jobs at their enqueue-time
  virtual finish tag (see :data:`ADD_SCRIPT_HEAD`), so the backlog behind the window is
  already in approximately fair order and a new critical job does not wait behind a
  whole backlog of low jobs for the next pass to find it.
* Jobs are added by BullMQ's own ``addPrioritizedJob`` script and rebalance writes go
  through BullMQ's own ``changePriority`` script (each wrapped to run a batch per
  EVALSHA), so a stock BullMQ worker (Python or Node) pops the jobs in the fair order.

Sync callers (Django views, management commands) use :class:`SyncBroker`: enqueues go
straight from the calling thread through one blocking connection pool per process (the
hot path pays no thread hop); everything else runs on one event-loop thread per process
with one async pool. Both are recreated after ``fork()``. Async callers (async views)
await :class:`Broker` directly.

The package, one module per concern (import from here, not from them):

* ``common``: the priority bands (``MAX_PRIORITY``, ``WINDOW_BAND_TOP``, ...) and helpers;
* ``scripts``: the Lua scripts, read from ``lua/*.lua``, and those wrapping BullMQ's own;
* ``connection``: ``BrokerCore`` (a client per event loop, keys, errors), ``SyncBroker``
  and the per-process brokers (``get_broker``, ``get_sync_broker``, ``close_brokers``);
* ``adding``: ``NewJob``, ``AddedJob`` and enqueueing, sync and async;
* ``rebalancing``: what the rebalance pass reads and writes;
* ``lock``: the rebalance pass's leader lock;
* ``dashboard``: the admin dashboard's reads;
* ``workers``: building a BullMQ worker, and the demo's finished-job reads.
"""

from __future__ import annotations

from .adding import AddedJob, AddingMixin, NewJob
from .common import (
    BACK_OF_LINE,
    MAX_PRIORITY,
    REBASE_THRESHOLD,
    TAG_OFFSET,
    TAG_STEP,
    WINDOW_BAND_TOP,
    parse_job_data,
)
from .connection import BrokerCore, SyncBroker, close_brokers, get_broker, get_sync_broker
from .dashboard import BacklogScan, DashboardReadsMixin, JobDetail, LevelScan
from .lock import LockMixin
from .rebalancing import (
    OverdueJobs,
    RebalancingMixin,
    WaitingJob,
    WaitingSnapshot,
    WriteResult,
)
from .scripts import (
    ADD_SCRIPT_HEAD,
    ADD_SCRIPT_TAIL,
    CHANGE_SCRIPT_HEAD,
    CHANGE_SCRIPT_TAIL,
    META_SCRIPT,
    OVERDUE_SCRIPT,
    REBASE_SCRIPT,
    RELEASE_LOCK_SCRIPT,
    RENEW_LOCK_SCRIPT,
    add_script_source,
    change_script_source,
)
from .workers import ActiveJob, FinishedJob, WorkerMixin


class Broker(
    AddingMixin, RebalancingMixin, LockMixin, DashboardReadsMixin, WorkerMixin, BrokerCore
):
    """Async access to BullMQ queues under one Redis URL and key prefix.

    Args:
        redis_url: where Redis is (may hold credentials: never logged).
        prefix: BullMQ key prefix; ``"bull"`` is BullMQ's default.
        client_factory: builds the ``redis.asyncio`` client (injectable for tests).
    """


__all__ = [
    "ADD_SCRIPT_HEAD",
    "ADD_SCRIPT_TAIL",
    "BACK_OF_LINE",
    "CHANGE_SCRIPT_HEAD",
    "CHANGE_SCRIPT_TAIL",
    "MAX_PRIORITY",
    "META_SCRIPT",
    "OVERDUE_SCRIPT",
    "REBASE_SCRIPT",
    "REBASE_THRESHOLD",
    "RELEASE_LOCK_SCRIPT",
    "RENEW_LOCK_SCRIPT",
    "TAG_OFFSET",
    "TAG_STEP",
    "WINDOW_BAND_TOP",
    "ActiveJob",
    "AddedJob",
    "BacklogScan",
    "Broker",
    "FinishedJob",
    "JobDetail",
    "LevelScan",
    "NewJob",
    "OverdueJobs",
    "SyncBroker",
    "WaitingJob",
    "WaitingSnapshot",
    "WriteResult",
    "add_script_source",
    "change_script_source",
    "close_brokers",
    "get_broker",
    "get_sync_broker",
    "parse_job_data",
]
