"""The Django tasks backend: ``@task`` functions defined here, the ``TASKS`` setting of
tests/settings.py (FairQueueBackend, django-tasks' ``default`` queue as the ``email`` job
type), a real Redis under a private prefix, and real workers (fairqueue_worker's and a
stock Node BullMQ worker) running the jobs."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

try:  # Django 6: its own django.tasks (`make test-django6` has no backport)
    from django.tasks import TaskResultStatus, default_task_backend, task, task_backends
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskResultStatus, default_task_backend, task, task_backends
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist

from fairqueue import conf
from fairqueue.broker import Broker, NewJob
from fairqueue.enqueue import priority
from fairqueue.exceptions import (
    ImplicitInternalJobWarning,
    InvalidTenantError,
    UnknownJobTypeError,
)
from fairqueue.models import OutboxJob, PriorityOverrideAudit
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.tasks.backend import (
    FairQueueBackend,
    UnknownTaskQueueError,
    level_for_task_priority,
)
from fairqueue.worker.runner import Worker, runnable_job_types
from tests.helpers.fresh_project import shop_project
from tests.helpers.keys import REDIS_URL
from tests.helpers.node import run_node_worker
from tests.helpers.tasks import (
    FLAKY_CALLS,
    RAN,
    BoomError,
    add,
    async_add,
    explode,
    flaky,
    for_org,
    record,
    record_critical,
    record_low,
    run_worker,
    unserialisable,
    with_context,
)

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_ran():
    RAN.clear()
    yield
    RAN.clear()


@pytest.fixture
def broker(fq_prefix):
    return Broker(REDIS_URL, fq_prefix)


def job_hash(redis_client, prefix: str, job_id: str, queue: str = "email") -> dict:
    return redis_client.hgetall(f"{prefix}:{queue}:{job_id}")


# -- the priority mapping ---------------------------------------------------------------


def test_priority_mapping__four_bands_and_zero_asks_for_no_level():
    assert [level_for_task_priority(p) for p in (100, 50, 49, 1)] == [
        PriorityLevel.CRITICAL,
        PriorityLevel.CRITICAL,
        PriorityLevel.HIGH,
        PriorityLevel.HIGH,
    ]
    assert [level_for_task_priority(p) for p in (-1, -49, -50, -100)] == [
        PriorityLevel.NORMAL,
        PriorityLevel.NORMAL,
        PriorityLevel.LOW,
        PriorityLevel.LOW,
    ]
    assert level_for_task_priority(0) is None
    for bad in (101, -101, True, 1.5):
        with pytest.raises(InvalidTaskError, match=r"priority=.* -100\.\.100"):
            level_for_task_priority(bad)


def test_backend__supports_everything_django_tasks_asks_about():
    backend = task_backends["default"]
    assert isinstance(backend, FairQueueBackend) and default_task_backend.supports_defer
    assert (
        backend.supports_priority,
        backend.supports_defer,
        backend.supports_async_task,
        backend.supports_get_result,
    ) == (True, True, True, True)


# -- enqueue ----------------------------------------------------------------------------


def test_enqueue__writes_a_plain_bullmq_job_with_the_task_path_args_and_kwargs(
    fq_prefix, redis_client
):
    result = record.enqueue("hello", tenant_id="acme")
    assert result.status == TaskResultStatus.READY and result.enqueued_at is not None
    assert (result.args, result.kwargs) == (["hello"], {"tenant_id": "acme"})
    stored = job_hash(redis_client, fq_prefix, result.id)
    assert stored["name"] == "email"  # the job type django-tasks' default queue maps to
    data = json.loads(stored["data"])
    assert data == {
        "djangoTask": {
            "path": "tests.helpers.tasks.record",
            "args": ["hello"],
            "kwargs": {"tenant_id": "acme"},
            "backend": "default",
            "queueName": "default",
            "priority": 0,
            "runAfter": None,
        },
        "tenantId": "acme",
        "priorityLevel": "normal",
    }
    # Placed at enqueue like every fairqueue job: in the prioritized set, never priority 0.
    assert redis_client.zscore(f"{fq_prefix}:email:prioritized", result.id) is not None


def test_enqueue__tenant_kwarg_rules_match_enqueue_job(fq_prefix, redis_client):
    def level(result):
        data = json.loads(job_hash(redis_client, fq_prefix, result.id)["data"])
        return data["tenantId"], data["priorityLevel"]

    assert level(record.enqueue("no tenant")) == ("default", "normal")  # the default bucket
    with pytest.warns(ImplicitInternalJobWarning) as caught:  # pointing at this call
        assert level(record.enqueue("internal", tenant_id=None)) == (None, "critical")
    assert [w.filename for w in caught] == [__file__]
    assert level(record.enqueue("pk", tenant_id=42)) == ("42", "normal")
    with pytest.raises(InvalidTenantError, match="tenant_id='<0 characters>' is not allowed"):
        record.enqueue("empty", tenant_id="")
    with pytest.raises(InvalidTaskError, match="tenant_id of type float is not allowed"):
        record.enqueue("float", tenant_id=1.5)


def test_enqueue__priority_zero_leaves_the_plan_to_decide_other_priorities_win(
    fq_prefix, redis_client
):
    priority.wire_tenant_plan_lookup({"big": "enterprise", "small": "free"}.get)
    plan_big = record.enqueue("plan", tenant_id="big")
    plan_small = record.enqueue("plan", tenant_id="small")
    explicit = record_low.enqueue("explicit", tenant_id="big")
    levels = [
        json.loads(job_hash(redis_client, fq_prefix, r.id)["data"])["priorityLevel"]
        for r in (plan_big, plan_small, explicit)
    ]
    assert levels == ["critical", "low", "low"]
    # A task's priority is an explicit level, a code decision: not audited by default.
    assert PriorityOverrideAudit.objects.count() == 0


def test_enqueue__a_task_priority_is_audited_with_audit_explicit_priority(fq_prefix, settings):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "AUDIT_EXPLICIT_PRIORITY": True}
    record.enqueue("plan", tenant_id="big")  # priority 0: the plan decides, no audit
    explicit = record_low.enqueue("explicit", tenant_id="big")
    audits = list(PriorityOverrideAudit.objects.values("job_id", "resolved_level", "source"))
    assert audits == [
        {
            "job_id": explicit.id,
            "resolved_level": "low",
            "source": "django task tests.helpers.tasks.record_low",
        }
    ]


def test_enqueue__bad_input_names_the_argument_and_writes_nothing(fq_prefix, redis_client):
    with pytest.raises(InvalidTaskError, match=r"args of task .*record.* JSON-serialisable"):
        record.enqueue(object())
    with pytest.raises(InvalidTaskError, match=r"kwargs of task .*JSON-serialisable"):
        add.enqueue(1, b={1, 2})
    with pytest.raises(InvalidTaskError, match=r"run_after=.* more than 365 days ahead"):
        record.using(run_after=timezone.now() + timedelta(days=400)).enqueue("later")
    with pytest.raises(InvalidTaskError, match=r"queue_name='nope' is not allowed: .*\['QUEUES'\]"):
        record.using(queue_name="nope")
    assert redis_client.keys(f"{fq_prefix}:*") == []


def test_enqueue__arguments_get_the_payloads_checks_as_invalid_task_errors(
    fq_prefix, redis_client, settings
):
    # JSON would store {1: "a", "1": "b", 2: "c"} as {"1": "b", "2": "c"}: a value lost.
    with pytest.raises(InvalidTaskError, match=r"args\[0\] of task .*record.* key of type int"):
        record.enqueue({1: "a", "1": "b", 2: "c"})
    with pytest.raises(InvalidTaskError, match=r"kwargs\['b'\] of task .*add.* key of type int"):
        add.enqueue(1, b={"x": [{2: 0}]})
    with pytest.raises(InvalidTaskError, match=r"args\[0\] of task .* not valid UTF-8"):
        record.enqueue("\ud800")
    with pytest.raises(InvalidTaskError, match=r"kwargs\['b'\] of task .* deeper than"):
        deep: list = []
        for _ in range(100):
            deep = [deep]
        add.enqueue(1, b=deep)
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "MAX_PAYLOAD_BYTES": 1024}
    conf.reload_settings()
    with pytest.raises(InvalidTaskError, match=r"arguments of task .*record.* bytes"):
        record.enqueue("x" * 2_000)
    assert redis_client.keys(f"{fq_prefix}:*") == []


@pytest.mark.parametrize(
    "result_id", ["id", "prioritized", "events", "meta", "wait", "stalled-check", "fq"]
)
def test_get_result__a_queue_key_name_is_no_result(fq_prefix, redis_client, result_id):
    add.enqueue(1, 2)  # the queue's keys exist: id, events, prioritized, meta...
    redis_client.xadd(f"{fq_prefix}:email:events", {"event": "x"})
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(add.aget_result(result_id))


def test_get_result__a_job_that_is_no_task_is_no_result(fq_prefix):
    from fairqueue.enqueue.api import enqueue_job

    job = enqueue_job("email", {"plain": True}, tenant_id="t", job_id="not-a-task")
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(job.job_id)


def test_enqueue__queue_name_without_a_configured_job_type_is_a_clear_error(
    fq_prefix, settings, redis_client
):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "QUEUES": {"email": "email"}}
    conf.reload_settings()
    with pytest.raises(UnknownTaskQueueError) as info:
        record.using(queue_name="report").enqueue("x")
    assert isinstance(info.value, InvalidTaskError) and isinstance(info.value, UnknownJobTypeError)
    message = str(info.value)
    assert "queue_name='report' is not allowed" in message and "'email'" in message
    assert "JOB_TYPES" in message
    assert redis_client.keys(f"{fq_prefix}:*") == []


def test_backend_options__unknown_or_malformed_are_improperly_configured():
    backend = "fairqueue.tasks.backend.FairQueueBackend"
    for options, match in (
        ({"TENANT": "org"}, r"unknown keys \['TENANT'\]"),
        ({"TENANT_KWARG": "not an identifier"}, r"\['TENANT_KWARG'\]='not an identifier'"),
        ({"JOB_TYPES": ["email"]}, r"\['JOB_TYPES'\]=\['email'\] is not allowed"),
        ({"ATTEMPTS": 0}, r"\['ATTEMPTS'\]=0 is not allowed: expected None or an integer"),
        ({"DURABLE": "yes"}, r"\['DURABLE'\]='yes' is not allowed: expected True or False"),
        ({"BACKOFF": "slow"}, r"\['BACKOFF'\]='slow' is not allowed: expected None, a delay"),
    ):
        with override_settings(TASKS={"default": {"BACKEND": backend, "OPTIONS": options}}):
            with pytest.raises(ImproperlyConfigured, match=match):
                task_backends["default"]


def test_system_check__task_queue_without_a_job_type_is_fairqueue_E010(fq_prefix, settings):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "QUEUES": {"email": "email"}}
    conf.reload_settings()
    errors = list(task_backends["default"].check())
    assert [e.id for e in errors] == ["fairqueue.E010"]
    assert "queue_name='report'" in errors[0].msg


def test_system_check__bad_settings_are_reported_once_under_their_own_id(fq_prefix, settings):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "QUEUES": {"email": "email"}, "MAX_WAIT_MS": 0}
    conf.reload_settings()
    assert list(task_backends["default"].check()) == []
    from django.core.checks import run_checks

    ids = [message.id for message in run_checks() if message.id.startswith("fairqueue.")]
    assert ids == ["fairqueue.E001"]


def _plain(label: str, tenant_id: str | None = None) -> str:
    """Made a task inside the tests below, under their own TASKS."""
    return label


DOCS_TASKS = Path(__file__).resolve().parents[2] / "docs" / "tasks.md"


def documented_task_settings() -> dict:
    """The settings block docs/tasks.md tells users to copy, run as Python."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS_TASKS.read_text(), flags=re.DOTALL)
    (block,) = [b for b in blocks if b.startswith("# settings.py")]
    namespace: dict = {}
    exec(block, namespace)  # noqa: S102 - the repository's own documentation
    return namespace


