"""An account's limits and quota: the same ranges as a tenant's, refused with a message
naming the field, the value and the range, in the model and in the admin."""

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from fairqueue.models import Account
from fairqueue.scheduling.limits import LIMIT_RANGES, TenantLimits

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", sorted(LIMIT_RANGES))
def test_account_limit__in_range_passes_and_outside_is_refused_naming_the_range(name):
    low, high = LIMIT_RANGES[name]
    pair = {"rate_max": 5, "rate_duration_ms": 1000} if name.startswith("rate") else {}
    account = Account(account_id="acme", **{**pair, name: high})
    account.full_clean()
    for bad in (low - 1, high + 1):
        account = Account(account_id="acme", **{**pair, name: bad})
        with pytest.raises(ValidationError) as caught:
            account.full_clean()
        assert caught.value.message_dict[name] == [
            f"{name}={bad!r} is not allowed: expected a whole number in {low}..{high}, "
            "or empty for no limit"
        ]


def test_account_limit__half_a_rate_is_refused():
    with pytest.raises(ValidationError, match="Set both rate_max and rate_duration_ms"):
        Account(account_id="acme", rate_max=5).full_clean()


def test_account_quota__same_shape_as_a_plan_quota():
    Account(account_id="acme", quota_worker_seconds=3600, quota_period="month").full_clean()
    with pytest.raises(ValidationError) as caught:
        Account(account_id="acme", quota_worker_seconds=0, quota_period="week").full_clean()
    assert set(caught.value.message_dict) == {"quota_worker_seconds", "quota_period"}


def test_account_limits__read_as_tenant_limits():
    account = Account(account_id="acme", max_active=2, rate_max=5, rate_duration_ms=1000)
    assert account.limits() == TenantLimits(max_active=2, rate_max=5, rate_duration_ms=1000)
    assert Account(account_id="plain").limits() == TenantLimits()


def _form(account, **changes):
    data = {
        "display_name": account.display_name,
        "plan_tier": account.plan_tier,
        "weight": str(account.weight),
        "max_active": "",
        "rate_max": "",
        "rate_duration_ms": "",
        "max_waiting": "",
        "quota_worker_seconds": "",
        "quota_period": "",
        "tenants-TOTAL_FORMS": "0",
        "tenants-INITIAL_FORMS": "0",
    }
    data.update(changes)
    return data


def test_account_admin__edits_limits_and_refuses_out_of_range(admin_client):
    account = Account.objects.create(account_id="acme")
    url = reverse("admin:fairqueue_account_change", args=[account.pk])
    page = admin_client.get(url).content
    for name in (*LIMIT_RANGES, "quota_worker_seconds", "quota_period"):
        assert f'name="{name}"'.encode() in page
    response = admin_client.post(url, _form(account, max_active="0"))
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["max_active"] == [
        "max_active must be a whole number in 1..1,000,000, or empty for no limit"
    ]
    response = admin_client.post(
        url, _form(account, max_active="2", max_waiting="50", quota_worker_seconds="60")
    )
    assert response.status_code == 302
    account.refresh_from_db()
    assert (account.max_active, account.max_waiting, account.quota_worker_seconds) == (2, 50, 60)
    changelist = admin_client.get(reverse("admin:fairqueue_account_changelist")).content
    assert b"column-max_active" in changelist
