"""From a symptom to its cause: the overview's attention items link to the flows that
make them, the queue page lists those flows with links, and each tenant's page says what
it does to the queue and the queue to it (real Redis, a stock BullMQ worker failing
jobs, the test client)."""

from __future__ import annotations

import html as html_module
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from fairqueue.dashboard import stats as dashboard
from fairqueue.dashboard.tenant_page import tenant_page_data
from fairqueue.enqueue.api import enqueue_jobs
from fairqueue.models import TenantPlan
from fairqueue.tenants import pause_tenant
from tests.helpers import wait_until
from tests.helpers.console import DASHBOARD, FLOOD, QUEUE, fail_jobs, seed_culprits

pytestmark = pytest.mark.django_db

TENANT = "admin:fairqueue_dashboard_tenant"
JOB = "admin:fairqueue_dashboard_job"
RETRY = "admin:fairqueue_dashboard_job_retry"


def findings(html: str) -> dict[str, str]:
    """The tenant page's verdict (email): finding kind -> its text."""
    email = html.split('class="fq-tenant-queue" data-job-type="email"', 1)[1]
    email = email.split("</section>", 1)[0]
    found = re.findall(r'data-fq-finding="([a-z]+)"><span data-fq-finding-text>(.*?)</span>', email)
    return {kind: html_module.unescape(re.sub(r"\s+", " ", text)) for kind, text in found}


def test_symptom_to_cause__each_attention_item_links_to_the_flows_that_make_it(
    limited, operator, redis_client
):
    seed_culprits(limited, redis_client)
    html = operator.get(reverse(DASHBOARD)).content.decode()
    html = html.split('data-fq-overview-row="email"', 1)[1].split("</tr>", 1)[0]
    queue_url = reverse(QUEUE, args=["email"])
    badges = dict(
        (text, href)
        for href, text in re.findall(
            r'<a class="fq-attn [^"]+" href="([^"]+)" data-fq-attn>([^<]+)<', html
        )
    )
    assert badges[f"{FLOOD} job(s) past the wait bound"] == f"{queue_url}#overdue-email"
    assert badges["1 tenant(s) failing"] == f"{queue_url}#failing-email"
    assert badges["1 tenant(s) paused"] == f"{queue_url}#limits-email"
    assert badges["5 job(s) held by 2 tenant(s)"] == f"{queue_url}#limits-email"

    page = operator.get(queue_url).content.decode()
    flood_url = reverse(TENANT, args=["flood"])
    overdue = page.split('id="overdue-email"', 1)[1].split("</table>", 1)[0]
    assert f'<tr data-fq-overdue-flow="flood"><td><a href="{flood_url}">flood</a>' in overdue
    assert f"<td>{FLOOD}</td><td>{FLOOD}</td><td>100%</td>" in overdue
    failing = page.split('id="failing-email"', 1)[1]
    assert f'<a href="{reverse(TENANT, args=["doomed"])}">doomed</a>' in failing
    groups = failing.split("data-fq-failure-groups", 1)[1].split("</table>", 1)[0]
    assert f'<td><a href="{reverse(TENANT, args=["doomed"])}">doomed</a></td>' in groups
    limits = page.split('id="limits-email"', 1)[1].split("</table>", 1)[0]
    assert reverse(TENANT, args=["sleepy"]) in limits and reverse(TENANT, args=["acme"]) in limits
    # Every tenant id in the waiting order and the top tenants is a link to its page.
    order = page.split('id="order-email"', 1)[1]
    assert f'<a href="{reverse(TENANT, args=["quiet"])}">quiet</a>' in order
    levels = page.split('class="fq-levels"', 1)[1].split("</table>", 1)[0]
    assert f'<a href="{flood_url}">flood</a> ({FLOOD})' in levels