def test_documented_tasks_setting__a_task_with_and_without_queue_name_works(
    fq_prefix, settings, redis_client
):
    documented = documented_task_settings()
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, **documented["FAIRQUEUE"]}
    conf.reload_settings()
    with override_settings(TASKS=documented["TASKS"]):
        backend = task_backends["default"]
        assert [m for m in backend.check() if m.id.startswith("fairqueue.")] == []
        plain, named = task()(_plain), task(queue_name="emails")(_plain)
        with transaction.atomic():  # the documented OPTIONS enqueue durably
            without = plain.enqueue("a", tenant_id="acme")
            with_name = named.enqueue("b", tenant_id="acme")
    # Relayed after commit, each to its job type's queue.
    assert job_hash(redis_client, fq_prefix, without.id, queue="default")["name"]
    assert job_hash(redis_client, fq_prefix, with_name.id, queue="email")["name"]


def test_task_without_queue_name__left_out_of_queues_fails_at_import_naming_the_setting(
    fq_prefix,
):
    tasks = {
        "default": {"BACKEND": "fairqueue.tasks.backend.FairQueueBackend", "QUEUES": ["email"]}
    }
    with override_settings(TASKS=tasks):
        with pytest.raises(InvalidTaskError) as info:
            task()(_plain)
        assert str(info.value) == (
            "queue_name='default' (the queue of a @task without queue_name=) is not allowed: "
            "expected one of TASKS['default']['QUEUES'] ('email'); add it there, or give the "
            "task a queue_name= from that list"
        )
        assert task(queue_name="email")(_plain).queue_name == "email"


