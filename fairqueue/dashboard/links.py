"""The console's links: a tenant's page and a job's page, built in one place from the
URL names the console registers (``reverse``), so every page and the JSON its script
renders from link the same way, whatever the URL patterns become."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from fairqueue.dashboard.wording import NO_TENANT

TENANT_VIEW = "admin:fairqueue_dashboard_tenant"
JOB_VIEW = "admin:fairqueue_dashboard_job"


def tenant_url(tenant_id: str | None) -> str:
    """A tenant's console page; ``""`` for jobs without a tenant (nothing to link)."""
    return reverse(TENANT_VIEW, args=[tenant_id]) if tenant_id else ""


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
    _tenant_rows((stats.get("noisy") or {}).get("tenants", []))
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
