"""The console's tenant routes under ids that look like routes: every id, whatever it
holds (``/``, ``do``, ``limits``, ``..``, ``%2F``, spaces, unicode), names its own page,
its own limits form and its own actions, and never another tenant's."""

from __future__ import annotations

import pytest
from django.urls import resolve
from hypothesis import given
from hypothesis import strategies as st

from fairqueue.dashboard.tenant_routes import (
    TenantIdConverter,
    decode_tenant_segment,
    encode_tenant_segment,
    tenant_url,
)
from fairqueue.models import TenantPauseAudit, TenantPlan

pytestmark = pytest.mark.django_db

#: Ids an adversary or a hurried operator could pick to reach another tenant's route.
CONFUSING_IDS = [
    "acme/do/pause",
    "acme/limits",
    "acme/",
    "do",
    "limits",
    "pause",
    "..",
    ".",
    "a/../acme",
    "../acme",
    "%2F",
    "acme%2Fdo%2Fpause",
    "acme%2Flimits",
    "a b",
    " acme",
    "tenants",
    "ünïcødé/ð",
    "🚀/do/pause",
    "acme_2Fdo_2Fpause",  # what the escaped id of acme/do/pause looks like
    "_",
    "acme?next=x",
    "acme#do",
]


@pytest.mark.parametrize("tenant_id", CONFUSING_IDS)
def test_tenant_routes__every_id_resolves_to_its_own_page_limits_and_actions(tenant_id):
    page = resolve(tenant_url(tenant_id))
    assert page.url_name == "fairqueue_dashboard_tenant"
    assert page.kwargs == {"tenant_id": tenant_id}
    limits = resolve(tenant_url(tenant_id, "limits"))
    assert limits.url_name == "fairqueue_dashboard_tenant_limits"
    assert limits.kwargs == {"tenant_id": tenant_id}
    for action in ("pause", "resume", "retry", "remove"):
        found = resolve(tenant_url(tenant_id, action))
        assert found.url_name == "fairqueue_dashboard_tenant_action"
        assert found.kwargs == {"tenant_id": tenant_id, "action": action}
    # one segment of letters, digits, '-' and '_': nothing a browser or the router rewrites
    segment = tenant_url(tenant_id).removeprefix(tenant_url("x")[: -len("x/")]).rstrip("/")
    assert "/" not in segment and "." not in segment and "%" not in segment


def test_tenant_routes__a_routelike_ids_page_and_pause_are_its_own_never_acmes(fq_prefix, operator):
    """The page of ``acme/do/pause`` is its own page (not "Pause acme?"), and pausing it
    audits it, not acme; ``acme/limits`` has its own limits form."""
    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro")
    TenantPlan.objects.create(tenant_id="acme/limits", plan_tier="pro", max_active=3)
    page = operator.get(tenant_url("acme/do/pause"))
    assert page.status_code == 200
    shown = page.context["page"]
    assert shown.tenant_id == "acme/do/pause" and not hasattr(shown, "action")
    limits = operator.get(tenant_url("acme/limits", "limits"))
    assert limits.context["page"].form.instance.tenant_id == "acme/limits"
    assert operator.get(tenant_url("acme/limits")).context["page"].tenant_id == "acme/limits"
    confirm = operator.get(tenant_url("acme/do/pause", "pause"))
    assert confirm.context["page"].tenant_id == "acme/do/pause"
    operator.post(tenant_url("acme/do/pause", "pause"))
    assert list(TenantPauseAudit.objects.values_list("tenant_id", flat=True)) == ["acme/do/pause"]
    assert TenantPlan.objects.get(tenant_id="acme").paused is False


@pytest.mark.parametrize("segment", ["acme_2f", "_61cme", "acme_", "acme_2", "_FF", "_C3"])
def test_tenant_routes__a_non_canonical_segment_is_no_tenant(segment):
    """Each id has one URL: a stray escape, lower-case hex, an escaped plain letter or
    bytes that are not UTF-8 name no tenant (the router answers 404)."""
    with pytest.raises(ValueError):
        TenantIdConverter().to_python(segment)


@given(st.text(min_size=1, max_size=80))
def test_tenant_segment__round_trips_any_id_into_one_safe_segment(tenant_id):
    segment = encode_tenant_segment(tenant_id)
    assert segment.replace("_", "").replace("-", "").isalnum() or segment.strip("_-") == ""
    assert segment.isascii()
    assert decode_tenant_segment(segment) == tenant_id
