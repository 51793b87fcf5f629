"""Accounts: a customer's tenants grouped under one ``Account``, its tier inherited, and
the account resolved at enqueue on every path (single, batch, durable, async, tasks),
against a real Redis and the real bullmq package."""

import asyncio
import json

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.db.models import ProtectedError
from django.test import override_settings
from django.urls import reverse

try:  # Django 6: its own django.tasks (`make test-django6` has no backport)
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

from fairqueue.enqueue import priority
from fairqueue.enqueue.api import aenqueue_job, enqueue_job, enqueue_jobs, enqueue_on_commit
from fairqueue.enqueue.lookups import lookup_account_weight, lookup_tenant_account
from fairqueue.exceptions import (
    ConflictingPayloadError,
    InvalidAccountError,
    UnknownAccountError,
)
from fairqueue.models import Account, OutboxJob, TenantPlan
from fairqueue.scheduling.levels import PriorityLevel

pytestmark = pytest.mark.django_db


@task()
def account_task(label: str, tenant_id: str | None = None, customer: str | None = None) -> str:
    return label


def data_of(redis_client, prefix: str, job_id: str, queue: str = "email") -> dict:
    return json.loads(redis_client.hget(f"{prefix}:{queue}:{job_id}", "data"))


def stored_jobs(redis_client, prefix: str, queue: str = "email") -> int:
    return redis_client.zcard(f"{prefix}:{queue}:prioritized") + redis_client.llen(
        f"{prefix}:{queue}:wait"
    )


@pytest.fixture
def customers(fq_prefix):
    """Account 'big' (enterprise, weight 2) owning 'big-1' (no tier: inherits) and 'big-2'
    (its own free tier); 'solo' a tenant without an account; the database lookups wired."""
    big = Account.objects.create(account_id="big", plan_tier="enterprise", weight=2)
    Account.objects.create(account_id="spare", plan_tier="free")
    TenantPlan.objects.create(tenant_id="big-1", account=big)
    TenantPlan.objects.create(tenant_id="big-2", account=big, plan_tier="free")
    TenantPlan.objects.create(tenant_id="solo", plan_tier="pro")
    priority.wire_tenant_plan_lookup()
    return fq_prefix


def test_single__a_tenant_of_an_account_takes_its_tier_and_carries_the_account(
    customers, redis_client
):
    job = enqueue_job("email", {"n": 1}, tenant_id="big-1")
    assert (job.level, job.account_id) == (PriorityLevel.CRITICAL, "big")
    assert data_of(redis_client, customers, job.job_id) == {
        "priorityLevel": "critical",
        "tenantId": "big-1",
        "n": 1,
        "accountId": "big",
    }


def test_single__a_tenants_own_tier_wins_over_its_accounts(customers, redis_client):
    job = enqueue_job("email", {}, tenant_id="big-2")
    assert (job.level, job.account_id) == (PriorityLevel.LOW, "big")
    assert data_of(redis_client, customers, job.job_id)["accountId"] == "big"


def test_single__a_tenant_without_an_account_is_unchanged_its_own_account_key_kept(
    customers, redis_client
):
    job = enqueue_job("email", {"accountId": "its-own-data"}, tenant_id="solo")
    assert (job.level, job.account_id) == (PriorityLevel.NORMAL, None)
    assert data_of(redis_client, customers, job.job_id) == {
        "priorityLevel": "normal",
        "tenantId": "solo",
        "accountId": "its-own-data",
    }
    unknown = enqueue_job("email", {}, tenant_id="nobody")
    assert unknown.account_id is None
    assert "accountId" not in data_of(redis_client, customers, unknown.job_id)


def test_explicit__an_account_for_a_tenant_without_one_is_checked_and_carried(
    customers, redis_client
):
    job = enqueue_job("email", {}, tenant_id="solo", account_id="spare")
    assert job.account_id == "spare"
    # the tier stays the tenant's: only a tenant the account owns inherits it
    assert job.level == PriorityLevel.NORMAL
    assert data_of(redis_client, customers, job.job_id)["accountId"] == "spare"
    same = enqueue_job("email", {}, tenant_id="big-1", account_id="big")
    assert same.account_id == "big"


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"tenant_id": "solo", "account_id": "typo"}, UnknownAccountError, "no Account"),
        ({"tenant_id": "big-1", "account_id": "spare"}, InvalidAccountError, "another account"),
        ({"internal": True, "account_id": "big"}, InvalidAccountError, "without a tenant_id"),
        ({"account_id": "big"}, InvalidAccountError, "without a tenant_id"),
        ({"tenant_id": "solo", "account_id": ""}, InvalidAccountError, "non-empty string"),
        ({"tenant_id": "solo", "account_id": 7}, InvalidAccountError, "account_id=7"),
        ({"tenant_id": "solo", "account_id": "a\nb"}, InvalidAccountError, "line feed"),
    ],
)
def test_explicit__a_bad_or_unknown_account_is_a_clear_error_and_writes_nothing(
    customers, redis_client, options, error, words
):
    for call in (
        lambda: enqueue_job("email", {}, **options),
        lambda: enqueue_jobs("email", [{}, {}], **options),
        lambda: enqueue_on_commit("email", {}, **options),
    ):
        with pytest.raises(error, match="account_id") as caught:
            call()
        assert words in str(caught.value)
    assert stored_jobs(redis_client, customers) == 0
    assert OutboxJob.objects.count() == 0


