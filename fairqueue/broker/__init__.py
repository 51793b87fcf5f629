"""The one package that talks to BullMQ and Redis; this module is its only public door.

Everything else in fairqueue speaks its own types (``NewJob``, ``WaitingJob``, ...);
BullMQ's camelCase API, its key names and its priority score format (docs/design.md,
"The score layout") stay in here. Jobs are added and adopted by BullMQ's own scripts,
wrapped in fairqueue's Lua, so what lands in Redis is what BullMQ itself writes.

Async callers use :class:`Broker`, one small part per job over one :class:`Connection`
(``broker.adding``, ``.passes``, ``.lock``, ``.limits``, ``.dashboard``, ``.history``,
``.workers``, ``.results``, ``.console``, ``.failures``, ``.status``, ``.usage``); sync
callers use :class:`SyncBroker` (enqueues straight from the calling thread, any other
call as ``sync.run(sync.broker.<part>.<method>, ...)``). Both are recreated after
``fork()``. Nothing outside this package imports its modules (a unit test holds the
door); CONTRIBUTING.md lists them.
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
from fairqueue.broker.limit_store import AccountCopy, Released
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
    "AccountCopy",
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