@pytest.mark.parametrize(
    ("queues", "job_types", "warned"),
    [
        (["email"], {}, "TASKS['default']['QUEUES']=['email'] leaves out 'default'"),
        (["default", "email"], {"default": "email"}, None),
        ([], {}, "a @task without queue_name= would fail when enqueued: queue_name='default'"),
        ([], {"default": "email"}, None),
    ],
)
def test_system_check__a_task_without_queue_name_that_would_fail_is_fairqueue_W025(
    fq_prefix, settings, queues, job_types, warned
):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "QUEUES": {"email": "email"}}
    conf.reload_settings()
    tasks = {
        "default": {
            "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
            "QUEUES": queues,
            "OPTIONS": {"JOB_TYPES": job_types},
        }
    }
    with override_settings(TASKS=tasks):
        messages = [m for m in task_backends["default"].check() if m.id.startswith("fairqueue.")]
    if warned is None:
        assert messages == []
    else:
        assert [m.id for m in messages] == ["fairqueue.W025"]
        assert warned in messages[0].msg
        assert "TASKS['default']['QUEUES']" in messages[0].msg + messages[0].hint


def test_tenant_kwarg_option__names_the_kwarg_that_carries_the_tenant(fq_prefix, redis_client):
    tasks = {
        "default": {
            "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
            "OPTIONS": {"TENANT_KWARG": "org", "JOB_TYPES": {"default": "email"}},
        }
    }
    with override_settings(TASKS=tasks):
        by_org = for_org.enqueue("x", org="acme")
        data = json.loads(job_hash(redis_client, fq_prefix, by_org.id)["data"])
        assert data["tenantId"] == "acme"
        assert data["djangoTask"]["kwargs"] == {"org": "acme"}  # kept for the function
        plain = record.enqueue("x", tenant_id="ignored")
        data = json.loads(job_hash(redis_client, fq_prefix, plain.id)["data"])
        assert data["tenantId"] == "default"  # tenant_id is just a kwarg now