def test_explicit__an_unknown_account_is_a_lookup_error_too(customers):
    with pytest.raises(LookupError):
        enqueue_job("email", {}, tenant_id="solo", account_id="typo")
    # known once created: the absent entry does not outlive the creation
    Account.objects.create(account_id="typo")
    assert enqueue_job("email", {}, tenant_id="solo", account_id="typo").account_id == "typo"


def test_payload__a_different_account_id_in_an_account_jobs_payload_is_refused(customers):
    with pytest.raises(ConflictingPayloadError, match="accountId"):
        enqueue_job("email", {"accountId": "other"}, tenant_id="big-1")
    assert enqueue_job("email", {"accountId": "big"}, tenant_id="big-1").account_id == "big"


def test_batch__every_job_carries_the_account(customers, redis_client):
    jobs = enqueue_jobs("email", [{"n": i} for i in range(300)], tenant_id="big-1")
    assert {job.account_id for job in jobs} == {"big"}
    for job in (jobs[0], jobs[-1]):
        assert data_of(redis_client, customers, job.job_id)["accountId"] == "big"


def test_durable__the_outbox_row_and_the_relayed_job_carry_the_account(
    customers, redis_client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        job = enqueue_on_commit("email", {"n": 1}, tenant_id="big-1")
        assert json.loads(OutboxJob.objects.get().data)["accountId"] == "big"
    assert (job.durable, job.account_id) == (True, "big")
    assert OutboxJob.objects.count() == 0  # relayed after commit
    assert data_of(redis_client, customers, job.job_id)["accountId"] == "big"


@pytest.mark.django_db(transaction=True)  # the lookups run in a thread of their own
def test_async__the_account_is_resolved_in_the_thread_and_carried(customers, redis_client):
    job = asyncio.run(aenqueue_job("email", {}, tenant_id="big-1"))
    explicit = asyncio.run(aenqueue_job("email", {}, tenant_id="solo", account_id="spare"))
    assert (job.account_id, explicit.account_id) == ("big", "spare")
    assert data_of(redis_client, customers, job.job_id)["accountId"] == "big"
    with pytest.raises(UnknownAccountError):
        asyncio.run(aenqueue_job("email", {}, tenant_id="solo", account_id="typo"))


def test_tasks__a_tasks_tenant_brings_its_account_and_account_kwarg_names_one(
    customers, redis_client
):
    tasks = {
        "default": {
            "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
            "OPTIONS": {"JOB_TYPES": {"default": "email"}, "ACCOUNT_KWARG": "customer"},
        }
    }
    with override_settings(TASKS=tasks):
        by_tenant = account_task.enqueue("x", tenant_id="big-1")
        named = account_task.enqueue("y", tenant_id="solo", customer="spare")
        plain = account_task.enqueue("z", tenant_id="solo")
        assert data_of(redis_client, customers, by_tenant.id)["accountId"] == "big"
        assert data_of(redis_client, customers, named.id)["accountId"] == "spare"
        assert "accountId" not in data_of(redis_client, customers, plain.id)
        with pytest.raises(UnknownAccountError):
            account_task.enqueue("w", tenant_id="solo", customer="typo")


def test_cache__a_warm_enqueue_asks_the_database_nothing(customers, django_assert_num_queries):
    enqueue_job("email", {}, tenant_id="big-1")
    enqueue_job("email", {}, tenant_id="solo", account_id="spare")
    with django_assert_num_queries(0):
        assert enqueue_job("email", {}, tenant_id="big-1").account_id == "big"
        assert enqueue_job("email", {}, tenant_id="solo", account_id="spare").account_id == "spare"


def test_cache__an_accounts_tier_and_a_tenants_move_reach_the_next_enqueue(customers):
    assert enqueue_job("email", {}, tenant_id="big-1").level == PriorityLevel.CRITICAL
    big = Account.objects.get(account_id="big")
    big.plan_tier = "free"
    big.save()
    assert enqueue_job("email", {}, tenant_id="big-1").level == PriorityLevel.LOW
    plan = TenantPlan.objects.get(tenant_id="big-1")
    plan.account = Account.objects.get(account_id="spare")
    plan.save()
    assert lookup_tenant_account("big-1") == ("spare", 1)
    assert enqueue_job("email", {}, tenant_id="big-1").account_id == "spare"
    plan.account = None
    plan.save()
    assert enqueue_job("email", {}, tenant_id="big-1").account_id is None


def test_cache__an_accounts_weight_change_reaches_its_tenants_lookups(customers):
    assert lookup_tenant_account("big-1") == ("big", 2)
    assert lookup_account_weight("big") == 2
    big = Account.objects.get(account_id="big")
    big.weight = 5
    big.save(update_fields=["weight", "updated_at"])
    assert lookup_tenant_account("big-1") == ("big", 5)
    assert lookup_account_weight("big") == 5
    assert enqueue_job("email", {}, tenant_id="big-1").account_id == "big"


def test_unwired__no_tenant_row_is_read_but_an_explicit_account_is_still_checked(
    fq_prefix, redis_client
):
    big = Account.objects.create(account_id="big", plan_tier="enterprise")
    TenantPlan.objects.create(tenant_id="big-1", account=big)
    job = enqueue_job("email", {}, tenant_id="big-1")
    assert (job.level, job.account_id) == (PriorityLevel.NORMAL, None)
    assert "accountId" not in data_of(redis_client, fq_prefix, job.job_id)
    assert enqueue_job("email", {}, tenant_id="big-1", account_id="big").account_id == "big"
    with pytest.raises(UnknownAccountError):
        enqueue_job("email", {}, tenant_id="big-1", account_id="typo")


def test_model__an_account_with_tenants_cannot_be_deleted_an_empty_one_can(customers):
    with pytest.raises(ProtectedError):
        Account.objects.get(account_id="big").delete()
    Account.objects.get(account_id="spare").delete()
    assert list(Account.objects.values_list("account_id", flat=True)) == ["big"]


def test_admin__accounts_are_added_and_changed_with_the_admins_history(admin_client):
    add = reverse("admin:fairqueue_account_add")
    form = {"account_id": "acme", "display_name": "Acme", "plan_tier": "pro", "weight": 3}
    assert admin_client.post(add, form).status_code == 302
    acme = Account.objects.get(account_id="acme")
    TenantPlan.objects.create(tenant_id="acme-eu", account=acme)
    change = reverse("admin:fairqueue_account_change", args=[acme.pk])
    page = admin_client.get(change).content.decode()
    assert 'name="account_id"' not in page  # fixed once saved: tenants name it
    response = admin_client.post(change, {**form, "plan_tier": "enterprise", "weight": 4})
    assert response.status_code == 302
    acme.refresh_from_db()
    assert (acme.plan_tier, acme.weight) == ("enterprise", 4)
    flags = list(
        LogEntry.objects.filter(object_id=str(acme.pk)).values_list("action_flag", flat=True)
    )
    assert sorted(flags) == [ADDITION, CHANGE]
    listing = admin_client.get(reverse("admin:fairqueue_account_changelist")).content.decode()
    assert "account__exact=acme" in listing and ">1</a>" in listing
    tenants = admin_client.get(
        reverse("admin:fairqueue_tenantplan_changelist"), {"account__exact": "acme"}
    ).content.decode()
    assert "acme-eu" in tenants
    bad = admin_client.post(add, {**form, "account_id": "x\ny", "weight": 0})
    assert bad.status_code == 200 and b"line feed" in bad.content


def test_admin__a_tenant_is_put_in_an_account_from_its_plan_form(admin_client):
    Account.objects.create(account_id="acme", plan_tier="enterprise")
    plan = TenantPlan.objects.create(tenant_id="acme-eu")
    change = reverse("admin:fairqueue_tenantplan_change", args=[plan.pk])
    form = {
        "tenant_id": "acme-eu",
        "display_name": "",
        "plan_tier": "",
        "subscription": "{}",
        "weight": 1,
        "account": "acme",
    }
    assert admin_client.post(change, form).status_code == 302
    plan.refresh_from_db()
    assert plan.account_id == "acme"
    assert plan.resolve_plan() == "enterprise"
    listing = admin_client.get(reverse("admin:fairqueue_tenantplan_changelist")).content
    assert b"enterprise, by its account&#x27;s tier" in listing


def test_estimate_and_admission__take_the_account_as_the_enqueue_does(customers, redis_client):
    from fairqueue.enqueue.start_estimates import estimate_start

    assert estimate_start("email", tenant_id="big-1", account_id="big") is not None
    with pytest.raises(UnknownAccountError):
        estimate_start("email", tenant_id="solo", account_id="typo")
    job = enqueue_job("email", {}, tenant_id="big-1", max_wait_ms=60_000, estimate=True)
    assert job.account_id == "big" and job.estimate is not None
    assert data_of(redis_client, customers, job.job_id)["accountId"] == "big"
