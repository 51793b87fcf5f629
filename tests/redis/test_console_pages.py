"""Every console page has the one shape (CONTRIBUTING.md, "Add a console page"): a
module of ``fairqueue/dashboard/`` with one ``ConsolePage`` (its routes and views),
served through ``DashboardAdmin``'s ``PAGES``, whose views hand their template one
frozen dataclass, ``page``, and nothing else of their own. tests/unit/test_house.py
checks the code's shape; this, each page as an operator opens it (real Redis)."""

from __future__ import annotations

import dataclasses
import inspect
import sys

import pytest
from django.contrib import admin
from django.urls import reverse

from fairqueue.dashboard.console_admin import ConsolePage
from fairqueue.dashboard.views import PAGES, DashboardAdmin
from fairqueue.enqueue.api import enqueue_job
from fairqueue.models import Dashboard, TenantPlan
from tests.helpers import staff

pytestmark = pytest.mark.django_db

ADMIN = "admin:fairqueue_dashboard"


def _is_frozen_dataclass(value: object) -> bool:
    return dataclasses.is_dataclass(value) and type(value).__dataclass_params__.frozen


def test_every_page_is_one_module_with_one_console_page_whose_routes_are_its_views():
    site_admin = DashboardAdmin(Dashboard, admin.site)
    modules = [sys.modules[page.__module__] for page in PAGES]
    assert len(set(modules)) == len(PAGES), "one page per module"
    for page, module in zip(PAGES, modules, strict=True):
        assert module.__name__.startswith("fairqueue.dashboard.")
        own = [
            c
            for c in vars(module).values()
            if inspect.isclass(c) and issubclass(c, ConsolePage) and c.__module__ == module.__name__
        ]
        assert own == [page]
        routes = page(site_admin).urls()
        assert routes
        for route in routes:
            view = route.callback.__wrapped__  # the admin's login wrapper around it
            assert isinstance(view.__self__, page), route.name
        frozen = [
            c
            for c in vars(module).values()
            if dataclasses.is_dataclass(c)
            and c.__module__ == module.__name__
            and c.__dataclass_params__.frozen
        ]
        assert frozen, f"{module.__name__} has no frozen dataclass for its data"


@pytest.fixture
def everything(fq_prefix, client):
    """An operator who may do everything, a tenant with a plan and a job."""
    perms = ("view_dashboard", "run_rebalance", "view_job_payload", "change_tenantplan")
    client.force_login(staff("everything", *perms, "view_tenantplan"))
    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro")
    job = enqueue_job("email", {"n": 1}, tenant_id="acme")
    return client, job.job_id


def test_each_page_as_opened_hands_its_template_a_frozen_page_and_no_loose_keys(everything):
    client, job_id = everything
    baseline = set(client.get(reverse(f"{ADMIN}_tenants")).context_data) - {"page"}
    paths = [
        reverse(f"{ADMIN}_changelist"),
        reverse(f"{ADMIN}_queue", args=["email"]),
        reverse(f"{ADMIN}_rebalance", args=["email"]),
        reverse(f"{ADMIN}_job", args=["email", job_id]),
        reverse(f"{ADMIN}_job_remove", args=["email", job_id]),
        reverse(f"{ADMIN}_job_retry", args=["email", job_id]),
        reverse(f"{ADMIN}_jobs") + "?id=nothing-here",
        reverse(f"{ADMIN}_tenants") + "?q=ac",
        reverse(f"{ADMIN}_tenant", args=["acme"]),
        reverse(f"{ADMIN}_tenant_limits", args=["acme"]),
        reverse(f"{ADMIN}_tenant_action", args=["acme", "pause"]),
    ]
    for path in paths:
        response = client.get(path)
        assert response.status_code == 200, path
        assert _is_frozen_dataclass(response.context_data["page"]), path
        assert set(response.context_data) - {"page"} == baseline, path
