"""The held jobs' rank index (``L:hrank:<t>``, tenant_limits.lua): every script that
holds or releases a job keeps it in the held list's order, so ``job_status`` answers a
held job's place with a ZRANK instead of walking the list, and the index never disagrees
with the list whatever moved the jobs (held at the add, released, pulled back and
scanned by a pause, due delayed jobs joining, removed from the console)."""

from __future__ import annotations

import pytest

from fairqueue import enqueue_job, enqueue_jobs, job_status, pause_tenant, resume_tenant
from fairqueue.models import TenantPlan
from tests.helpers import drain_with_stock_worker, release, wait_until

pytestmark = pytest.mark.django_db


def held_of(redis_client, prefix: str, tenant: str) -> list[str]:
    return redis_client.lrange(f"{prefix}:email:fq:lim:held:{tenant}", 0, -1)


def index_of(redis_client, prefix: str, tenant: str) -> list[str]:
    return redis_client.zrange(f"{prefix}:email:fq:lim:hrank:{tenant}", 0, -1)


def assert_index_is_the_list(redis_client, prefix: str, tenant: str) -> None:
    """The index holds the list's ids in the list's order, and every held job's status
    says its place in the list."""
    held = held_of(redis_client, prefix, tenant)
    assert index_of(redis_client, prefix, tenant) == held
    for place, job_id in enumerate(held):
        status = job_status("email", job_id)
        assert (status.state, status.ahead) == ("held", place)


def test_held_at_the_add_and_released_oldest_first(limited, redis_client):
    jobs = enqueue_jobs("email", [{}] * 12, tenant_id="acme")  # max_active=2: ten held
    assert len(held_of(redis_client, limited, "acme")) == 10
    assert_index_is_the_list(redis_client, limited, "acme")
    drain_with_stock_worker(limited, "email", 2)
    release()
    assert len(held_of(redis_client, limited, "acme")) == 8  # two released, from the front
    assert_index_is_the_list(redis_client, limited, "acme")
    assert job_status("email", jobs[-1].job_id).ahead == 7


def test_a_pause_pulls_back_and_scans_in_and_the_index_follows(limited, redis_client):
    """Paused: the released, untaken jobs go back to the front of the held list, and the
    tenant's jobs placed before it had limits go ahead of its held ones, in their order."""
    early = enqueue_jobs("email", [{}] * 5, tenant_id="late")  # no limits yet: placed
    TenantPlan.objects.create(tenant_id="late", plan_tier="pro", max_active=1)
    enqueue_jobs("email", [{}] * 4, tenant_id="late")  # limited now: one released, 3 held
    assert len(held_of(redis_client, limited, "late")) == 3
    pause_tenant("late")
    held = held_of(redis_client, limited, "late")
    assert len(held) == 9 and held[:5] == [job.job_id for job in early]  # scanned in, first
    assert_index_is_the_list(redis_client, limited, "late")
    resume_tenant("late")
    release()
    assert_index_is_the_list(redis_client, limited, "late")


def test_due_delayed_jobs_join_behind_and_a_removed_job_leaves_both(limited, redis_client):
    from fairqueue.broker import get_sync_broker
    from fairqueue.broker.console_reads import ConsoleReads

    enqueue_jobs("email", [{}] * 6, tenant_id="acme")  # four held
    late = [enqueue_job("email", {}, tenant_id="acme", delay_ms=50) for _ in range(3)]
    assert wait_until(
        lambda: release() is not None and len(held_of(redis_client, limited, "acme")) == 7
    )
    assert held_of(redis_client, limited, "acme")[4:] == [job.job_id for job in late]
    assert_index_is_the_list(redis_client, limited, "acme")
    sync = get_sync_broker()
    gone = held_of(redis_client, limited, "acme")[2]
    assert sync.run(ConsoleReads(sync.broker.conn).remove_job, "email", gone)
    assert gone not in index_of(redis_client, limited, "acme")
    assert_index_is_the_list(redis_client, limited, "acme")
    page = held_of(redis_client, limited, "acme")[:2]  # the console's removal of a page
    removal = sync.run(ConsoleReads(sync.broker.conn).remove_waiting, "email", "acme", page)
    assert removal.removed == 2
    assert not set(page) & set(index_of(redis_client, limited, "acme"))
    assert_index_is_the_list(redis_client, limited, "acme")


def test_jobs_held_before_the_index_existed_keep_their_place(limited, redis_client):
    """An upgrade: the list's front has ids the index lacks. A job the index has counts
    them in; one it lacks is looked for among them (a bounded walk)."""
    old = enqueue_jobs("email", [{}] * 8, tenant_id="acme")  # six held
    redis_client.delete(f"{limited}:email:fq:lim:hrank:acme")  # as before the index
    new = enqueue_jobs("email", [{}] * 3, tenant_id="acme")
    held = held_of(redis_client, limited, "acme")
    assert held == [job.job_id for job in old[2:] + new]
    assert [job_status("email", job_id).ahead for job_id in held] == list(range(9))
