"""enqueue_job and friends against a real Redis server and the real bullmq package."""

import asyncio
import contextlib
import json
import socket
import threading
import warnings

import pytest
import redis
from django.db import transaction
from django.http import JsonResponse
from django.urls import path

from fairqueue import conf
from fairqueue.broker import MAX_PRIORITY, RESERVED_JOB_IDS, TAG_FLOOR, close_brokers
from fairqueue.enqueue import priority
from fairqueue.enqueue.api import aenqueue_job, enqueue_job, enqueue_jobs, enqueue_on_commit
from fairqueue.exceptions import (
    BrokerError,
    BrokerRejectedError,
    BrokerUnavailableError,
    ConflictingPayloadError,
    ConflictingPriorityError,
    ImplicitInternalJobWarning,
    InvalidJobOptionError,
    InvalidPayloadError,
    InvalidPriorityError,
    InvalidPriorityLevelError,
    InvalidTenantError,
    InvalidTenantWeightError,
    PayloadTooLargeError,
    UnknownJobTypeError,
)
from fairqueue.models import PriorityOverrideAudit, TenantPlan
from fairqueue.scheduling.levels import MAX_PAYLOAD_DEPTH
from tests.helpers import drain_with_stock_worker, free_port, metric, metric_delta, wait_until
from tests.helpers.keys import REDIS_URL, TEST_QUEUES

pytestmark = pytest.mark.django_db


def job_hash(redis_client, prefix, job_id, queue="email"):
    return redis_client.hgetall(f"{prefix}:{queue}:{job_id}")


def waiting_count(redis_client, prefix, queue="email"):
    return redis_client.zcard(f"{prefix}:{queue}:prioritized") + redis_client.llen(
        f"{prefix}:{queue}:wait"
    )


@pytest.fixture
def plans(db):
    TenantPlan.objects.create(tenant_id="acme", plan_tier="enterprise")
    TenantPlan.objects.create(tenant_id="bolt", plan_tier="pro")
    TenantPlan.objects.create(tenant_id="cafe", plan_tier="free")
    priority.wire_tenant_plan_lookup()


def test_done_when__plans_internal_and_override_round_trip_through_redis(
    fq_prefix, redis_client, plans
):
    cases = [
        ({"tenant_id": "acme"}, "acme", "critical", 1, "plan"),
        ({"tenant_id": "bolt"}, "bolt", "normal", 5, "plan"),
        ({"tenant_id": "cafe"}, "cafe", "low", 10, "plan"),
        ({"tenant_id": "nobody"}, "nobody", "normal", 5, "no_plan"),
        ({"internal": True}, None, "critical", 1, "internal"),
        (
            {"tenant_id": "cafe", "priority_override": "critical", "actor": "ops"},
            "cafe",
            "critical",
            1,
            "override",
        ),
    ]
    enqueued = []
    for kwargs, tenant, level, numeric, rule in cases:
        job = enqueue_job("email", {"to": "someone"}, source="test", **kwargs)
        assert (job.level, job.numeric_priority, job.rule) == (level, numeric, rule)
        stored = job_hash(redis_client, fq_prefix, job.job_id)
        data = json.loads(stored["data"])
        assert data == {"to": "someone", "tenantId": tenant, "priorityLevel": level}
        score = redis_client.zscore(f"{fq_prefix}:email:prioritized", job.job_id)
        assert int(score) // 2**32 == job.bullmq_priority >= TAG_FLOOR  # placed by tag
        assert int(stored["priority"]) == MAX_PRIORITY  # where BullMQ re-adds a re-run
        enqueued.append(job)

    audits = list(PriorityOverrideAudit.objects.all())
    assert len(audits) == 1
    audit = audits[0]
    assert (audit.job_id, audit.tenant_id, audit.requested_override) == (
        enqueued[-1].job_id,
        "cafe",
        "critical",
    )
    assert (audit.resolved_level, audit.numeric_priority, audit.rule) == ("critical", 1, "override")
    assert (audit.job_type, audit.queue, audit.source, audit.actor) == (
        "email",
        "email",
        "test",
        "ops",
    )

    processed = drain_with_stock_worker(fq_prefix, "email", len(cases))
    assert sorted(job_id for job_id, _ in processed) == sorted(job.job_id for job in enqueued)


def test_flag__job_priority_enabled_false_neutralises_plans(fq_prefix, plans, monkeypatch):
    from fairqueue import conf

    monkeypatch.setenv("JOB_PRIORITY_ENABLED", "false")
    conf.reload_settings()
    assert enqueue_job("email", {}, tenant_id="acme").level == "normal"
    assert enqueue_job("email", {}, internal=True).level == "critical"
    monkeypatch.setenv("JOB_PRIORITY_ENABLED", "true")
    conf.reload_settings()
    assert enqueue_job("email", {}, tenant_id="acme").level == "critical"


def test_no_tenant_argument__normal_in_default_bucket(fq_prefix, redis_client):
    job = enqueue_job("report", {"n": 1})
    data = json.loads(job_hash(redis_client, fq_prefix, job.job_id, "report")["data"])
    assert data == {"n": 1, "tenantId": "default", "priorityLevel": "normal"}


def test_explicit_priority_on_tenant_job_is_not_audited_by_default(fq_prefix):
    job = enqueue_job("email", {}, tenant_id="t1", priority=2, actor="svc")
    level = enqueue_job("email", {}, tenant_id="t1", priority_level="low", source="view")
    batch = enqueue_jobs("email", [{}, {}], tenant_id="t1", priority_level="critical")
    assert (job.level, job.numeric_priority, job.rule) == ("high", 2, "explicit_priority")
    assert (level.level, level.rule) == ("low", "explicit_level")
    assert [job.audited for job in (job, level, *batch)] == [False] * 4
    assert PriorityOverrideAudit.objects.count() == 0


