"""The one package that talks to BullMQ and Redis; this module is its only public door.

Everything else in fairqueue speaks its own types (``NewJob``, ``WaitingJob``, ...);
BullMQ's camelCase API, its key names and its priority score format stay in here.

How fairqueue uses BullMQ's priority (pinned: ``bullmq>=3.4.4,<3.5``, checked by
``tests/redis/test_broker_contract.py``):

* BullMQ pops its ``wait`` list (priority 0) before anything in the ``prioritized``
  sorted set, whose score is ``priority * 2**32 + counter``; priorities run 1..2**21-1.
* fairqueue gives every job its place when it is added, in the add script, atomically
  with BullMQ's own add (``lua/include/fair_clock.lua``): from priority ``TAG_FLOOR`` up, the
  whole 53-bit score (``priority * 2**32 + counter`` as BullMQ writes it) is fairqueue's
  fixed-point fair tag (start-time fair queueing over (level, tenant) flows; see
  :mod:`fairqueue.scheduling.order`), ``TAG_RESOLUTION`` score units per tag unit, while the
  job's BullMQ priority stays ``floor(score / 2**32)``. So a new job goes ahead of
  waiting jobs whenever its tag says so, the order never runs out of room at any
  realistic backlog, and a stock worker pops the fair order. Priorities below ``TAG_FLOOR`` are
  other producers' (they run first until a pass adopts them); ``MAX_PRIORITY`` is where
  delayed jobs and jobs without room wait to be adopted.
* fairqueue keeps its own small index beside the queue (the ``fq:`` keys): job ids by
  the second they became ready (Redis's clock), and a delayed job's level, tenant and
  weight until the pass places it, so the rebalance pass never decodes a payload of its
  own jobs (a job's level is in its score).
* Jobs are added by BullMQ's own ``addPrioritizedJob``/``addDelayedJob`` scripts and
  adopted through BullMQ's own ``changePriority`` script, each wrapped in fairqueue's
  Lua, so what lands in Redis is what BullMQ itself writes.

Async callers (async views, the worker) use :class:`Broker`, composed of one small part
per job over one :class:`Connection`: ``broker.adding``, ``broker.passes`` (a
``PassStore``), ``broker.lock`` (``LockStore``), ``broker.limits`` (``LimitStore``),
``broker.dashboard`` (``DashboardReads``), ``broker.history`` (``HistoryStore``),
``broker.workers``, ``broker.results``, ``broker.console`` (``ConsoleReads``) and
``broker.failures`` (``FailureReads``), the console's reads, ``broker.status``
(``StatusReads``, the job-status endpoint's) and ``broker.usage`` (``UsageStore``, the
usage ledger's). Nothing outside this package imports its modules (a unit test holds
the door). Sync callers (Django views, management commands) use
:class:`SyncBroker`: enqueues go straight from the calling thread through a blocking
connection per thread (the hot path pays no thread hop); any other call is
``sync.run(sync.broker.<part>.<method>, ...)``, typed like the method it runs, on one
event-loop thread per process with one async pool. Both are recreated after ``fork()``.

The package, one module per concern (import from here, not from them):

* ``common``: the priority layout (``MAX_PRIORITY``, ``TAG_FLOOR``, ...), key names and helpers;
* ``scripts``: the Lua scripts (``lua/``; their shared libraries in ``lua/include/``, the
  halves wrapped around BullMQ's own in ``lua/wrap/``) and the one way to run them;
* ``clients`` and ``sentinel``: Redis clients of every kind (one server, Sentinel, Cluster);
* ``connection``: :class:`Connection` (a client per event loop, keys, errors) and the
  parts' base;
* ``brokers``: :class:`Broker`, :class:`SyncBroker` and the per-process brokers
  (``get_broker``, ``get_sync_broker``, ``close_brokers``);
* ``adding``: ``NewJob``, ``AddedJob`` and enqueueing;
* ``pass_store``: what the rebalance pass reads and writes (fenced by its lock);
* ``lock_store``: the rebalance pass's leader lock, and the :class:`Fence` its writes take;
* ``dashboard_reads``: the admin dashboard's reads; ``console_reads`` and
  ``failure_reads`` the console pages' (a tenant's jobs, a job's place, failures);
* ``status_reads``: the job-status endpoint's one-round-trip reads;
* ``usage_store``: the usage ledger's rows in Redis and the running attempts;
* ``history_store``: the history the pass records from BullMQ's events stream, and its
  reads; ``events`` reads a page of that stream and commits what it says;
* ``limit_store``: per-tenant limits: releasing held jobs (one atomic script), pausing,
  rebuilding Redis's copy from the database; ``limit_reads`` what the dashboard reads of
  them;
* ``workers``: building a BullMQ worker, and the idle check of a burst worker;
* ``results``: one job read back by id (state, return value, errors) for the Django
  tasks backend's ``get_result``.
"""

