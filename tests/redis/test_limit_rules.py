"""The pure limit decision (fairqueue.scheduling.limits) and release_held.lua held to it."""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairqueue.broker import get_sync_broker
from fairqueue.exceptions import InvalidTenantLimitError
from fairqueue.scheduling.limits import (
    CATCHUP_AHEAD,
    REASON_MAX_ACTIVE,
    REASON_PAUSED,
    REASON_RATE,
    TAKEABLE_CAP,
    TenantLimits,
    parse_limits,
    rate_burst,
    release_room,
)
from fairqueue.scheduling.wire import decoded_limits, encoded_limits

optional = st.one_of(st.none(), st.integers(1, 50))
limits_strategy = st.builds(
    lambda active, rate, duration, paused: TenantLimits(
        max_active=active,
        rate_max=rate,
        rate_duration_ms=None if rate is None else duration,
        paused=paused,
    ),
    optional,
    optional,
    st.integers(1_000, 60_000),
    st.booleans(),
)


@settings(max_examples=500, deadline=None)
@given(
    limits_strategy,
    st.integers(0, 300),
    st.integers(0, 60),
    st.integers(0, 60),
    st.integers(0, 8),
    st.booleans(),
    st.integers(0, 8),
)
def test_release_room__never_exceeds_a_limit_and_releases_all_it_may(
    limits, held, occupied, started, takeable, catching_up, untaken
):
    takeable = min(takeable, occupied)
    untaken = min(untaken, takeable)  # released before the window, not taken yet
    release = release_room(
        limits,
        held=held,
        occupied=occupied,
        started_in_window=started,
        takeable=takeable,
        untaken_before_window=untaken,
        catching_up=catching_up,
    )
    started += untaken  # they may start within the window: counted as its starts
    assert 0 <= release.count <= held
    if limits.paused:
        assert release.count == 0
        assert release.reason == (REASON_PAUSED if held else None)
        return
    rooms = [held]
    if limits.max_active is not None:
        assert release.count == 0 or occupied + release.count <= limits.max_active
        rooms.append(max(0, limits.max_active - occupied))
    if limits.rate_max is not None:
        assert release.count == 0 or started + release.count <= limits.rate_max
        assert release.count <= rate_burst(limits)  # paced, never rate_max at once
        assert release.count == 0 or takeable + release.count <= rate_burst(limits)
        rooms.append(max(0, min(limits.rate_max - started, rate_burst(limits) - takeable)))
    if catching_up:  # a resumed backlog: a few takeable at a time
        assert release.count == 0 or takeable + release.count <= CATCHUP_AHEAD
        rooms.append(max(0, CATCHUP_AHEAD - takeable))
    rooms.append(max(0, TAKEABLE_CAP - takeable))
    assert release.count == min(rooms)  # work-conserving: nothing held that may go
    if release.count < min(held, TAKEABLE_CAP - takeable):
        assert release.reason in (REASON_MAX_ACTIVE, REASON_RATE, REASON_PAUSED)
    elif release.count == held:
        assert release.reason is None


@settings(max_examples=200, deadline=None)
@given(limits_strategy, limits_strategy)
def test_over__own_values_win_and_a_rate_is_never_split(own, defaults):
    merged = own.over(defaults)
    assert merged.max_active == (
        own.max_active if own.max_active is not None else defaults.max_active
    )
    source = own if own.rate_max is not None else defaults
    assert (merged.rate_max, merged.rate_duration_ms) == (
        source.rate_max,
        source.rate_duration_ms,
    )
    assert merged.paused == (own.paused or defaults.paused)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"max_active": -1},
            "T['max_active']=-1 is not allowed: expected a whole number in "
            "1..1000000 or None for no limit",
        ),
        ({"rate_duration_ms": 5}, "T sets only one of rate_max and rate_duration_ms"),
        ({"max_active": 2.5}, "T['max_active']=2.5 is not allowed"),
    ],
)
def test_parse_limits__names_where_the_value_and_the_range(values, message):
    with pytest.raises(InvalidTenantLimitError) as info:
        parse_limits(values, where="T")
    assert str(info.value).startswith(message)