def test_explicit_priority_on_tenant_job_is_audited_with_audit_explicit_priority(
    fq_prefix, settings
):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "AUDIT_EXPLICIT_PRIORITY": True}
    job = enqueue_job("email", {}, tenant_id="t1", priority=2, actor="svc")
    assert (job.level, job.numeric_priority, job.audited) == ("high", 2, True)
    audit = PriorityOverrideAudit.objects.get()
    assert (audit.requested_priority, audit.rule, audit.requested_override) == (
        2,
        "explicit_priority",
        "",
    )
    enqueue_job("email", {}, priority_level="low")  # not a tenant job: not audited
    assert PriorityOverrideAudit.objects.count() == 1
    batch = enqueue_jobs("email", [{}, {}], tenant_id="t1", priority_level="low")
    assert [job.audited for job in batch] == [True, True]
    assert PriorityOverrideAudit.objects.filter(requested_level="low").count() == 2


def test_matching_payload_fields_are_accepted(fq_prefix):
    job = enqueue_job("email", {"tenantId": "t1", "priorityLevel": "normal"}, tenant_id="t1")
    assert job.tenant_id == "t1"


def test_enqueue_metrics(fq_prefix, plans):
    with (
        metric_delta("queue_jobs_enqueued_total", queue="email", priority="critical") as crit,
        metric_delta(
            "queue_fair_priority_assigned_total", job_type="email", priority_level="low"
        ) as low,
    ):
        enqueue_job("email", {}, tenant_id="acme")
        enqueue_job("email", {}, tenant_id="cafe")
        enqueue_job("email", {}, tenant_id="cafe")
    assert crit() == 1
    assert low() == 2
    # Series for other levels exist at zero.
    assert metric("queue_jobs_enqueued_total", queue="email", priority="other") == 0


def test_placement__tags_interleave_levels_by_weight_for_a_stock_worker(fq_prefix):
    crit = enqueue_jobs("email", [{"k": i} for i in range(8)], priority_level="critical")
    low = enqueue_jobs("email", [{"k": i} for i in range(2)], priority_level="low")
    order = [job_id for job_id, _ in drain_with_stock_worker(fq_prefix, "email", 10)]
    c, lo = [j.job_id for j in crit], [j.job_id for j in low]
    assert order == c[:4] + lo[:1] + c[4:] + lo[1:]


def test_enqueue_jobs__one_batch_all_or_nothing(fq_prefix, redis_client):
    with pytest.raises(InvalidPayloadError):
        enqueue_jobs("email", [{"ok": 1}, {"bad": object()}])
    assert waiting_count(redis_client, fq_prefix) == 0
    jobs = enqueue_jobs("email", [{"i": i} for i in range(50)], tenant_id="t")
    assert len({job.job_id for job in jobs}) == 50
    assert waiting_count(redis_client, fq_prefix) == 50


def test_duplicate_job_id__bullmq_keeps_the_first(fq_prefix, redis_client):
    first = enqueue_job("email", {"v": 1}, job_id="welcome-42", priority_override="high")
    second = enqueue_job("email", {"v": 2}, job_id="welcome-42", priority_override="high")
    assert first.created and not second.created
    assert json.loads(job_hash(redis_client, fq_prefix, "welcome-42")["data"])["v"] == 1
    assert PriorityOverrideAudit.objects.count() == 1


def test_delayed_job_waits_at_the_back_of_the_line(fq_prefix, redis_client):
    job = enqueue_job("email", {}, delay_ms=60_000, attempts=3)
    assert redis_client.zscore(f"{fq_prefix}:email:delayed", job.job_id) is not None
    assert int(job_hash(redis_client, fq_prefix, job.job_id)["priority"]) > 0


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit__rollback_leaves_nothing(fq_prefix, redis_client):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_on_commit("email", {"a": 1}, tenant_id="t1", priority_override="critical")
        raise RuntimeError("view failed")
    assert waiting_count(redis_client, fq_prefix) == 0
    assert PriorityOverrideAudit.objects.count() == 0

    with transaction.atomic():
        enqueue_on_commit("email", {"a": 2}, tenant_id="t1", priority_override="critical")
        assert waiting_count(redis_client, fq_prefix) == 0
    assert waiting_count(redis_client, fq_prefix) == 1
    assert PriorityOverrideAudit.objects.count() == 1


def test_enqueue_on_commit__validates_immediately(fq_prefix):
    with pytest.raises(UnknownJobTypeError):
        enqueue_on_commit("nope", {})


# -- internal jobs: by intent, or by tenant_id=None (which warns) ---------------------------


def test_internal__by_intent_is_critical_of_no_tenant_and_warns_nothing(fq_prefix, redis_client):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        job = enqueue_job("email", {"n": 1}, internal=True)
        batch = enqueue_jobs("email", [{"n": 2}, {"n": 3}], internal=True)
    assert (job.level, job.rule, job.tenant_id) == ("critical", "internal", None)
    assert [(j.level, j.tenant_id) for j in batch] == [("critical", None)] * 2
    data = json.loads(job_hash(redis_client, fq_prefix, job.job_id)["data"])
    assert data == {"n": 1, "tenantId": None, "priorityLevel": "critical"}


def test_internal__tenant_id_none_alone_keeps_the_rule_and_warns_at_the_call(fq_prefix):
    with pytest.warns(ImplicitInternalJobWarning, match="pass internal=True") as caught:
        job = enqueue_job("email", {}, tenant_id=None)
    assert (job.level, job.rule, job.tenant_id) == ("critical", "internal", None)
    # Pointing at the caller, not at fairqueue: `-W error::...` finds each call site.
    assert [w.filename for w in caught] == [__file__]
    with pytest.warns(ImplicitInternalJobWarning):
        enqueue_jobs("email", [{}], tenant_id=None)