def test_tenant_verdict__the_culprit_says_it_is_the_culprit_the_others_what_holds_them(
    limited, operator, redis_client
):
    seed_culprits(limited, redis_client)
    stats = dashboard.queue_stats("email")
    assert stats["overdue_total"] == FLOOD

    flood = findings(operator.get(reverse(TENANT, args=["flood"])).content.decode())
    assert flood["overdue"] == (
        f"{FLOOD} of its waiting jobs are past the 5m 00s bound, of the queue's {FLOOD} "
        "overdue: only its own jobs wait past the bound, no other tenant's."
    )
    html = operator.get(reverse(TENANT, args=["flood"])).content.decode()
    assert f'data-fq-t="overdue" class="fq-attn-red">{FLOOD}<' in html

    acme_html = operator.get(reverse(TENANT, args=["acme"])).content.decode()
    acme = findings(acme_html)
    assert acme["limited"] == (
        "Its own limits hold 3 job(s): 2 at once (0 running); their wait is its limits', "
        "not the queue's."
    )
    assert "overdue" not in acme
    assert 'data-fq-finding-action="limits"' in acme_html

    sleepy_html = operator.get(reverse(TENANT, args=["sleepy"])).content.decode()
    assert findings(sleepy_html)["paused"] == (
        "It is paused: 2 job(s) held; none starts until it is resumed."
    )
    resume = reverse("admin:fairqueue_dashboard_tenant_action", args=["sleepy", "resume"])
    assert f'href="{resume}" data-fq-finding-action="resume"' in sleepy_html

    doomed_html = operator.get(reverse(TENANT, args=["doomed"])).content.decode()
    assert findings(doomed_html)["failing"] == (
        "Its jobs fail: 6 failed in the last 15 min, of 6 attempts it started (100%)."
    )
    # Six identical failures are one group, with the latest ids linked.
    groups = doomed_html.split("data-fq-failure-groups", 1)[1].split("</table>", 1)[0]
    assert groups.count("data-fq-failure-group=") == 1
    assert "<td>ValueError</td>" in groups and "<td>6</td>" in groups
    assert groups.count(reverse(JOB, args=["email", "X"]).rsplit("X", 1)[0]) == 5
    # It has no job waiting: nothing is said of its jobs in line.
    assert "data-fq-in-line" not in doomed_html
    assert 'data-fq-t="next_run">it has no job waiting<' in doomed_html

    quiet = findings(operator.get(reverse(TENANT, args=["quiet"])).content.decode())
    assert quiet == {"fine": "Nothing holds it: its 1 waiting job(s) take their fair turns."}


def test_job_page__wait_to_its_start_due_time_read_at_and_one_ahead_count(
    limited, operator, redis_client
):
    ids = seed_culprits(limited, redis_client)
    failed = operator.get(reverse(JOB, args=["email", ids["doomed"][0]])).content.decode()
    # failed the moment a worker took it: its wait ended at its start, not now
    waited = re.search(r"data-fq-waited>([^<]+)<", failed).group(1)
    assert waited.endswith("from ready to its start") and waited[0] in "0123456789"
    assert int(waited.split("s", 1)[0]) < 30
    assert "Numbers read at" in failed
    delayed = operator.get(reverse(JOB, args=["email", ids["later"][0]])).content.decode()
    assert re.search(r"data-fq-due>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC<", delayed)
    assert "not counted yet: delayed until" in delayed
    last = operator.get(reverse(JOB, args=["email", ids["quiet"][0]])).content.decode()
    position = int(re.search(r"data-fq-position>(\d+)<", last).group(1))
    ahead = int(re.search(r"data-fq-ahead>(\d+)<", last).group(1))
    assert ahead == position - 1 and f"{ahead} job(s) come first" in last
    rank = redis_client.zrank(f"{limited}:email:prioritized", ids["quiet"][0])
    assert position == redis_client.llen(f"{limited}:email:wait") + rank + 1