# -- running: fairqueue_worker ----------------------------------------------------------


def test_worker__runs_task_jobs_in_the_fair_order(broker):
    crit = [record_critical.enqueue(f"c{i}", tenant_id="a").id for i in range(8)]
    low = [record_low.enqueue(f"l{i}", tenant_id="b").id for i in range(2)]
    assert len(set(crit + low)) == 10
    run_worker(broker)
    c, lo = [f"c{i}" for i in range(8)], [f"l{i}" for i in range(2)]
    # Weights 4:1 from the head of the queue, as for every fairqueue job.
    assert RAN == c[:4] + lo[:1] + c[4:] + lo[1:]


def test_worker__runs_the_placed_order_where_a_late_tenant_need_not_wait_for_the_backlog(
    broker, redis_client
):
    label_of = {record.enqueue(f"a{i}", tenant_id="a").id: f"a{i}" for i in range(6)}
    label_of |= {record.enqueue(f"b{i}", tenant_id="b").id: f"b{i}" for i in range(2)}
    placed = redis_client.zrange(f"{broker.prefix}:email:prioritized", 0, -1)
    run_worker(broker, "email")
    assert RAN == [label_of[job_id] for job_id in placed]
    # Tenant b, enqueued behind a's backlog, runs among it, not after it.
    assert RAN.index("b0") < RAN.index("a3") and RAN.index("b1") < RAN.index("a5")


def test_worker__default_job_types_include_the_task_backends(fq_prefix):
    assert {"email", "report"} <= set(runnable_job_types())


