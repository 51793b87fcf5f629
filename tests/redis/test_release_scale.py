"""The release step's work follows what can move, not how many tenants have limits: it
visits the tenants due (docs/design.md, "Releasing at scale"). Real Redis, the real
bullmq package and a stock worker; each test its own prefix."""

from __future__ import annotations

import pytest

from fairqueue.broker import NewJob, get_sync_broker
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.limits import TenantLimits
from fairqueue.scheduling.wire import encoded_limits
from tests.helpers import release, run_stock_worker, settle_releases

# Timing-sensitive (live workers, loops): `make test` runs them after the parallel part.
pytestmark = [pytest.mark.django_db, pytest.mark.serial]

TENANTS = 300


@pytest.fixture
def at_their_limit(fq_prefix, redis_client):
    """TENANTS tenants with max_active 1 and two jobs each: one released, one held; the
    release step has made its first visits (its sweep over them is done)."""
    sync = get_sync_broker()
    limits = encoded_limits(TenantLimits(max_active=1))
    jobs = [
        NewJob(
            name="job",
            data={"tenantId": f"t{t}"},
            level=PriorityLevel.NORMAL,
            job_id=f"t{t}-{n}",
            tenant=f"t{t}",
            limits=limits,
        )
        for t in range(TENANTS)
        for n in range(2)
    ]
    sync.add_jobs("email", jobs)
    settle_releases()
    return fq_prefix


def due_scores(redis_client, base):
    return {
        member: score
        for member, score in redis_client.zrange(f"{base}:due", 0, -1, withscores=True)
    }


def now_ms(redis_client) -> int:
    seconds, micros = redis_client.time()
    return seconds * 1000 + micros // 1000


def test_release_step__a_finished_job_makes_only_its_tenant_due(at_their_limit, redis_client):
    base = f"{at_their_limit}:email:fq:lim"
    before = due_scores(redis_client, base)
    assert len(before) == TENANTS
    # every tenant is at its limit: none is due before the backstop visit
    assert min(before.values()) > now_ms(redis_client) + 20_000
    assert release().released == 0

    since = redis_client.xrevrange(f"{at_their_limit}:email:events", "+", "-", count=1)[0][0]
    # (a stock worker closing may finish a few more jobs than the one it waited for)
    finished, _ = run_stock_worker(at_their_limit, 1, concurrency=1)
    tenants = {job_id.split("-")[0] for job_id in finished}
    # heard from BullMQ's events: each one's next job
    assert release().released == len(tenants) < TENANTS // 10
    for tenant in tenants:
        assert redis_client.zscore(f"{at_their_limit}:email:prioritized", f"{tenant}-1")
    after = due_scores(redis_client, base)
    changed = {t for t in before if after.get(t) != before[t]}
    # no other tenant was visited: only those whose jobs BullMQ's events named (a job a
    # closing worker took and did not finish sends 'active' too)
    named = {
        fields["jobId"].split("-")[0]
        for _, fields in redis_client.xrange(f"{at_their_limit}:email:events", since, "+")
        if "jobId" in fields
    }
    assert tenants <= changed <= named
    assert len(named) < TENANTS // 10


@pytest.mark.parametrize("trim_to", [0, 1])
def test_release_step__events_lost_to_trimming_start_a_sweep(at_their_limit, redis_client, trim_to):
    base = f"{at_their_limit}:email:fq:lim"
    queue_key = f"{at_their_limit}:email"
    finished, _ = run_stock_worker(at_their_limit, 1, concurrency=1)
    tenants = {job_id.split("-")[0] for job_id in finished}
    if trim_to:
        redis_client.xadd(f"{queue_key}:events", {"event": "other"})
    redis_client.xtrim(f"{queue_key}:events", maxlen=trim_to)

    # until the sweep is done and no tenant is due: a fixed number of calls assumed a
    # machine fast enough to visit every swept tenant within it (each call stops at ~2 ms)
    released = settle_releases()
    assert released == len(tenants)
    for tenant in tenants:
        assert redis_client.zscore(f"{queue_key}:prioritized", f"{tenant}-1")
    assert not redis_client.exists(f"{base}:sweep")


def test_release_step__new_limits_make_the_tenant_due(at_their_limit, redis_client):
    queue_key = f"{at_their_limit}:email"
    sync = get_sync_broker()
    sync.run(sync.broker.limits.set_limits, "email", "t7", TenantLimits(max_active=2))
    assert release().released == 1
    assert redis_client.zscore(f"{queue_key}:prioritized", "t7-1")


def test_release_step__a_stream_emptied_then_trimmed_again_starts_a_sweep(
    at_their_limit, redis_client
):
    """After a call found the stream empty, entries written since are new, not lost; but
    entries trimmed before they were read are, and make every tenant due again."""
    base = f"{at_their_limit}:email:fq:lim"
    events = f"{at_their_limit}:email:events"
    redis_client.xtrim(events, maxlen=0)
    for _ in range(TENANTS // 100 + 3):
        release()
    assert not redis_client.exists(f"{base}:sweep")
    for n in range(5):
        redis_client.xadd(events, {"event": "other", "n": n})
    release()
    assert not redis_client.exists(f"{base}:sweep")  # read, none lost
    for n in range(5):
        redis_client.xadd(events, {"event": "other", "n": n})
    redis_client.xtrim(events, maxlen=2, approximate=False)
    release()
    assert redis_client.exists(f"{base}:sweep")