@pytest.mark.django_db(transaction=True)
def test_internal__with_a_tenant_or_not_a_bool_is_refused_and_writes_nothing(
    fq_prefix, redis_client
):
    with pytest.raises(InvalidTenantError, match=r"internal=True with tenant_id='acme'"):
        enqueue_job("email", {}, internal=True, tenant_id="acme")
    with pytest.raises(InvalidJobOptionError, match=r"internal='yes' is not allowed"):
        enqueue_job("email", {}, internal="yes")
    with transaction.atomic():
        with pytest.raises(InvalidTenantError):
            enqueue_on_commit("email", {}, internal=True, tenant_id="acme")
    assert redis_client.keys(f"{fq_prefix}:*") == []


@pytest.mark.django_db(transaction=True)
def test_internal__aenqueue_job_warns_at_the_async_caller_and_accepts_internal(fq_prefix):
    async def main():
        with pytest.warns(ImplicitInternalJobWarning) as caught:
            implicit = await aenqueue_job("email", {}, tenant_id=None)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            explicit = await aenqueue_job("email", {}, internal=True)
        return implicit, explicit, caught

    try:
        implicit, explicit, caught = asyncio.run(main())
    finally:
        close_brokers()
    assert [w.filename for w in caught] == [__file__]
    assert implicit.level == explicit.level == "critical"
    assert implicit.tenant_id is explicit.tenant_id is None


@pytest.mark.django_db(transaction=True)
def test_aenqueue_job__async_twin(fq_prefix, redis_client, plans):
    async def main():
        from asgiref.sync import sync_to_async
        from django.db import connections

        job = await aenqueue_job("email", {"x": 1}, tenant_id="acme", priority_override="low")
        # As Django does at the end of an async request: close the ORM thread's connection.
        await sync_to_async(connections.close_all)()
        return job

    try:
        job = asyncio.run(main())
    finally:
        close_brokers()
    assert (job.level, job.rule, job.audited) == ("low", "override", True)
    assert PriorityOverrideAudit.objects.get().job_id == job.job_id
    assert waiting_count(redis_client, fq_prefix) == 1


# --- tenant weights ---------------------------------------------------------------


@pytest.fixture
def weighted_plans(db):
    TenantPlan.objects.create(tenant_id="acme", plan_tier="enterprise", weight=4)
    TenantPlan.objects.create(tenant_id="cafe", plan_tier="free")
    priority.wire_tenant_plan_lookup()


def test_tenant_weight__looked_up_weight_is_reported_and_the_payload_unchanged(
    fq_prefix, redis_client, weighted_plans
):
    heavy = enqueue_job("email", {"n": 1}, tenant_id="acme")
    light = enqueue_job("email", {"n": 2}, tenant_id="cafe")
    internal = enqueue_job("email", {"n": 3}, internal=True)
    untenanted = enqueue_job("email", {"n": 4})
    assert [j.tenant_weight for j in (heavy, light, internal, untenanted)] == [4, 1, 1, 1]
    data = json.loads(job_hash(redis_client, fq_prefix, heavy.job_id)["data"])
    assert data == {"n": 1, "tenantId": "acme", "priorityLevel": "critical"}


def test_tenant_weight__explicit_weight_wins_in_every_enqueue_function(
    fq_prefix, redis_client, weighted_plans, django_capture_on_commit_callbacks
):
    assert enqueue_job("email", {}, tenant_id="acme", tenant_weight=2).tenant_weight == 2
    batch = enqueue_jobs("email", [{}, {}], tenant_id="cafe", tenant_weight=9)
    assert [job.tenant_weight for job in batch] == [9, 9]
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        enqueue_on_commit("email", {}, tenant_id="acme", tenant_weight=3)
    assert len(callbacks) == 1
    assert waiting_count(redis_client, fq_prefix) == 4


@pytest.mark.django_db(transaction=True)
def test_tenant_weight__aenqueue_job_accepts_an_explicit_weight(fq_prefix, redis_client):
    try:
        job = asyncio.run(aenqueue_job("email", {}, tenant_id="acme", tenant_weight=100))
    finally:
        close_brokers()
    assert (job.tenant_id, job.tenant_weight) == ("acme", 100)
    assert waiting_count(redis_client, fq_prefix) == 1


# --- payload size cap ---------------------------------------------------------------

SMALL_CAP = 1_024


@pytest.fixture
def small_payload_cap(settings, fq_prefix):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "MAX_PAYLOAD_BYTES": SMALL_CAP}
    return SMALL_CAP


def _payload_of_stored_size(size, tenant_id="t1", level="normal"):
    """A payload whose data, as BullMQ stores it, is exactly ``size`` bytes."""
    payload = {"pad": "é"}
    merged = {**payload, "tenantId": tenant_id, "priorityLevel": level}
    overhead = len(json.dumps(merged, separators=(",", ":")))
    payload["pad"] += "x" * (size - overhead)
    return payload


def test_payload_cap__a_payload_of_exactly_the_limit_is_stored_with_that_size(
    small_payload_cap, fq_prefix, redis_client
):
    job = enqueue_job("email", _payload_of_stored_size(SMALL_CAP), tenant_id="t1")
    stored = job_hash(redis_client, fq_prefix, job.job_id)["data"]
    assert len(stored.encode()) == SMALL_CAP  # what fairqueue measured is what BullMQ wrote


# --- bad input: one test per case; nothing is left behind ---------------------------