# -- release_held.lua makes the same decision ---------------------------------------------


@pytest.fixture
def redis_state(fq_prefix, redis_client):
    return fq_prefix, redis_client


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    limits=limits_strategy,
    held=st.integers(0, 12),
    occupied=st.integers(0, 12),
    started=st.integers(0, 12),
    untaken=st.integers(0, 3),
)
def test_release_script__releases_exactly_what_release_room_says(
    redis_state, limits, held, occupied, started, untaken
):
    prefix, client = redis_state
    tenant = uuid.uuid4().hex[:8]
    base = f"{prefix}:email:fq:lim"
    now_ms = int(time.time() * 1000)
    for i in range(held):  # held jobs as the add script leaves them
        job_id = f"{tenant}-h{i}"
        client.hset(f"{prefix}:email:{job_id}", mapping={"data": "{}", "priority": 2097151})
        client.zadd(f"{prefix}:email:delayed", {job_id: 253402300799000 * 4096})
        client.rpush(f"{base}:held:{tenant}", job_id)
        client.hset(f"{base}:meta", job_id, "normal\n1\n")
    for i in range(occupied):  # released jobs still running (their hash, in no finished set)
        job_id = f"{tenant}-o{i}"
        client.hset(f"{prefix}:email:{job_id}", mapping={"data": "{}"})
        client.sadd(f"{base}:out:{tenant}", job_id)
    for i in range(started):  # releases inside the rate window
        client.zadd(f"{base}:rate:{tenant}", {f"{tenant}-r{i}": now_ms - 100})
    for i in range(untaken):  # released before the window, still untaken (may start in it)
        job_id = f"{tenant}-u{i}"
        client.hset(f"{prefix}:email:{job_id}", mapping={"data": "{}"})
        client.zadd(f"{prefix}:email:prioritized", {job_id: (1024 << 32) + 4 * i + 2})
        client.sadd(f"{base}:out:{tenant}", job_id)
        if limits.rate_max is not None:
            client.zadd(f"{base}:rate:{tenant}", {job_id: now_ms - limits.rate_duration_ms - 5})
    client.sadd(f"{base}:tenants", tenant)
    client.hset(base, tenant, encoded_limits(limits))
    if limits.paused:
        client.hset(f"{base}:paused", tenant, 1)
    sync = get_sync_broker()
    released = sync.run(sync.broker.limits.release, "email", [tenant])
    expected = release_room(
        limits,
        held=held,
        occupied=occupied + untaken,
        started_in_window=started if limits.rate_max is not None else 0,
        takeable=untaken,
        untaken_before_window=untaken if limits.rate_max is not None else 0,
    )
    assert released.released == expected.count
    assert client.llen(f"{base}:held:{tenant}") == held - expected.count
    moved = [f"{tenant}-h{i}" for i in range(expected.count)]  # oldest first
    assert all(client.zscore(f"{prefix}:email:prioritized", job_id) for job_id in moved)
    assert not any(client.zscore(f"{prefix}:email:delayed", job_id) for job_id in moved)
    if expected.reason is not None and held - expected.count:
        assert released.by_reason[expected.reason] == held - expected.count


@given(limits_strategy, optional)
def test_limits_read_back_from_redis_are_the_limits_written(limits, max_waiting):
    """What the dashboard decodes from Redis is what an enqueue or an edit encoded."""
    written = TenantLimits(
        limits.max_active, limits.rate_max, limits.rate_duration_ms, max_waiting, limits.paused
    )
    assert decoded_limits(encoded_limits(written), paused=written.paused) == written
    assert decoded_limits(None) == decoded_limits("") == TenantLimits()