from fairqueue.broker.adding import ADD_BATCH_SIZE, AddBatch, AddedJob, NewJob
from fairqueue.broker.brokers import Broker, SyncBroker, close_brokers, get_broker, get_sync_broker
from fairqueue.broker.common import (
    BACK_OF_LINE,
    MAX_JOB_ID_LENGTH,
    MAX_PRIORITY,
    REBASE_THRESHOLD,
    RESERVED_JOB_IDS,
    TAG_FLOOR,
    TAG_RESOLUTION,
    fair_keys,
    parse_job_data,
    permission_error,
    refuses_every_write,
)
from fairqueue.broker.connection import Connection
from fairqueue.broker.console_reads import (
    FAILED_WINDOW,
    ORDER_WINDOW,
    ConsoleReads,
    Place,
    TenantJobs,
    job_tenant_id,
)
from fairqueue.broker.dashboard_reads import BacklogScan, JobDetail, LevelScan, MemoryState
from fairqueue.broker.failure_reads import FailureReads, RecentFailure
from fairqueue.broker.history_store import HistoryRead, RecordedPage
from fairqueue.broker.limit_reads import STATUS_TENANTS, LimitsStatus, TenantState
from fairqueue.broker.limit_store import Released
from fairqueue.broker.lock_store import Fence
from fairqueue.broker.pass_store import (
    AdoptedPage,
    IndexWalk,
    WaitingJob,
    pending_from_job,
)
from fairqueue.broker.results import JOB_STATES, StoredJob
from fairqueue.broker.scripts import Script, add_jobs_script, adopt_page_script, plain_script
from fairqueue.broker.status_reads import Placement, RawEstimate, RawStatus, StatusReads
from fairqueue.broker.usage_store import UsageRead, UsageStore
from fairqueue.broker.workers import ActiveJob, WorkerProcess
from fairqueue.exceptions import LockLostError

__all__ = [
    "FAILED_WINDOW",
    "ORDER_WINDOW",
    "ConsoleReads",
    "FailureReads",
    "Place",
    "Placement",
    "RawEstimate",
    "RawStatus",
    "RecentFailure",
    "StatusReads",
    "TenantJobs",
    "UsageRead",
    "UsageStore",
    "job_tenant_id",
    "STATUS_TENANTS",
    "LimitsStatus",
    "Released",
    "TenantState",
    "ADD_BATCH_SIZE",
    "BACK_OF_LINE",
    "JOB_STATES",
    "MAX_JOB_ID_LENGTH",
    "MAX_PRIORITY",
    "REBASE_THRESHOLD",
    "RESERVED_JOB_IDS",
    "TAG_FLOOR",
    "TAG_RESOLUTION",
    "ActiveJob",
    "WorkerProcess",
    "AddBatch",
    "AddedJob",
    "AdoptedPage",
    "BacklogScan",
    "Broker",
    "Connection",
    "Fence",
    "HistoryRead",
    "IndexWalk",
    "JobDetail",
    "LevelScan",
    "LockLostError",
    "MemoryState",
    "NewJob",
    "RecordedPage",
    "Script",
    "StoredJob",
    "SyncBroker",
    "WaitingJob",
    "add_jobs_script",
    "adopt_page_script",
    "close_brokers",
    "fair_keys",
    "get_broker",
    "get_sync_broker",
    "parse_job_data",
    "pending_from_job",
    "permission_error",
    "plain_script",
    "refuses_every_write",
]