@pytest.fixture
def nothing_left_behind(fq_prefix, redis_client):
    before = {
        q: metric("queue_jobs_enqueued_total", queue=q, priority=p)
        for q in TEST_QUEUES
        for p in ("critical", "normal", "low")
    }
    yield
    for queue in TEST_QUEUES:
        assert waiting_count(redis_client, fq_prefix, queue) == 0
        assert redis_client.zcard(f"{fq_prefix}:{queue}:delayed") == 0
    assert PriorityOverrideAudit.objects.count() == 0
    after = {
        q: metric("queue_jobs_enqueued_total", queue=q, priority=p)
        for q in TEST_QUEUES
        for p in ("critical", "normal", "low")
    }
    assert after == before


@pytest.mark.usefixtures("nothing_left_behind")
class TestBadInput:
    def test_unknown_job_type(self):
        with pytest.raises(UnknownJobTypeError, match=r"job_type='sms' is not allowed.*'email'"):
            enqueue_job("sms", {})

    def test_unknown_level(self):
        with pytest.raises(InvalidPriorityLevelError, match="priority_level='urgent'"):
            enqueue_job("email", {}, tenant_id="t", priority_level="urgent")

    def test_unknown_override(self):
        with pytest.raises(InvalidPriorityLevelError, match="priority_override='asap'"):
            enqueue_job("email", {}, tenant_id="t", priority_override="asap")

    def test_unknown_plan(self):
        from django.core.exceptions import ValidationError

        from fairqueue.exceptions import InvalidPlanError
        from fairqueue.plans import parse_plan

        with pytest.raises(ValidationError, match="plan_tier='platinum' is not allowed"):
            TenantPlan(tenant_id="t", plan_tier="platinum").full_clean()
        with pytest.raises(InvalidPlanError, match="plan='platinum'.*'enterprise', 'pro'"):
            parse_plan("platinum")

    def test_both_priority_and_level(self):
        with pytest.raises(ConflictingPriorityError, match="priority=1 and priority_level='low'"):
            enqueue_job("email", {}, priority=1, priority_level="low")

    @pytest.mark.parametrize("bad", [1.5, "1", True])
    def test_non_integer_priority(self, bad):
        with pytest.raises(InvalidPriorityError, match="expected a non-negative integer"):
            enqueue_job("email", {}, priority=bad)

    def test_negative_priority(self):
        with pytest.raises(InvalidPriorityError, match="priority=-1"):
            enqueue_job("email", {}, priority=-1)

    @pytest.mark.parametrize("bad", ["", "x" * 256, 7])
    def test_bad_tenant_id(self, bad):
        with pytest.raises(InvalidTenantError, match="at most 255 characters"):
            enqueue_job("email", {}, tenant_id=bad)

    @pytest.mark.parametrize("bad", [[1, 2], "text", None])
    def test_payload_not_a_json_object(self, bad):
        with pytest.raises(InvalidPayloadError, match="expected a JSON object"):
            enqueue_job("email", bad)

    @pytest.mark.parametrize("bad", [{"when": object()}, {"x": float("nan")}, {1: "int key"}])
    def test_payload_not_json_serialisable(self, bad):
        with pytest.raises(InvalidPayloadError, match="payload is not allowed"):
            enqueue_job("email", bad)

    def test_conflicting_tenant_in_payload(self):
        with pytest.raises(ConflictingPayloadError, match=r"payload\['tenantId'\]") as info:
            enqueue_job("email", {"tenantId": "secret-tenant"}, tenant_id="t1")
        assert "secret-tenant" not in str(info.value)

    def test_conflicting_level_in_payload(self):
        with pytest.raises(ConflictingPayloadError, match=r"payload\['priorityLevel'\]"):
            enqueue_job("email", {"priorityLevel": "critical"}, tenant_id="t1")

    @pytest.mark.parametrize(
        ("option", "value"),
        [("job_id", "123"), ("job_id", "a:b"), ("delay_ms", -1), ("attempts", 0)],
    )
    def test_bad_job_options(self, option, value):
        with pytest.raises(InvalidJobOptionError, match=f"{option}="):
            enqueue_job("email", {}, **{option: value})

    @pytest.mark.parametrize(("option", "value"), [("job_id", "x-1"), ("delay_ms", 5)])
    def test_per_job_options_in_a_batch(self, option, value):
        with pytest.raises(InvalidJobOptionError, match=f"{option}=.* enqueue_jobs"):
            enqueue_jobs("email", [{}], **{option: value})

    @pytest.mark.parametrize("bad", [0, 101, True, "2", 2.5])
    def test_bad_tenant_weight(self, bad):
        message = rf"tenant_weight={bad!r} is not allowed: expected an integer in 1\.\.100"
        with pytest.raises(InvalidTenantWeightError, match=message):
            enqueue_job("email", {}, tenant_id="t1", tenant_weight=bad)
        with pytest.raises(InvalidTenantWeightError):
            enqueue_jobs("email", [{}], tenant_id="t1", tenant_weight=bad)
        with pytest.raises(InvalidTenantWeightError):
            enqueue_on_commit("email", {}, tenant_id="t1", tenant_weight=bad)

    def test_payload_one_byte_over_the_limit(self, small_payload_cap):
        payload = _payload_of_stored_size(SMALL_CAP + 1, level="critical")
        with pytest.raises(PayloadTooLargeError) as info:
            enqueue_job("email", payload, tenant_id="t1", priority_override="critical")
        message = str(info.value)
        assert "payload of 1025 bytes is not allowed" in message
        assert "at most 1024 bytes" in message
        assert "MAX_PAYLOAD_BYTES" in message
        assert "xxxx" not in message and "t1" not in message
        assert isinstance(info.value, InvalidPayloadError)

    def test_payload_over_the_default_limit_of_1_mib(self):
        with pytest.raises(PayloadTooLargeError, match="at most 1048576 bytes"):
            enqueue_job("email", {"blob": "x" * 1_048_576})

    def test_payload_too_large_in_a_batch_sends_none_of_it(self, small_payload_cap):
        with pytest.raises(PayloadTooLargeError):
            enqueue_jobs("email", [{"ok": 1}, {"big": "x" * SMALL_CAP}], tenant_id="t1")

    def test_payload_too_large_on_commit_raises_at_once(self, small_payload_cap):
        with pytest.raises(PayloadTooLargeError):
            enqueue_on_commit("email", {"big": "x" * SMALL_CAP})

    def test_redis_unreachable(self, settings, fq_prefix):
        from fairqueue import conf

        url = "redis://:pw-secret@127.0.0.1:1/3"
        settings.FAIRQUEUE = {**settings.FAIRQUEUE, "REDIS_URL": url}
        conf.reload_settings()
        with pytest.raises(BrokerUnavailableError) as info:
            enqueue_job("email", {}, tenant_id="t1", priority_override="critical")
        # Where it looked and which setting said so: what to fix; never the password.
        assert str(info.value) == (
            "Redis is unavailable at 127.0.0.1:1/3 (from FAIRQUEUE['REDIS_URL']): ConnectionError"
        )