def test_job_retry__one_failed_job_back_as_a_fair_turn_confirmed_and_audited(
    limited, operator, client, redis_client
):
    ids = seed_culprits(limited, redis_client)
    job_id = ids["doomed"][0]
    url = reverse(RETRY, args=["email", job_id])
    job_page = operator.get(reverse(JOB, args=["email", job_id])).content.decode()
    assert f'href="{url}" data-fq-job-retry' in job_page
    confirm = operator.get(url).content.decode()
    assert "back in line as a fair turn of its flow" in confirm
    assert redis_client.zscore(f"{limited}:email:failed", job_id) is not None  # GET: nothing
    response = operator.post(url)
    assert response.status_code == 302
    assert redis_client.zscore(f"{limited}:email:failed", job_id) is None
    assert redis_client.zscore(f"{limited}:email:prioritized", job_id) is not None
    assert redis_client.zcard(f"{limited}:email:failed") == 5  # the others stay failed
    assert LogEntry.objects.filter(change_message=f"Retried job {job_id} from the console.")
    # Not failed any more: a second retry does nothing and says so.
    operator.post(url)
    assert redis_client.zcard(f"{limited}:email:failed") == 5


def test_job_retry__within_its_tenants_limits_a_paused_tenants_job_is_held(
    limited, operator, redis_client
):
    doomed = enqueue_jobs("email", [{}], tenant_id="sleepy", attempts=1)
    fail_jobs(limited, "email", 1)
    assert wait_until(lambda: redis_client.zcard(f"{limited}:email:failed") == 1, 10)
    pause_tenant("sleepy", actor="test", source="test")
    operator.post(reverse(RETRY, args=["email", doomed[0].job_id]))
    assert redis_client.zscore(f"{limited}:email:prioritized", doomed[0].job_id) is None
    assert redis_client.zscore(f"{limited}:email:delayed", doomed[0].job_id) is not None


def test_job_retry__needs_the_change_permission(limited, viewer, redis_client):
    url = reverse(RETRY, args=["email", "some-id"])
    assert viewer.get(url).status_code == 403
    assert viewer.post(url).status_code == 403


def test_rates__over_the_span_recorded_not_the_whole_window():
    from fairqueue.dashboard.charts import history_view
    from fairqueue.scheduling.shares import summarize

    now_ms = 10_000_000
    summary = summarize([], now_ms=now_ms, window_s=900, max_wait_ms=20_000, waiting_now=None)
    assert (
        history_view(dict(summary), now_ms=now_ms, since_ms=now_ms - 120_000)["observed_s"] == 120
    )
    summary = summarize([], now_ms=now_ms, window_s=900, max_wait_ms=20_000, waiting_now=None)
    assert history_view(dict(summary), now_ms=now_ms, since_ms=0)["observed_s"] == 900


@pytest.mark.parametrize("as_list", [False, True])
def test_set_tier__breadcrumbs_in_the_markup_the_running_admin_styles(
    fq_prefix, operator, monkeypatch, as_list
):
    from fairqueue.dashboard import crumbs

    monkeypatch.setattr(crumbs, "AS_LIST", as_list)
    plan = TenantPlan.objects.create(tenant_id="acme", plan_tier="pro")
    url = reverse("admin:fairqueue_tenantplan_changelist")
    html = operator.post(url, {"action": "set_tier", "_selected_action": [plan.pk]})
    html = html.content.decode()
    assert "Set the plan tier of these 1 tenant(s)" in html
    if as_list:  # Django 6
        assert '<ol class="breadcrumbs"><li><a href="/admin/">Home</a></li>' in html
        assert f'<li><a href="{url}">Tenant plans</a></li>' in html
        assert '<li aria-current="page">Set plan tier</li></ol>' in html
    else:
        assert '<div class="breadcrumbs"><a href="/admin/">Home</a> &rsaquo; ' in html
        assert "&rsaquo; Set plan tier</div>" in html


def test_plan_list__paused_right_after_the_id_audits_to_the_second(fq_prefix, client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("root", password="x"))
    TenantPlan.objects.create(tenant_id="acme", plan_tier="pro")
    pause_tenant("acme", actor="on-call", source="incident")
    html = client.get(reverse("admin:fairqueue_tenantplan_changelist")).content.decode()
    headers = re.findall(r'<th scope="col" class="[^"]*column-([a-z_]+)', html)
    assert headers[:2] == ["tenant_id", "paused"], headers
    audit = client.get(reverse("admin:fairqueue_tenantpauseaudit_changelist")).content.decode()
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", audit)
    assert "on-call" in audit and "incident" in audit
    assert f'<a href="{reverse(TENANT, args=["acme"])}">acme</a>' in audit


