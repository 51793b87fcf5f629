"""The on-call operator's question in a real browser (Debian's Chromium): "why is it
slow, and what do I do?". With a flooding tenant (its jobs past the bound), a limited
one, a paused one and a failing one present, two clicks from the overview reach the
culprit's page, which names what it is doing (text and numbers), and one more acts
(confirmed on a page of its own, then checked against BullMQ's sets). Runs on the
Django the environment has (``make test`` 5.2, ``make test-django6`` 6.1)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.helpers import bullmq_counts
from tests.helpers.console import FLOOD, seed_culprits
from tests.helpers.console_driver import OPERATOR_PERMS, off_loop, require_chromium

# serial: beside the parallel part its flooding tenant's overdue finding was once missing
# (it passes alone; the cause is not found).
require_chromium()
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.serial]

ROW = "[data-fq-overview-row=email]"
EMAIL = "section.fq-tenant-queue[data-job-type=email]"


def finding(console, kind: str) -> str:
    return console.text(f"{EMAIL} [data-fq-finding={kind}] [data-fq-finding-text]")


def badge(text: str) -> str:
    return f"{ROW} a[data-fq-attn]:has-text('{text}')"


def test_browser__two_clicks_from_the_overview_to_the_culprit_one_more_acts(
    console, limited, redis_client
):
    ids = seed_culprits(limited, redis_client)
    page = console.open("operator", *OPERATOR_PERMS)
    overview = reverse("admin:fairqueue_dashboard_changelist") + "?refresh_ms=60000"

    # At 1400 px the overview's table fits its box: no column cut, none to scroll to.
    console.go(overview)
    box = page.evaluate(
        "() => { const b = document.querySelector('.fq-overview .fq-scroll');"
        " return [b.scrollWidth, b.clientWidth]; }"
    )
    assert box[0] <= box[1], box

    # The flood: its jobs are every job past the bound.
    console.follow(badge(f"{FLOOD} job(s) past the wait bound"))  # 1
    assert page.url.endswith("/queue/email/#overdue-email")
    console.follow("[data-fq-overdue-flow=flood] a")  # 2
    assert console.text("h2").startswith("Tenant flood")
    assert finding(console, "overdue") == (
        f"{FLOOD} of its waiting jobs are past the 5m 00s bound, of the queue's {FLOOD} "
        "overdue: only its own jobs wait past the bound, no other tenant's."
    )
    assert console.text(f"{EMAIL} [data-fq-t=overdue]") == str(FLOOD)

    # One failed job retried from its page (confirmed), within its tenant's limits.
    job_id = ids["doomed"][0]
    console.go(reverse("admin:fairqueue_dashboard_job", args=["email", job_id]))
    assert "from ready to its start" in console.text("[data-fq-waited]")
    assert "back in line as a fair turn" in console.confirm("[data-fq-job-retry]")
    assert console.message().startswith(f"Retried job {job_id}: back in line")
    assert console.text("[data-fq-position]") == str(
        redis_client.llen(f"{limited}:email:wait")
        + redis_client.zrank(f"{limited}:email:prioritized", job_id)
        + 1
    )

    # The failing tenant: two clicks, then its failed jobs retried as fair turns.
    console.go(overview)
    console.follow(badge("1 tenant(s) failing"))  # 1
    console.follow("[data-fq-failing-tenant=doomed] a")  # 2
    assert finding(console, "failing").startswith(
        "Its jobs fail: 5 failed in the last 15 min, of 5 attempts it started (100%)."
    )
    groups = console.text(f"{EMAIL} [data-fq-failure-groups]")
    assert "ValueError" in groups and "\t5\t" in groups
    before = off_loop(bullmq_counts, limited, "email")
    touches = console.confirm(f"{EMAIL} [data-fq-finding-action=retry]")  # 3: acts
    assert "email: 5 failed job(s)" in touches
    assert console.message() == "Retried 5 failed job(s) of doomed, as fair turns."
    after = off_loop(bullmq_counts, limited, "email")
    assert (after["failed"], after["prioritized"]) == (0, before["prioritized"] + 5)

    # The paused tenant: its held jobs, then resumed from its verdict.
    console.go(overview)
    console.follow(badge("1 tenant(s) paused"))  # 1
    console.follow("[data-fq-limited=sleepy] a")  # 2
    assert finding(console, "paused") == (
        "It is paused: 2 job(s) held; none starts until it is resumed."
    )
    console.confirm(f"{EMAIL} [data-fq-finding-action=resume]")  # 3: acts
    assert console.message() == "Resumed sleepy: 2 held job(s) released at once."
    assert console.text("[data-fq-paused-state]") == "no"

    # The limited tenant says its own limits hold it, not the queue.
    console.go(overview)
    console.follow(badge("job(s) held by"))
    console.follow("[data-fq-limited=acme] a")
    assert finding(console, "limited") == (
        "Its own limits hold 3 job(s): 2 at once (0 running); their wait is its limits', "
        "not the queue's."
    )