def test_get_result__round_trip_through_a_real_worker(broker):
    result = add.enqueue(2, 3)
    before = add.get_result(result.id)
    assert before.status == TaskResultStatus.READY and before.worker_ids == []
    assert before.task.func is add.func and (before.args, before.kwargs) == ([2, 3], {})
    with pytest.raises(ValueError, match="not finished"):
        before.return_value
    run_worker(broker, "email")
    after = default_task_backend.get_result(result.id)
    assert after.status == TaskResultStatus.SUCCESSFUL
    assert after.return_value == {"sum": 5, "parts": [2, 3]}
    assert after.enqueued_at <= after.started_at <= after.finished_at
    assert after.last_attempted_at == after.started_at and after.attempts == 1
    assert after.errors == []
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value["sum"] == 5


def test_get_result__a_task_that_raises_is_failed_with_its_error(broker, redis_client):
    result = explode.enqueue("kaboom")
    run_worker(broker, "email")
    failed = explode.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.finished_at is not None
    (error,) = failed.errors
    assert error.exception_class_path == "tests.helpers.tasks.BoomError"
    assert error.exception_class is BoomError
    assert "BoomError: kaboom" in error.traceback and "def explode" not in error.traceback
    assert "raise BoomError(message)" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        failed.return_value
    reason = redis_client.hget(f"{broker.prefix}:email:{result.id}", "failedReason")
    assert reason == "tests.helpers.tasks.BoomError: kaboom"


def test_attempts_option__a_failed_attempt_is_retried_and_its_error_kept(broker):
    tasks = {
        "default": {
            "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
            "OPTIONS": {"JOB_TYPES": {"default": "email"}, "ATTEMPTS": 2},
        }
    }
    FLAKY_CALLS.clear()
    with override_settings(TASKS=tasks):
        result = flaky.enqueue()
        run_worker(broker, "email")
        done = flaky.get_result(result.id)
        with pytest.raises(TaskResultDoesNotExist):  # one queue: no lookup across queues
            flaky.get_result("f" * 32)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == "second attempt"
    assert done.attempts == 2 and len(FLAKY_CALLS) == 2
    (error,) = done.errors  # the first attempt's
    assert error.exception_class is BoomError and "first attempt" in error.traceback


def test_backoff_option__spaces_the_attempts_as_bullmq_does(broker, redis_client):
    tasks = {
        "default": {
            "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
            "OPTIONS": {
                "JOB_TYPES": {"default": "email"},
                "ATTEMPTS": 2,
                "BACKOFF": {"type": "exponential", "delay": 20},
            },
        }
    }
    FLAKY_CALLS.clear()
    with override_settings(TASKS=tasks):
        result = flaky.enqueue()
        opts = json.loads(redis_client.hget(f"{broker.prefix}:email:{result.id}", "opts"))
        assert opts["backoff"] == {"type": "exponential", "delay": 20}
        run_worker(broker, "email")
        done = flaky.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.attempts == 2


@pytest.mark.serial  # failed beside the parallel part on Django 6.1; passes alone
def test_durable_option__the_job_is_written_in_the_transaction_and_added_after_commit(
    broker, redis_client
):
    tasks = {
        "default": {
            "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
            "OPTIONS": {"JOB_TYPES": {"default": "email"}, "DURABLE": True},
        }
    }
    key = f"{broker.prefix}:email:{{}}"
    with override_settings(TASKS=tasks):
        with transaction.atomic():
            result = add.enqueue(1, 2)
            assert not redis_client.exists(key.format(result.id))  # not before commit
            pending = add.get_result(result.id)  # read from the outbox
            assert pending.status == TaskResultStatus.READY and pending.args == [1, 2]
        assert redis_client.exists(key.format(result.id))  # relayed at commit
        assert not OutboxJob.objects.exists()
        with pytest.raises(RuntimeError), transaction.atomic():
            rolled_back = add.enqueue(3, 4)
            raise RuntimeError("the view failed")
        assert not redis_client.exists(key.format(rolled_back.id))
        assert not OutboxJob.objects.exists()
        run_worker(broker, "email")
        assert add.get_result(result.id).return_value["sum"] == 3


def test_get_result__a_return_value_json_cannot_hold_fails_the_task(broker):
    result = unserialisable.enqueue()
    run_worker(broker, "email")
    failed = unserialisable.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class_path == "builtins.TypeError"
    assert "return value of task" in failed.errors[0].traceback