def test_held_level__a_level_held_by_its_own_limits_says_so_instead_of_looking_starved(
    limited, redis_client
):
    from fairqueue.broker import get_sync_broker
    from fairqueue.broker.console_reads import ConsoleReads
    from fairqueue.dashboard.culprits import held_level_notes

    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme", priority_level="low")
    held = redis_client.lrange(f"{limited}:email:fq:lim:held:acme", 0, -1)
    assert len(held) == 3
    sync = get_sync_broker()
    levels = sync.run(ConsoleReads(sync.broker.conn).held_levels, "email", [held[0], "gone"])
    assert levels == {held[0]: "low"}

    history = {
        "low": {"share": 0.02, "entitled_share": 0.17, "p99_over": True},
        "normal": {"share": 0.5, "entitled_share": 0.5, "p99_over": False},
    }
    notes = held_level_notes(history, {"low": 0, "normal": 4}, {"low": 3})
    assert notes == {
        "low": "low is not starved: none of its jobs waits in line now, and its tenants' own "
        "limits or pauses hold 3 of its jobs (the limited tenants below); their wait is "
        "their limits', not the other levels'."
    }
    # Jobs of the level waiting in line, or none held: it may be starved, nothing is said.
    assert held_level_notes(history, {"low": 2}, {"low": 3}) == {}
    assert held_level_notes(history, {"low": 0}, {}) == {}


def test_held_level__the_queue_page_says_it(limited, operator):
    enqueue_jobs("email", [{} for _ in range(5)], tenant_id="acme", priority_level="low")
    stats = dashboard.queue_stats("email")
    # nothing started yet: no history to look starved, so no note
    assert "held_note" not in stats["history"]["levels"]["low"]
    assert stats["history"]["levels"]["low"]["p99_over"] is False


def test_next_run__the_estimate_its_job_page_shows(limited, operator):
    """The tenant page's "Next job" is its first job's place and the estimate
    ``job_status`` gives that job, as its job page says (a rate of all starts ignored the
    tenant's share: a flooding tenant's job was timed as if it had the whole queue)."""
    from fairqueue.dashboard.expected import describe
    from fairqueue.enqueue.status import job_status

    enqueue_jobs("email", [{} for _ in range(3)], tenant_id="beta", priority_level="low")
    enqueue_jobs("email", [{} for _ in range(4)], tenant_id="acme", priority_level="normal")
    page = next(q for q in tenant_page_data("beta").queues if q.job_type == "email")
    first = page.next_jobs[0]
    status = job_status("email", first.job_id)
    assert status is not None and status.state == "waiting"
    assert page.next_run == f"position {first.position} in line: {describe(status.estimate)}"
    job_url = reverse("admin:fairqueue_dashboard_job", args=["email", first.job_id])
    assert html_module.escape(describe(status.estimate)) in operator.get(job_url).content.decode()


def test_read_at__on_every_console_page(limited, operator):
    enqueue_jobs("email", [{}], tenant_id="acme")
    pages = [
        reverse("admin:fairqueue_dashboard_jobs") + "?id=nothing-like-it",
        reverse("admin:fairqueue_dashboard_tenants") + "?q=ac",
        reverse("admin:fairqueue_dashboard_tenant_limits", args=["acme"]),
        reverse("admin:fairqueue_dashboard_tenant_action", args=["acme", "pause"]),
    ]
    for url in pages:
        html = operator.get(url).content.decode()
        assert re.search(r"Read at <span data-fq-read-at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", html), url


def test_links__no_link_for_jobs_without_a_tenant_or_internal_work(fq_prefix):
    from fairqueue.dashboard.links import tenant_url
    from fairqueue.scheduling.levels import INTERNAL_TENANT

    assert tenant_url(None) == tenant_url(INTERNAL_TENANT) == ""
    assert tenant_url("acme/do/pause") == reverse(TENANT, args=["acme/do/pause"])
    assert "/do/" not in tenant_url("acme/do/pause")
