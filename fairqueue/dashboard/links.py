"""The console's links in the stats the pages and their JSON share: a tenant's page
(:func:`fairqueue.dashboard.tenant_routes.tenant_url`, the one helper that escapes an id
into its URL segment) and a job's page, so every page and the JSON its script renders
from link the same way."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from fairqueue.dashboard.account_rows import link_accounts
from fairqueue.dashboard.tenant_routes import account_url
from fairqueue.dashboard.tenant_routes import tenant_url as route_url
from fairqueue.dashboard.wording import NO_TENANT
from fairqueue.scheduling.levels import INTERNAL_TENANT

JOB_VIEW = "admin:fairqueue_dashboard_job"


def tenant_url(tenant_id: str | None) -> str:
    """A tenant's console page; ``""`` for jobs without a tenant and for internal work's
    bucket (no tenant page can have them: nothing to link)."""
    return route_url(tenant_id) if tenant_id and tenant_id != INTERNAL_TENANT else ""


def job_url(job_type: str, job_id: str) -> str:
    return reverse(JOB_VIEW, args=[job_type, job_id])


def _tenant_rows(rows: list[dict[str, Any]], key: str = "tenant") -> None:
    for row in rows:
        row["tenant_url"] = tenant_url(row.get(key))


def link_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """``stats`` (one queue's :func:`~fairqueue.dashboard.stats.queue_stats`) with the
    URL of every tenant and job it names, for the page and its JSON."""
    job_type = stats["job_type"]
    for level in stats["levels"].values():
        _tenant_rows(level["top_tenants"])
    for job in stats["order"]["jobs"]:
        job["tenant_url"] = tenant_url(job["tenant"] if job["tenant"] != "?" else None)
        job["job_url"] = job_url(job_type, job["job_id"])
    _tenant_rows(stats["history"]["tenants"])
    link_accounts(stats.get("accounts", []))
    _tenant_rows((stats.get("noisy") or {}).get("tenants", []))
    for row in (stats.get("noisy") or {}).get("accounts", []):
        row["account_url"] = account_url(row["account"])
    _tenant_rows(stats["limits"]["tenants"])
    _tenant_rows(stats.get("overdue_flows", []))
    failures = stats.get("failures") or {}
    _tenant_rows(failures.get("failing", []))
    for group in failures.get("groups", []):
        group["jobs"] = [{"id": i, "url": job_url(job_type, i)} for i in group["latest_ids"]]
        group["tenant_links"] = [
            {"display": t, "url": tenant_url(None if t == NO_TENANT else t)}
            for t in group["tenants"]
        ]
    return stats