def test_get_result__unknown_or_malformed_ids_do_not_exist(fq_prefix):
    for result_id in ("nope", "", "a:b", "x" * 300):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


def test_get_result__a_job_that_is_not_a_task_does_not_exist(broker):
    (added,) = asyncio.run(_add_raw(broker, {"plain": True}))
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(added)


def test_takes_context__the_task_sees_its_result_id_and_attempt(broker):
    result = with_context.enqueue(7)
    run_worker(broker, "email")
    assert with_context.get_result(result.id).return_value == {
        "attempt": 1,
        "id": result.id,
        "x": 7,
    }


def test_report_queue__tasks_go_to_the_job_type_of_their_queue_name(broker, redis_client):
    result = add.using(queue_name="report").enqueue(1, 1)
    assert redis_client.exists(f"{broker.prefix}:report:{result.id}")
    run_worker(broker, "report")
    assert add.get_result(result.id).return_value["sum"] == 2


# -- run_after --------------------------------------------------------------------------


def test_run_after__becomes_a_bullmq_delay_and_runs_after_it(broker, redis_client):
    run_after = timezone.now() + timedelta(milliseconds=1500)
    result = add.using(run_after=run_after).enqueue(1, 2)
    stored = job_hash(redis_client, broker.prefix, result.id)
    assert 1000 <= int(stored["delay"]) <= 1500
    assert redis_client.zscore(f"{broker.prefix}:email:delayed", result.id) is not None
    ready = add.get_result(result.id)
    assert ready.status == TaskResultStatus.READY and ready.task.run_after == run_after
    run_worker(broker, "email")  # burst mode waits for delayed jobs
    done = add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.started_at >= run_after - timedelta(milliseconds=50)


# -- async ------------------------------------------------------------------------------


def test_aenqueue_and_aget_result__async_views_use_the_same_path(broker, redis_client, settings):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "AUDIT_EXPLICIT_PRIORITY": True}

    async def enqueue():
        return await async_add.aenqueue(4, 5), await record_critical.aenqueue("c", tenant_id="t")

    async def enqueue_and_close():
        try:
            return await enqueue()
        finally:  # the audit row was written from sync_to_async's thread
            from django.db import connections

            await sync_to_async(connections.close_all)()

    first, second = asyncio.run(enqueue_and_close())
    data = json.loads(job_hash(redis_client, broker.prefix, second.id)["data"])
    assert (data["tenantId"], data["priorityLevel"]) == ("t", "critical")
    assert PriorityOverrideAudit.objects.filter(job_id=second.id).count() == 1
    run_worker(broker, "email")

    async def read():
        result = await async_add.aget_result(first.id)
        await second.arefresh()
        return result

    result = asyncio.run(read())
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 9
    assert second.status == TaskResultStatus.SUCCESSFUL and second.return_value == "c"


# -- what a worker refuses to run -------------------------------------------------------


async def _add_raw(broker: Broker, *payloads: dict) -> list[str]:
    try:
        jobs = [NewJob(name="email", data=p, level=PriorityLevel.NORMAL) for p in payloads]
        return [added.job_id for added in await broker.adding.add_jobs("email", jobs)]
    finally:
        await broker.close()


def _task_data(path: str) -> dict:
    return {
        "djangoTask": {
            "path": path,
            "args": [],
            "kwargs": {},
            "backend": "default",
            "queueName": "default",
            "priority": 0,
            "runAfter": None,
        }
    }


def test_worker__runs_only_task_functions_never_an_arbitrary_path(broker, redis_client):
    sys.modules.pop("antigravity", None)
    paths = (
        "tests.helpers.tasks.plain_function",  # a function, not a @task
        "os.system",  # imported, not a task
        "antigravity.fly",  # would import a module that belongs to no app
        "not a path",
    )
    ids = asyncio.run(_add_raw(broker, *(_task_data(p) for p in paths), {"djangoTask": 1}))
    run_worker(broker, "email")
    reasons = [redis_client.hget(f"{broker.prefix}:email:{i}", "failedReason") for i in ids]
    assert "'plain_function' in 'tests.helpers.tasks' is not a function decorated" in (reasons[0])
    assert "'system' in 'os' is not a function decorated with @task" in reasons[1]
    assert "module 'antigravity' is not imported and belongs to no installed app" in reasons[2]
    assert "expected 'module.function'" in reasons[3]
    assert "job data['djangoTask'] is not allowed" in reasons[4]
    assert "antigravity" not in sys.modules