def _enqueue_in_child(conn):
    try:
        job = enqueue_job("email", {"from": "child"})
        conn.send(job.job_id)
    except Exception as exc:  # report to the parent instead of dying silently
        conn.send(repr(exc))


def test_fork_safe__a_forked_process_gets_its_own_connections(fq_prefix, redis_client):
    import multiprocessing

    from fairqueue.broker import get_sync_broker

    first = enqueue_job("email", {"from": "parent"})
    sync = get_sync_broker()
    sync.run(sync.broker.passes.counts, "email")  # the parent's event-loop thread is running too
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(target=_enqueue_in_child, args=(child_end,))
    child.start()
    child_job = parent_end.recv()
    child.join(10)
    assert child.exitcode == 0
    again = enqueue_job("email", {"from": "parent"})
    assert len({first.job_id, child_job, again.job_id}) == 3
    assert sync.run(sync.broker.passes.counts, "email")["prioritized"] == 3


def test_a_connection_redis_closed_is_replaced_before_the_next_enqueue(fq_prefix, redis_client):
    from fairqueue.broker import get_sync_broker

    enqueue_job("email", {})
    connection_id = get_sync_broker()._client().client_id()
    redis_client.client_kill_filter(_id=connection_id)  # as a restart or idle timeout would
    job = enqueue_job("email", {})
    assert job.created
    assert waiting_count(redis_client, fq_prefix) == 2


# --- audit before Redis, idempotency, partial batches -----------------------------


def _use_redis(settings, url):
    from fairqueue import conf

    close_brokers()
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "REDIS_URL": url}
    conf.reload_settings()


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"source": "view\x00"}, InvalidJobOptionError, "source"),
        ({"source": "\ud800"}, InvalidJobOptionError, "source"),
        ({"source": 42}, InvalidJobOptionError, "source"),
        ({"actor": "ops\x00"}, InvalidJobOptionError, "actor"),
        ({"priority": 2**31}, InvalidPriorityError, "priority=2147483648"),
    ],
)
def test_audit_fields_postgresql_would_refuse_raise_named_errors_before_anything(
    fq_prefix, redis_client, options, error, named
):
    options = {"priority_override": "high", **options}
    if "priority" in options:
        options.pop("priority_override")
    with pytest.raises(error, match=named):
        enqueue_job("email", {}, tenant_id="t", **options)
    assert waiting_count(redis_client, fq_prefix) == 0
    assert PriorityOverrideAudit.objects.count() == 0


def test_audit_row_is_inserted_before_the_add__a_refused_row_adds_no_job(
    fq_prefix, redis_client, monkeypatch
):
    from django.db import DatabaseError

    def refuse(*args, **kwargs):
        raise DatabaseError("the database refused the audit row")

    monkeypatch.setattr(PriorityOverrideAudit.objects, "bulk_create", refuse)
    with pytest.raises(DatabaseError):
        enqueue_job("email", {}, tenant_id="t", priority_override="critical")
    assert waiting_count(redis_client, fq_prefix) == 0


