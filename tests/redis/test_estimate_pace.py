"""Estimates in mixes (``scheduling/pace.py`` through the real scripts): a flow's wait
follows the max-min share it gets now given who is asking, not its weight among the
flows counted in its level; a held tenant's jobs follow its real release pace.

The history of the last half minute is written as the loop records it (per 10 s bucket:
starts per level, the most served flows), so each test states the pace it assumes."""

from __future__ import annotations

import pytest

from fairqueue import enqueue_job, enqueue_jobs, estimate_start, job_status, pause_tenant
from fairqueue.scheduling.calibration import error_bin
from tests.helpers.jobs import write_history

pytestmark = pytest.mark.django_db


def test_a_quiet_weight_2_tenant_counts_for_what_it_uses(fq_prefix, redis_client):
    """A flooding weight-1 tenant beside a quiet weight-2 tenant (counted in its level
    while its one job waits): the flood gets all the quiet one leaves, not a third."""
    per_s = {("normal", "flood"): 10.0}
    write_history(redis_client, fq_prefix, per_s)
    enqueue_job("email", {}, tenant_id="quiet", priority_level="normal", tenant_weight=2)
    jobs = enqueue_jobs("email", [{}] * 60, tenant_id="flood", priority_level="normal")
    est = estimate_start("email", tenant_id="flood", priority_level="normal")
    assert est.ahead == 61
    # 60 of its own jobs before it at the whole 10 jobs a second: about 6 s (by the
    # weights, a third of the workers: 18 s)
    assert 5_000 <= est.expected_wait_ms <= 7_500
    assert est.share is not None and est.share > 0.9
    assert est.earliest_start_ms < est.expected_start_ms < est.latest_start_ms
    # job_status of its last job says the same as the estimate did
    status = job_status("email", jobs[-1].job_id)
    assert status.state == "waiting"
    assert 4_800 <= status.estimate.expected_wait_ms <= 7_500
    assert status.estimate.share is not None and status.estimate.share > 0.9
    # the tenant page's entitlement is the same figure, not "weight 1 of 3"
    from fairqueue.dashboard.tenant_page import tenant_page_data

    page = next(q for q in tenant_page_data("flood").queues if q.queue == "email")
    assert page.entitled["normal"] == pytest.approx(est.level_share, abs=0.02)
    assert page.entitled["normal"] > 0.9


def test_a_level_that_starts_to_flood_takes_its_share_at_once(fq_prefix, redis_client):
    """The last half minute only normal ran (10 jobs a second); now critical has a
    backlog too. The normal flood's jobs go at normal's 2 parts of 6 from now on, not at
    the pace the history measured."""
    write_history(redis_client, fq_prefix, {("normal", "n"): 10.0})
    enqueue_jobs("email", [{}] * 30, tenant_id="n", priority_level="normal")
    enqueue_jobs("email", [{}] * 100, tenant_id="c", priority_level="critical")
    est = estimate_start("email", tenant_id="n", priority_level="normal")
    # 30 of its jobs before it at a third of 10 a second: 9 s (at the measured pace: 3 s)
    assert 7_000 <= est.expected_wait_ms <= 11_500
    assert est.share == pytest.approx(1 / 3, rel=0.15)


def test_a_max_active_tenants_held_jobs_follow_its_measured_release_pace(limited, redis_client):
    """acme (max_active=2) was served 1 job a second beside a flood: its 28th held job
    waits for 28 of its releases at that pace, not for 28 typical runs over 2."""
    fq_prefix = limited
    enqueue_jobs("email", [{}] * 50, tenant_id="flood", priority_level="normal")
    jobs = enqueue_jobs("email", [{}] * 30, tenant_id="acme", priority_level="normal")
    # written after the adds, just before the reads: the release pace is read over the
    # last buckets, the current one as it stands (as the loop keeps it)
    write_history(redis_client, fq_prefix, {("normal", "acme"): 1.0, ("normal", "flood"): 9.0})
    redis_client.hset(f"{fq_prefix}:email:fq:state", "typ", 100)  # 100 ms typical runs
    status = job_status("email", jobs[-1].job_id)
    assert status.state == "held" and status.held_reason == "max_active"
    assert status.ahead == 27
    assert 24_000 <= status.estimate.expected_wait_ms <= 40_000
    new = estimate_start("email", tenant_id="acme", priority_level="normal")
    assert new.held_reason == "max_active"
    assert 25_000 <= new.expected_wait_ms <= 40_000