# -- a stock Node worker ----------------------------------------------------------------


@pytest.mark.serial  # a live Node worker's order: beside other processes it starves
def test_node_worker__takes_task_jobs_in_the_fair_order(node_worker, fq_prefix, redis_client):  # noqa: F811
    crit = [record_critical.enqueue(f"c{i}").id for i in range(8)]
    low = [record_low.enqueue(f"l{i}").id for i in range(2)]
    assert run_node_worker(node_worker, fq_prefix, 10) == crit[:4] + low[:1] + crit[4:] + low[1:]
    # What the Node worker saw is the task's path and arguments, as plain JSON.
    data = json.loads(job_hash(redis_client, fq_prefix, crit[0])["data"])
    assert data["djangoTask"]["path"] == "tests.helpers.tasks.record_critical"
    assert data["djangoTask"]["args"] == ["c0"]


# -- a fresh project: pip install, TASKS, @task, manage.py ------------------------------


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("django_tasks") is None,
    reason="the backport's fresh project; Django 6.1's is tests/redis/test_django6.py",
)
def test_fresh_project__tasks_setting_and_task_decorator_run_in_the_fair_order(
    tmp_path, fq_prefix, installed_wheel
):
    """A project that only adds fairqueue and django_tasks to INSTALLED_APPS, a TASKS
    setting and @task functions, with fairqueue pip-installed from its wheel: manage.py
    enqueues and fairqueue_worker runs the jobs in the fair order (real processes, as a
    user would run them)."""
    ran = tmp_path / "ran.txt"
    manage = shop_project(
        tmp_path,
        tasks_py="""
            import os
            from django_tasks import task

            def _log(label):
                with open(os.environ["RAN_FILE"], "a") as out:
                    out.write(label + "\\n")

            @task(priority=75)
            def urgent(label, tenant_id=None):
                _log(label)

            @task(priority=-75)
            def batch(label, tenant_id=None):
                _log(label)
            """,
        apps=("fairqueue", "django_tasks"),
        redis_url=REDIS_URL,
        prefix=fq_prefix,
        site=installed_wheel,
        RAN_FILE=str(ran),
    )
    manage("migrate", "--noinput", "-v", "0")
    # The app's commands, and not the demo project's: no demo superuser or runserver in a
    # user's project.
    commands = manage("help", "--commands").split()
    assert {"fairqueue_worker", "rebalance_fair", "fairqueue_relay"} <= set(commands), commands
    assert "fairqueue_demo" not in commands, commands
    imported_from = manage("shell", "-c", "import fairqueue; print(fairqueue.__file__)")
    assert Path(imported_from.split()[-1]).is_relative_to(installed_wheel), imported_from
    manage(
        "shell",
        "-c",
        "from shop.tasks import urgent, batch\n"
        "for i in range(8): urgent.enqueue(f'u{i}', tenant_id='acme')\n"
        "for i in range(2): batch.enqueue(f'b{i}', tenant_id='tiny')\n",
    )
    manage("fairqueue_worker", "--burst", "-v", "0")
    u, b = [f"u{i}" for i in range(8)], [f"b{i}" for i in range(2)]
    assert ran.read_text().split() == u[:4] + b[:1] + u[4:] + b[1:]


# -- a Redis Cluster --------------------------------------------------------------------


def test_cluster__enqueue_run_and_get_result_across_queues_on_different_masters(on_cluster):  # noqa: F811
    """Task jobs on a private 3-master cluster (tests/e2e/test_cluster.py's fixtures): the
    queues' hash tags keep each job's keys on one slot, and get_result finds a job among
    queues on different masters."""
    crit = [record_critical.enqueue(f"c{i}").id for i in range(4)]
    low = record_low.enqueue("l0").id
    report = add.using(queue_name="report").enqueue(20, 22).id
    Worker(["email", "report"], burst=True, install_signal_handlers=False).run()
    assert RAN == ["c0", "c1", "c2", "c3", "l0"]
    assert add.get_result(report).return_value == {"sum": 42, "parts": [20, 22]}
    assert record_low.get_result(low).status == TaskResultStatus.SUCCESSFUL
    assert [record_critical.get_result(i).return_value for i in crit] == ["c0", "c1", "c2", "c3"]
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result("0" * 31 + "a")