def test_a_failed_add_rolls_the_audit_row_back(fq_prefix, settings):
    from tests.helpers import free_port

    _use_redis(settings, f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(BrokerUnavailableError):
        enqueue_job("email", {}, tenant_id="t", priority_override="critical")
    assert PriorityOverrideAudit.objects.count() == 0


def test_job_id_is_the_idempotency_key__retry_after_an_ambiguous_timeout_adds_nothing(
    fq_prefix, redis_client, monkeypatch
):
    from fairqueue.broker import SyncBroker

    real_add = SyncBroker.add_jobs
    calls = []

    def add_then_lose_the_reply(self, queue, jobs, **options):
        added = real_add(self, queue, jobs, **options)
        calls.append(added)
        if len(calls) == 1:  # the add went through; the reply did not
            raise BrokerUnavailableError("Redis did not answer in time (TimeoutError)")
        return added

    monkeypatch.setattr(SyncBroker, "add_jobs", add_then_lose_the_reply)
    with pytest.raises(BrokerUnavailableError):
        enqueue_job("email", {"v": 1}, tenant_id="t", priority_override="high", job_id="inv-7")
    assert waiting_count(redis_client, fq_prefix) == 1
    assert PriorityOverrideAudit.objects.count() == 0  # rolled back with the failed call

    retry = enqueue_job("email", {"v": 1}, tenant_id="t", priority_override="high", job_id="inv-7")
    assert not retry.created and retry.audited
    assert waiting_count(redis_client, fq_prefix) == 1  # nothing added twice
    # The job that exists now has its audit row, exactly one.
    assert list(PriorityOverrideAudit.objects.values_list("job_id", flat=True)) == ["inv-7"]
    again = enqueue_job("email", {"v": 1}, tenant_id="t", priority_override="high", job_id="inv-7")
    assert not again.audited
    assert PriorityOverrideAudit.objects.count() == 1


class ReplyDroppingProxy:
    """A TCP proxy in front of Redis that, once armed, lets the next request through and
    drops its reply by closing the client's connection: a network failure after the
    send, where the command ran but the client cannot know."""

    def __init__(self, upstream_port: int, db: int = 0) -> None:
        self.upstream_port = upstream_port
        self.armed = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/{db}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while data := source.recv(65536):
                if replies and self.armed.is_set():
                    self.armed.clear()
                    break
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("way", ["enqueue_job", "aenqueue_job"])
def test_a_lost_reply_is_never_resent__one_job_and_broker_unavailable_error(
    way, fq_prefix, settings, redis_client
):
    """redis-py resends a command after a connection error by default; a resent add of a
    job without an id would enqueue it twice. fairqueue's clients never resend: the
    caller gets BrokerUnavailableError (and retries under a job id)."""
    proxy = ReplyDroppingProxy(
        redis_client.connection_pool.connection_kwargs["port"],
        redis_client.connection_pool.connection_kwargs["db"],
    )
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "REDIS_URL": proxy.url}
    conf.reload_settings()

    async def twice_async() -> None:
        await aenqueue_job("email", {"warm": True}, tenant_id="t")  # connects, loads scripts
        proxy.armed.set()
        with pytest.raises(BrokerUnavailableError):
            await aenqueue_job("email", {"lost": True}, tenant_id="t")

    try:
        if way == "enqueue_job":
            enqueue_job("email", {"warm": True}, tenant_id="t")
            proxy.armed.set()
            with pytest.raises(BrokerUnavailableError):
                enqueue_job("email", {"lost": True}, tenant_id="t")
        else:
            asyncio.run(twice_async())
    finally:
        close_brokers()
        proxy.close()
    assert waiting_count(redis_client, fq_prefix) == 2  # the warm-up job and the lost one


def test_audited_jobs_without_an_id_get_bullmqs_id_in_their_audit_rows(fq_prefix):
    jobs = enqueue_jobs("email", [{}] * 3, tenant_id="t", priority_override="low")
    assert sorted(PriorityOverrideAudit.objects.values_list("job_id", flat=True)) == sorted(
        job.job_id for job in jobs
    )
    assert all(job.audited and job.job_id for job in jobs)


def test_batch_failing_after_its_first_chunk_raises_partial_enqueue_error(
    fq_prefix, settings, tmp_path, monkeypatch
):
    from fairqueue.broker import SyncBroker
    from fairqueue.exceptions import PartialEnqueueError
    from tests.helpers import PrivateRedis

    server = PrivateRedis(tmp_path, aof=False).start()
    try:
        _use_redis(settings, server.url)
        real_add = SyncBroker.add_jobs

        def add_then_crash_redis(self, queue, jobs, **options):
            added = real_add(self, queue, jobs, **options)
            server.kill9()  # Redis dies after the first chunk: a real failure
            return added

        monkeypatch.setattr(SyncBroker, "add_jobs", add_then_crash_redis)
        payloads = [{"i": i} for i in range(600)]
        with pytest.raises(PartialEnqueueError) as caught:
            enqueue_jobs("email", payloads, tenant_id="t", priority_override="low")
        error = caught.value
        assert (error.added_count, error.uncertain, error.not_sent) == (250, 250, 100)
        assert "added 250 of 600 jobs" in str(error)
        assert isinstance(error.__cause__, BrokerUnavailableError)
        # The first chunk's jobs and their audit rows stay; the failed chunk's rolled back.
        assert sorted(PriorityOverrideAudit.objects.values_list("job_id", flat=True)) == sorted(
            error.job_ids
        )
    finally:
        server.stop()
        close_brokers()