def test_paused_and_quiet_tenants_beside_a_flood(limited, redis_client):
    """A paused tenant with jobs held, a quiet weight-2 tenant and a quiet critical
    tenant beside a flood in normal: the flood gets all but what the quiet ones use."""
    fq_prefix = limited
    per_s = {("normal", "flood"): 9.0, ("critical", "ops"): 1.0, ("normal", "quiet"): 0.2}
    write_history(redis_client, fq_prefix, per_s)
    pause_tenant("beta")
    enqueue_jobs("email", [{}] * 20, tenant_id="beta", priority_level="normal")
    enqueue_job("email", {}, tenant_id="quiet", priority_level="normal", tenant_weight=2)
    enqueue_job("email", {}, tenant_id="ops", priority_level="critical")
    enqueue_jobs("email", [{}] * 45, tenant_id="flood", priority_level="normal")
    est = estimate_start("email", tenant_id="flood", priority_level="normal")
    # 45 before it at the 8.8 jobs a second the others leave: about 5.1 s
    assert 4_200 <= est.expected_wait_ms <= 6_500
    assert est.share == pytest.approx(0.88, abs=0.05)
    assert estimate_start("email", tenant_id="beta").held_reason == "paused"


def test_high_confidence_only_where_recent_estimates_were_close(fq_prefix, redis_client):
    per_s = {("normal", "a"): 10.0}
    close = {error_bin(1000, 1000): 40}
    write_history(redis_client, fq_prefix, per_s, bins={"normal": close})
    enqueue_jobs("email", [{}] * 20, tenant_id="a", priority_level="normal")
    sure = estimate_start("email", tenant_id="a", priority_level="normal")
    assert sure.confidence == "high"
    width = sure.latest_start_ms - sure.earliest_start_ms
    assert 0 < width < sure.expected_wait_ms  # a close history: a narrow range


def test_far_off_recent_estimates_widen_the_range_and_lower_the_confidence(fq_prefix, redis_client):
    per_s = {("normal", "a"): 10.0}
    off = {error_bin(2500, 1000): 20, error_bin(1000, 1000): 20}
    write_history(redis_client, fq_prefix, per_s, bins={"normal": off})
    enqueue_jobs("email", [{}] * 20, tenant_id="a", priority_level="normal")
    est = estimate_start("email", tenant_id="a", priority_level="normal")
    assert est.confidence == "low"
    wait = est.expected_wait_ms
    # half of them started more than twice as late: the range reaches three times on
    assert est.latest_start_ms - est.expected_start_ms >= 1.5 * wait


def test_a_flow_whose_last_tag_ran_ahead_with_nothing_waiting_is_not_a_backlog(
    fq_prefix, redis_client
):
    """'ran' was served far beyond its weight (its 40 jobs taken by the workers while the
    queue was nearly idle): its last tag lies 40 steps past the virtual time, but nothing
    of it waits. n, the only flow waiting, goes at the whole measured pace, not at half
    of it beside a backlog 'ran' does not have."""
    write_history(redis_client, fq_prefix, {("normal", "n"): 10.0})
    ran = enqueue_jobs("email", [{}] * 40, tenant_id="ran", priority_level="normal")
    enqueue_jobs("email", [{}] * 40, tenant_id="n", priority_level="normal")
    flows = f"{fq_prefix}:email:fq:flows"
    assert redis_client.zscore(flows, "normal\nran") is not None
    assert redis_client.zrem(f"{fq_prefix}:email:prioritized", *[j.job_id for j in ran]) == 40
    est = estimate_start("email", tenant_id="n", priority_level="normal")
    assert est.ahead == 40
    # 40 jobs before it at the whole 10 a second: 4 s (beside a backlogged 'ran': 8 s)
    assert 3_500 <= est.expected_wait_ms <= 5_000
    assert est.share is not None and est.share > 0.9
    # while 'ran' has jobs waiting, the same read halves n's share
    enqueue_jobs("email", [{}] * 10, tenant_id="ran", priority_level="normal")
    both = estimate_start("email", tenant_id="n", priority_level="normal")
    assert both.share == pytest.approx(0.5, abs=0.05)


@pytest.mark.parametrize("seen_ms", [10, 2_000])
def test_close_estimates_of_a_few_ms_say_nothing_of_a_wait_of_seconds(
    fq_prefix, redis_client, seen_ms
):
    """Near idle, every estimate of a few ms comes out tight (a start in 10 ms against
    0 ms expected is noise); when a backlog then forms, a job expected to wait seconds is
    not ``high`` on their word, and its range is at least the uncalibrated one (half to
    twice). Estimates of its scale that came out tight do make it ``high``."""
    tight = {error_bin(seen_ms, seen_ms): 40}
    write_history(
        redis_client,
        fq_prefix,
        {("normal", "a"): 10.0},
        bins={"normal": tight},
        expected_ms={"normal": seen_ms},
    )
    enqueue_jobs("email", [{}] * 20, tenant_id="a", priority_level="normal")
    est = estimate_start("email", tenant_id="a", priority_level="normal")
    wait = est.expected_wait_ms
    assert 1_000 <= wait <= 3_000
    if seen_ms < 100:
        assert est.confidence == "medium"
        assert est.latest_start_ms - est.expected_start_ms >= wait
    else:
        assert est.confidence == "high"
        assert est.latest_start_ms - est.expected_start_ms < wait / 2