def test_durable_option_writes_outbox_and_audit_rows_in_one_transaction(fq_prefix, settings):
    from fairqueue.models import OutboxJob
    from tests.helpers import free_port

    _use_redis(settings, f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_job("email", {}, tenant_id="t", priority_override="high", durable=True)
        enqueue_jobs("email", [{}, {}], tenant_id="t", priority_override="low", durable=True)
        assert OutboxJob.objects.count() == 3
        assert PriorityOverrideAudit.objects.count() == 3
        raise RuntimeError("rolled back")
    assert OutboxJob.objects.count() == 0
    assert PriorityOverrideAudit.objects.count() == 0
    job = enqueue_job("email", {}, tenant_id="t", priority_override="high", durable=True)
    assert job.durable and job.audited and not job.created
    assert (
        PriorityOverrideAudit.objects.get().job_id
        == job.job_id
        == OutboxJob.objects.get().bullmq_job_id
    )


# --- hardening: reserved ids, strict text, depth, unknown keywords ------------------


@pytest.mark.parametrize("job_id", sorted(RESERVED_JOB_IDS))
def test_reserved_job_id__refused_naming_the_value_and_the_rule(fq_prefix, redis_client, job_id):
    with pytest.raises(InvalidJobOptionError) as info:
        enqueue_job("email", {}, job_id=job_id)
    assert f"job_id={job_id!r} is not allowed" in str(info.value)
    assert "own Redis keys" in str(info.value) and "wait" in str(info.value)
    assert redis_client.keys(f"{fq_prefix}:*") == []


def test_reserved_job_id__bullmq_key_list_is_covered():
    from bullmq.queue_keys import QueueKeys

    assert {name for name in QueueKeys().getKeys("q") if name} <= RESERVED_JOB_IDS
    assert {"wait", "completed", "meta", "prioritized", "events", "id", "pc", "marker", "fq"} <= (
        RESERVED_JOB_IDS
    )


@pytest.mark.parametrize("job_id", ["wait", "completed", "meta", "prioritized", "marker"])
def test_reserved_job_id__the_queue_keeps_working_for_a_stock_worker(fq_prefix, job_id):
    # Before: "wait" made every worker fail with WRONGTYPE, "completed" stranded the
    # jobs after it, "meta" dropped the job.
    with pytest.raises(InvalidJobOptionError):
        enqueue_job("email", {"n": 0}, job_id=job_id)
    jobs = [enqueue_job("email", {"n": n}) for n in (1, 2)]
    processed = drain_with_stock_worker(fq_prefix, "email", 2, timeout_s=15)
    assert sorted(job_id for job_id, _ in processed) == sorted(job.job_id for job in jobs)


LONE = "\ud800"


@pytest.mark.parametrize("tenant_id", [LONE, f"acme{LONE}", "a\x00b"])
def test_strict_text__tenant_id_refused_in_every_enqueue_function_without_echo(
    fq_prefix, redis_client, tenant_id
):
    calls = [
        lambda: enqueue_job("email", {}, tenant_id=tenant_id),
        lambda: enqueue_jobs("email", [{}], tenant_id=tenant_id),
        lambda: enqueue_on_commit("email", {}, tenant_id=tenant_id),
        lambda: asyncio.run(aenqueue_job("email", {}, tenant_id=tenant_id)),
    ]
    for call in calls:
        with pytest.raises(InvalidTenantError, match="tenant_id=<.*valid UTF-8") as info:
            call()
        assert tenant_id not in str(info.value) and "acme" not in str(info.value)
    close_brokers()
    assert waiting_count(redis_client, fq_prefix) == 0


@pytest.mark.parametrize(
    "payload",
    [
        {"a": LONE},
        {LONE: 1},
        {"a": ["ok", {"b": f"x{LONE}"}]},
        {"a": {f"k{LONE}": "v"}},
    ],
)
def test_strict_text__lone_surrogate_in_payload_refused_without_echo(fq_prefix, payload):
    with pytest.raises(InvalidPayloadError, match="not valid UTF-8") as info:
        enqueue_job("email", payload)
    assert LONE not in str(info.value)


def test_strict_text__real_non_ascii_text_round_trips(fq_prefix, redis_client):
    payload = {"name": "Zoë 😀 日本", "ключ": ["ü"]}
    job = enqueue_job("email", payload, tenant_id="tenant-ü😀")
    data = json.loads(job_hash(redis_client, fq_prefix, job.job_id)["data"])
    assert data["name"] == "Zoë 😀 日本" and data["ключ"] == ["ü"]
    assert data["tenantId"] == "tenant-ü😀"


def test_strict_text__lone_surrogate_in_job_id_refused(fq_prefix):
    with pytest.raises(InvalidJobOptionError, match="job_id of 2 characters.*valid UTF-8"):
        enqueue_job("email", {}, job_id=f"x{LONE}")


def _nested(depth):
    payload = {}
    node = payload
    for _ in range(depth - 1):
        node["n"] = {}
        node = node["n"]
    return payload


def test_depth__payload_of_max_depth_accepted_one_deeper_refused(fq_prefix):
    assert enqueue_job("email", _nested(MAX_PAYLOAD_DEPTH)).created
    with pytest.raises(InvalidPayloadError, match=f"deeper than {MAX_PAYLOAD_DEPTH} levels"):
        enqueue_job("email", _nested(MAX_PAYLOAD_DEPTH + 1))


def test_depth__very_deep_payload_is_a_named_error_not_recursion_error(fq_prefix):
    deep: list = []
    node = deep
    for _ in range(5_000):
        node.append([])
        node = node[0]
    with pytest.raises(InvalidPayloadError, match="nests deeper"):
        enqueue_job("email", {"deep": deep})
    with pytest.raises(InvalidPayloadError, match="nests deeper"):
        enqueue_job("email", _nested(5_000))


@pytest.mark.parametrize("key", [1, 1.5, None, True, ("a",)])
def test_nested_non_string_key_refused(fq_prefix, key):
    # Before: {"a": {1: "x", "1": "y"}} was stored with the key "1" twice.
    with pytest.raises(InvalidPayloadError, match=f"a key of type {type(key).__name__} at depth 2"):
        enqueue_job("email", {"a": {key: "x", "1": "y"}})


@pytest.mark.parametrize("function", ["enqueue_job", "enqueue_jobs", "aenqueue_job", "on_commit"])
def test_unknown_keyword__named_with_the_allowed_ones(fq_prefix, redis_client, function):
    calls = {
        "enqueue_job": lambda: enqueue_job("email", {}, delay=5),
        "enqueue_jobs": lambda: enqueue_jobs("email", [{}], delay=5),
        "aenqueue_job": lambda: asyncio.run(aenqueue_job("email", {}, delay=5)),
        "on_commit": lambda: enqueue_on_commit("email", {}, delay=5),
    }
    with pytest.raises(InvalidJobOptionError) as info:
        calls[function]()
    message = str(info.value)
    assert "unknown keyword delay=5" in message
    assert "delay_ms" in message and "tenant_id" in message and "_prepare" not in message
    close_brokers()
    assert waiting_count(redis_client, fq_prefix) == 0


# --- hardening: connections of short-lived event loops ------------------------------


async def _async_enqueue_view(request):
    job = await aenqueue_job("email", {"n": request.GET["n"]}, tenant_id="t1")
    return JsonResponse({"id": job.job_id})


urlpatterns = [path("async-enqueue/", _async_enqueue_view)]


def _fairqueue_connections(redis_client, prefix):
    from fairqueue.broker.clients import client_name

    return [c for c in redis_client.client_list() if c.get("name") == client_name(prefix)]


@pytest.mark.serial  # 500 requests against a deadline: beside other processes it starves
@pytest.mark.urls("tests.redis.test_services")
@pytest.mark.django_db(transaction=True)
def test_async_view_under_wsgi__500_requests_leave_a_fixed_number_of_connections(
    client, fq_prefix, redis_client
):
    # Django's sync test client serves an async view as a WSGI server does: through
    # async_to_sync, a new event loop per request. Before: one connection per request.
    for n in range(500):
        assert client.get("/async-enqueue/", {"n": n}).status_code == 200
    assert waiting_count(redis_client, fq_prefix) == 500
    assert wait_until(lambda: len(_fairqueue_connections(redis_client, fq_prefix)) <= 2, 5)


# --- hardening: Redis error replies are BrokerError subclasses ----------------------


def test_error_reply__wrongtype_is_broker_rejected_error_without_payload(fq_prefix, redis_client):
    redis_client.set(f"{fq_prefix}:email:prioritized", "not a sorted set")
    with pytest.raises(BrokerRejectedError) as info:
        enqueue_job("email", {"secret": "s3cr3t-payload"}, tenant_id="tenant-x")
    assert info.value.redis_error == "ResponseError"
    assert isinstance(info.value, BrokerError)
    assert not isinstance(info.value, BrokerUnavailableError)
    message = str(info.value)
    assert "WRONGTYPE" in message
    assert "s3cr3t" not in message and "tenant-x" not in message and fq_prefix not in message
    with pytest.raises(BrokerRejectedError):
        asyncio.run(aenqueue_job("email", {}))
    close_brokers()


def test_error_reply__out_of_memory_is_broker_rejected_error(settings, tmp_path):
    from fairqueue import conf
    from tests.helpers.processes import start_private_redis

    port = free_port()
    server = start_private_redis(port, str(tmp_path))
    url = f"redis://127.0.0.1:{port}/0"
    settings.FAIRQUEUE = {"PREFIX": "fqoom", "QUEUES": {"email": "email"}, "REDIS_URL": url}
    conf.reload_settings()
    try:
        private = redis.Redis(port=port)
        private.config_set("maxmemory", "1")
        with pytest.raises(BrokerRejectedError) as info:
            enqueue_jobs("email", [{"n": n} for n in range(3_000)])
        assert info.value.redis_error == "OutOfMemoryError"
        assert "OutOfMemoryError" in str(info.value) and url not in str(info.value)
        private.config_set("maxmemory", "0")
        assert len(enqueue_jobs("email", [{"n": n} for n in range(10)])) == 10
        private.close()
    finally:
        close_brokers()
        server.kill()
        server.wait()
        conf.reload_settings()


# --- retention: finished jobs are trimmed by the workers ----------------------------


async def _run_worker(prefix, queue, count, fail, timeout_s=20.0):
    from bullmq import Worker

    finished = asyncio.Event()
    seen = []

    async def process(job, token):
        seen.append(job.id)
        if fail:
            raise RuntimeError("boom")
        return None

    worker = Worker(
        queue,
        process,
        {"connection": REDIS_URL, "prefix": prefix, "concurrency": 1, "autorun": False},
    )

    def done(*_args):
        if len(seen) >= count:
            finished.set()

    worker.on("completed", done)
    worker.on("failed", done)
    task = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait_for(finished.wait(), timeout_s)
    finally:
        await worker.close()
        task.cancel()
    return seen


def test_retention__a_stock_worker_trims_completed_and_failed_jobs_beyond_the_count(
    settings, fq_prefix, redis_client
):
    settings.FAIRQUEUE = {
        **settings.FAIRQUEUE,
        "KEEP_COMPLETED": {"count": 3, "age": 3600},
        "KEEP_FAILED": 2,
    }
    done = enqueue_jobs("email", [{"n": n} for n in range(10)], tenant_id="t1")
    opts = json.loads(job_hash(redis_client, fq_prefix, done[0].job_id)["opts"])
    assert opts["removeOnComplete"] == {"count": 3, "age": 3600}
    assert opts["removeOnFail"] == {"count": 2}
    asyncio.run(_run_worker(fq_prefix, "email", 10, fail=False))
    assert wait_until(lambda: redis_client.zcard(f"{fq_prefix}:email:completed") == 3)
    kept = set(redis_client.zrange(f"{fq_prefix}:email:completed", 0, -1))
    assert kept == {job.job_id for job in done[-3:]}  # the newest three
    assert not redis_client.exists(f"{fq_prefix}:email:{done[0].job_id}")  # hash gone too

    failing = enqueue_jobs("report", [{"n": n} for n in range(6)])
    asyncio.run(_run_worker(fq_prefix, "report", 6, fail=True))
    assert wait_until(lambda: redis_client.zcard(f"{fq_prefix}:report:failed") == 2)
    assert not redis_client.exists(f"{fq_prefix}:report:{failing[0].job_id}")


def test_retention__keep_none_keeps_every_finished_job(settings, fq_prefix, redis_client):
    settings.FAIRQUEUE = {**settings.FAIRQUEUE, "KEEP_COMPLETED": None}
    job = enqueue_jobs("email", [{"n": n} for n in range(5)])[0]
    opts = json.loads(job_hash(redis_client, fq_prefix, job.job_id)["opts"])
    assert opts["removeOnComplete"] is False  # BullMQ: keep
    asyncio.run(_run_worker(fq_prefix, "email", 5, fail=False))
    assert wait_until(lambda: redis_client.zcard(f"{fq_prefix}:email:completed") == 5)
