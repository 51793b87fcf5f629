"""Fair order at enqueue time: the add script places every job by fairqueue's rule
(``scheduler.FairClock``), atomically with BullMQ's own add, and a stock worker consumes
that order with no rebalance pass at all."""

import math
import time
from collections import Counter

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairqueue.broker import (
    MAX_PRIORITY,
    TAG_FLOOR,
    TAG_RESOLUTION,
    Broker,
    NewJob,
    SyncBroker,
    get_sync_broker,
)
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.scheduling.fair_clock import FairClock
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.order import replaced_tag
from tests.helpers import drain_with_stock_worker
from tests.helpers.history import commit_history_page
from tests.helpers.keys import REDIS_URL, delete_prefix, run_prefix

pytestmark = pytest.mark.django_db

C, H, N, L = PriorityLevel.CRITICAL, PriorityLevel.HIGH, PriorityLevel.NORMAL, PriorityLevel.LOW
RANK = {C: 0, H: 1, N: 2, L: 3}

arrival = st.tuples(
    st.sampled_from(list(PriorityLevel)),
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.sampled_from([1, 1, 1, 2, 3, 7]),
)


def _add(broker: SyncBroker, arrivals: list[tuple[PriorityLevel, str, int]]) -> list:
    """One add_jobs call of (level, tenant, tenant weight) arrivals; the jobs added (their
    payloads carry the tenant id, as the enqueue API's do)."""
    return broker.add_jobs(
        "q",
        [
            NewJob("x", {"tenantId": tenant}, level, tenant=tenant, tenant_weight=w)
            for level, tenant, w in arrivals
        ],
    )


def _observe_head(clock, placed) -> None:
    """The model reads the head where a script does (an add, a settlement): the virtual
    time never moves between scripts, whatever the workers take."""
    if placed:
        _, _, head_tag, head_level = min(placed.values())
        clock.observe_head(head_tag, head_level)


def _add_as_the_model(broker, redis_client, clock, placed, key, batch) -> list:
    """Add ``batch`` and place it in the model too; each job's score must be the model's
    tag in fixed point. ``placed``: job id -> (units, rank, tag, level) of those waiting."""
    if batch:
        _observe_head(clock, placed)
    added = _add(broker, batch)
    for (level, tenant, weight), job in zip(batch, added, strict=True):
        tag = clock.place(level, tenant, weight)
        placed[job.job_id] = (math.floor(tag * TAG_RESOLUTION), RANK[level], tag, level)
        _, _, head_tag, head_level = min(placed.values())
        clock.observe_head(head_tag, head_level)
        expected = TAG_FLOOR * 2**32 + math.floor(tag * TAG_RESOLUTION) * 4 + RANK[level]
        assert redis_client.zscore(key, job.job_id) == expected
    return added


def _take_as_a_worker(redis_client, clock, placed, key, taken) -> None:
    """Take the ``taken`` lowest scores (one job always left), and tell the model."""
    taken = min(taken, len(placed) - 1)
    if taken:
        for job_id, _ in redis_client.zpopmin(key, taken):
            del placed[job_id]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(arrival, min_size=1, max_size=12), min_size=1, max_size=6))
def test_the_add_script_places_every_job_as_the_reference_model(batches):
    """Batches of arrivals (levels, tenants, tenant weights), nothing consumed: each job's
    score in BullMQ's prioritized set is exactly the Python model's tag, in fixed point."""
    prefix = run_prefix()
    broker = SyncBroker(Broker(REDIS_URL, prefix))
    redis_client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    clock, placed = FairClock(), []
    try:
        for batch in batches:
            added = _add(broker, batch)
            for (level, tenant, weight), job in zip(batch, added, strict=True):
                tag = clock.place(level, tenant, weight)
                placed.append((math.floor(tag * TAG_RESOLUTION), RANK[level], tag, level))
                # The script reads the virtual time from the head's score: the same order.
                _, _, head_tag, head_level = min(placed)
                clock.observe_head(head_tag, head_level)
                expected = TAG_FLOOR * 2**32 + math.floor(tag * TAG_RESOLUTION) * 4 + RANK[level]
                assert redis_client.zscore(f"{prefix}:q:prioritized", job.job_id) == expected
                # The hash keeps the cap: where BullMQ re-adds a job that runs again.
                assert job.priority == TAG_FLOOR
                assert int(redis_client.hget(f"{prefix}:q:{job.job_id}", "priority")) == (
                    MAX_PRIORITY
                )
    finally:
        broker.close()
        redis_client.close()
        delete_prefix(prefix)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.lists(arrival, min_size=1, max_size=12), st.integers(0, 12)),
        min_size=1,
        max_size=6,
    )
)
def test_the_add_script_places_as_the_model_while_a_worker_takes_jobs(rounds):
    """Batches of arrivals with jobs taken in between (the lowest scores, as a worker
    takes them; one job always left, so the clock never starts afresh): the virtual time
    moves, flows run out of work and stop counting, and each job's score is still exactly
    the model's, batch after batch (the call's memo of the flows agrees with Redis)."""
    prefix = run_prefix()
    broker = SyncBroker(Broker(REDIS_URL, prefix))
    redis_client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    clock, placed = FairClock(), {}
    key = f"{prefix}:q:prioritized"
    try:
        for batch, taken in rounds:
            _add_as_the_model(broker, redis_client, clock, placed, key, batch)
            _take_as_a_worker(redis_client, clock, placed, key, taken)
    finally:
        broker.close()
        redis_client.close()
        delete_prefix(prefix)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.lists(arrival, min_size=1, max_size=10),
            st.integers(0, 8),
            st.none() | st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([1, 2, 5])),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_a_weight_change_is_counted_at_once_as_the_model_counts_it(rounds):
    """Batches of arrivals, jobs taken, and between them a tenant's weight changed (what a
    TenantPlan save sends): its flows with work count the new weight at once, the levels'
    totals with them, its waiting jobs are placed again where the model places them (the
    other tenants' keep their scores), and every later job's score, of that tenant and of
    the others, is still exactly the model's."""
    prefix = run_prefix()
    broker = SyncBroker(Broker(REDIS_URL, prefix))
    redis_client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    clock, placed, owner = FairClock(), {}, {}
    key = f"{prefix}:q:prioritized"
    try:
        for batch, taken, change in rounds:
            added = _add_as_the_model(broker, redis_client, clock, placed, key, batch)
            for (_, tenant, _), job in zip(batch, added, strict=True):
                owner[job.job_id] = tenant
            _take_as_a_worker(redis_client, clock, placed, key, taken)
            if change is not None:
                _observe_head(clock, placed)
                before = dict(redis_client.zscan_iter(key))
                tenant, weight = change
                changed = broker.run(broker.broker.limits.set_weight, "q", tenant, weight)
                assert changed == sum(
                    1 for (_, t), w in clock.counted.items() if t == tenant and w != weight
                )
                moved = clock.reweight(tenant, weight)
                for job_id, (units, rank, _, level) in list(placed.items()):
                    anchor, ratio = moved.get((level, owner[job_id]), (math.inf, 1.0))
                    if units / TAG_RESOLUTION > anchor:  # as the score keeps its tag
                        tag = replaced_tag(units / TAG_RESOLUTION, anchor, ratio)
                        placed[job_id] = (math.floor(tag * TAG_RESOLUTION), rank, tag, level)
                        before[job_id] = TAG_FLOOR * 2**32 + placed[job_id][0] * 4 + rank
                if placed:
                    _, _, head_tag, head_level = min(placed.values())
                    clock.observe_head(head_tag, head_level)
                assert dict(redis_client.zscan_iter(key)) == before
                assert not redis_client.exists(f"{prefix}:q:fq:rw")  # done in the call
                state = redis_client.hgetall(f"{prefix}:q:fq:state")
                for level in PriorityLevel:
                    total = sum(w for (lvl, _), w in clock.counted.items() if lvl == level)
                    assert int(state.get(f"W:{level.value}", 0)) == total
                    if (level, tenant) in clock.counted:
                        assert redis_client.hget(
                            f"{prefix}:q:fq:fweights", f"{level.value}\n{tenant}"
                        ) == str(weight)
    finally:
        broker.close()
        redis_client.close()
        delete_prefix(prefix)


def test_placing_a_tenants_flows_again_leaves_the_virtual_time_where_it_was(
    fq_prefix, redis_client
):
    """A raised tenant's critical job moved ahead of its low one, not yet moved, is the
    set's head for a moment: that moment is no virtual time (docs/design.md, "A weight
    change"), so the low flow, whose job still waits, keeps counting."""
    broker = get_sync_broker()
    arrivals = [(C, "a", 1)] * 4 + [(C, "a", 2), (C, "b", 1), (C, "b", 1), (L, "a", 1)]
    broker.add_jobs(
        "email",
        [
            NewJob("email", {"tenantId": t}, lvl, tenant=t, tenant_weight=w)
            for lvl, t, w in arrivals
        ],
    )
    key, state = f"{fq_prefix}:email:prioritized", f"{fq_prefix}:email:fq:state"
    redis_client.zpopmin(key, 6)  # left: a's low job (tag 12, start 0), its critical (15)
    vt = redis_client.hget(state, "vt")
    assert broker.run(broker.broker.limits.set_weight, "email", "a", 5) == 2
    assert redis_client.hget(state, "vt") == vt
    broker.add_jobs("email", [NewJob("email", {"tenantId": "b"}, C, tenant="b")])
    assert redis_client.hget(state, "W:low") == "5"
    assert redis_client.zscore(f"{fq_prefix}:email:fq:flows", "low\na") == pytest.approx(2.4)


def test_a_new_job_goes_ahead_of_waiting_jobs_when_its_tag_says_so(fq_prefix, redis_client):
    enqueue_jobs("email", [{} for _ in range(1_000)], tenant_id="bulk", priority_level="low")
    urgent = enqueue_job("email", {}, tenant_id="ops", priority_level="critical")
    assert redis_client.zrank(f"{fq_prefix}:email:prioritized", urgent.job_id) <= 1
    sparse = enqueue_job("email", {}, tenant_id="small", priority_level="low")
    assert redis_client.zrank(f"{fq_prefix}:email:prioritized", sparse.job_id) <= 3


# Tags are fixed when a job is added: a backlog added while its tenant was alone keeps
# the spacing it got then. The floods below arrive together, as live floods do.


def test_two_tenants_flooding_a_level_alternate_for_a_stock_worker(fq_prefix):
    for _ in range(100):
        enqueue_job("email", {}, tenant_id="A", priority_level="normal")
        enqueue_job("email", {}, tenant_id="B", priority_level="normal")
    order = [data["tenantId"] for _, data in drain_with_stock_worker(fq_prefix, "email", 200)]
    for start in range(0, 200, 20):
        assert Counter(order[start : start + 20]) == {"A": 10, "B": 10}


def test_bursts_sent_one_after_another_share_the_next_jobs_a_stock_worker_takes(fq_prefix):
    """Ten tenants' bursts of 100 jobs, one after another: the next 400 jobs a stock
    worker takes split evenly, not in the order the bursts came (docs/design.md, "Joining
    a level"; placed at the weight split among the tenants already there: 100, 100, 54,
    37, 28, 22, 18, 16, 13, 12)."""
    tenants = [f"t{n}" for n in range(10)]
    for tenant in tenants:
        enqueue_jobs("email", [{}] * 100, tenant_id=tenant, priority_level="normal")
    order = [data["tenantId"] for _, data in drain_with_stock_worker(fq_prefix, "email", 400)]
    assert Counter(order) == dict.fromkeys(tenants, 40)


def test_a_weight_3_tenant_gets_three_turns_per_round(fq_prefix):
    for _ in range(50):
        enqueue_jobs("email", [{}] * 3, tenant_id="big", priority_level="normal", tenant_weight=3)
        enqueue_job("email", {}, tenant_id="small", priority_level="normal")
    order = [data["tenantId"] for _, data in drain_with_stock_worker(fq_prefix, "email", 120)]
    for start in range(0, 120, 20):
        assert Counter(order[start : start + 20]) == {"big": 15, "small": 5}


def test_a_levels_share_does_not_grow_with_its_tenant_count(fq_prefix):
    for _ in range(40):
        for tenant in range(8):
            enqueue_job("email", {}, tenant_id=f"c{tenant}", priority_level="critical")
        enqueue_jobs("email", [{}] * 2, tenant_id="solo", priority_level="low")
    order = [data["priorityLevel"] for _, data in drain_with_stock_worker(fq_prefix, "email", 300)]
    assert abs(Counter(order[:300])["low"] - 60) <= 2


def test_ready_time_is_redis_clock_not_the_producers(fq_prefix, redis_client, monkeypatch):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 600)  # a producer 10 minutes behind
    job = enqueue_job("email", {}, tenant_id="t", priority_level="low")
    monkeypatch.setattr(time, "time", real)
    seconds, _ = redis_client.time()
    (second,) = redis_client.zrange(f"{fq_prefix}:email:fq:ready", 0, -1)
    assert 0 <= seconds - int(second) < 5  # indexed by the second it became ready
    assert redis_client.lrange(f"{fq_prefix}:email:fq:ready:{second}", 0, -1) == [job.job_id]
    stamped = int(redis_client.hget(f"{fq_prefix}:email:{job.job_id}", "timestamp"))
    assert seconds * 1000 - stamped > 500_000  # BullMQ's own timestamp is the producer's


def test_the_ready_slot_is_filled_with_redis_clock_for_every_job_of_a_call(fq_prefix, redis_client):
    """The packer's fqReady slot is overwritten in Redis, as bytes: every job of a batch
    stores Redis's clock (the second it is indexed under) and the cap as its priority,
    and no job keeps the slot's placeholder."""
    import json

    jobs = enqueue_jobs("email", [{"i": i} for i in range(20)], tenant_id="t")
    seconds, _ = redis_client.time()
    readies = set()
    for job in jobs:
        opts = json.loads(redis_client.hget(f"{fq_prefix}:email:{job.job_id}", "opts"))
        assert opts["priority"] == MAX_PRIORITY
        assert abs(opts["fqReady"] - seconds * 1000) < 5_000
        readies.add(opts["fqReady"])
    assert len(readies) == 1  # one call, one ready time
    (second,) = redis_client.zrange(f"{fq_prefix}:email:fq:ready", 0, -1)
    assert int(second) == readies.pop() // 1000
    listed = redis_client.lrange(f"{fq_prefix}:email:fq:ready:{second}", 0, -1)
    assert listed == [job.job_id for job in jobs]  # one RPUSH, in the call's order


def test_opts_without_the_slot_are_still_repacked_with_the_ready_time(
    fq_prefix, redis_client, monkeypatch
):
    """A caller of the add script whose opts lack the slot gets the full repack."""
    import json

    from fairqueue.broker import adding

    monkeypatch.setattr(adding, "with_ready_slot", lambda packed: packed)
    (command,) = adding.AddPacker(fq_prefix).add_commands("email", [NewJob("x", {}, N)])
    assert not command.named["jobs"][2].endswith(adding.READY_SLOT)  # the job's packed opts
    redis_client.script_load(command.source)
    reply = redis_client.evalsha(command.sha, len(command.keys), *command.keys, *command.args)
    opts = json.loads(redis_client.hget(f"{fq_prefix}:email:{reply[0]}", "opts"))
    seconds, _ = redis_client.time()
    assert opts["priority"] == MAX_PRIORITY and abs(opts["fqReady"] - seconds * 1000) < 5_000


def test_the_ready_slot_extends_any_msgpack_map():
    import msgpack

    from fairqueue.broker.adding import with_ready_slot

    for size in (0, 1, 14, 15, 16, 70_000):
        opts = {f"k{i}": i for i in range(size)}
        assert msgpack.unpackb(with_ready_slot(msgpack.packb(opts))) == {
            **opts,
            "fqReady": 2**64 - 1,
        }
    with pytest.raises(ValueError):
        with_ready_slot(msgpack.packb([1, 2]))


def test_an_idle_queue_starts_afresh_at_the_floor(fq_prefix, redis_client):
    enqueue_jobs("email", [{}] * 30, tenant_id="t", priority_level="low")
    drain_with_stock_worker(fq_prefix, "email", 30)
    again = enqueue_job("email", {}, tenant_id="t", priority_level="low")
    score = redis_client.zscore(f"{fq_prefix}:email:prioritized", again.job_id)
    assert score == TAG_FLOOR * 2**32 + 12 * TAG_RESOLUTION * 4 + 3


@pytest.mark.slow
def test_a_180k_backlog_of_one_tenant_leaves_no_job_without_room(fq_prefix, redis_client):
    # One low tenant uses 12 tag units a job: with whole priorities as tags the cap came
    # after ~170k jobs and the rest waited unordered at the back.
    broker = get_sync_broker()
    for _ in range(18):
        broker.add_jobs("email", [NewJob("email", {}, L, tenant="bulk")] * 10_000)
    urgent = enqueue_job("email", {}, tenant_id="ops", priority_level="critical")
    key = f"{fq_prefix}:email:prioritized"
    assert redis_client.zcount(key, MAX_PRIORITY * 2**32, "+inf") == 0
    assert redis_client.zrank(key, urgent.job_id) <= 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(arrival, min_size=1, max_size=30),
    st.dictionaries(
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.floats(min_value=0.1, max_value=5_000, allow_nan=False),
    ),
    st.one_of(st.none(), st.floats(min_value=1, max_value=5_000, allow_nan=False)),
)
def test_with_measured_costs_the_add_script_places_as_the_model(arrivals, estimates, unit):
    """Fairness by time: each flow's step is its cost in turns (its estimate over the
    queue's typical run time, on the model's grid) times the turn's length (the typical
    time over the unit), exactly as the Python model says."""
    from fairqueue.scheduling.order import cost_turns, turn_scale

    prefix = run_prefix()
    broker = SyncBroker(Broker(REDIS_URL, prefix))
    redis_client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    typical = 100.0
    state = f"{prefix}:q:fq:state"
    redis_client.hset(state, "typ", typical)
    for level in PriorityLevel:
        for tenant, ms in estimates.items():
            redis_client.hset(state, f"c:{level.value}\n{tenant}", ms)
    clock, placed, scale = FairClock(), [], 1.0
    try:
        if unit is not None:
            # A job waiting (placed when the queue was idle: a turn was the typical time),
            # then the typical time has moved away from the unit.
            _add(broker, [(PriorityLevel.LOW, "z", 1)])
            tag = clock.place(PriorityLevel.LOW, "z", 1)
            placed.append(
                (math.floor(tag * TAG_RESOLUTION), RANK[PriorityLevel.LOW], tag, PriorityLevel.LOW)
            )
            clock.observe_head(tag, PriorityLevel.LOW)
            redis_client.hset(state, "unit", f"{unit:.6g}")
            scale = turn_scale(typical, float(f"{unit:.6g}"))
        added = _add(broker, arrivals)
        for (level, tenant, weight), job in zip(arrivals, added, strict=True):
            tag = clock.place(
                level, tenant, weight, cost=cost_turns(estimates.get(tenant), typical) * scale
            )
            placed.append((math.floor(tag * TAG_RESOLUTION), RANK[level], tag, level))
            _, _, head_tag, head_level = min(placed)
            clock.observe_head(head_tag, head_level)
            expected = TAG_FLOOR * 2**32 + math.floor(tag * TAG_RESOLUTION) * 4 + RANK[level]
            assert redis_client.zscore(f"{prefix}:q:prioritized", job.job_id) == expected
    finally:
        broker.close()
        delete_prefix(prefix)
        redis_client.close()


def test_a_declared_cost_places_only_a_flow_with_nothing_measured(fq_prefix, redis_client):
    """``cost=`` cannot buy share: once a flow's runs are measured, its jobs are placed by
    what they measured (one turn each here), however small a cost it declares; a flow
    with nothing measured yet is placed by its declaration."""
    broker = get_sync_broker()
    state = f"{fq_prefix}:email:fq:state"
    redis_client.hset(state, mapping={"typ": 200, "c:normal\nliar": 200, "c:normal\nhonest": 200})
    jobs = [
        NewJob("x", {}, PriorityLevel.NORMAL, tenant=tenant, cost_ms=cost)
        for _ in range(4)
        for tenant, cost in (("liar", 1), ("honest", None))
    ]
    added = broker.add_jobs("email", jobs)
    scores = [redis_client.zscore(f"{fq_prefix}:email:prioritized", job.job_id) for job in added]
    liar, honest = scores[0::2], scores[1::2]
    assert liar == honest  # the same turns, ties to the earlier arrival
    (new,) = broker.add_jobs(
        "email", [NewJob("x", {}, PriorityLevel.NORMAL, tenant="new", cost_ms=1)]
    )
    # nothing measured for "new": its declaration (1/16 turn, the least) places it
    new_score = redis_client.zscore(f"{fq_prefix}:email:prioritized", new.job_id)
    assert new_score < liar[1]


def test_one_add_call_retires_at_most_expire_per_call_idle_flows(fq_prefix, redis_client):
    """Flows with no work left stop counting towards their level; however many jobs one
    call places (each may move the virtual time), it retires at most EXPIRE_PER_CALL of
    them, and later calls retire the rest."""
    from fairqueue.broker.scripts import EXPIRE_PER_CALL

    idle = 3 * EXPIRE_PER_CALL
    enqueue_jobs("email", [{} for _ in range(idle)], tenant_id="busy", priority_level="normal")
    for n in range(idle):
        enqueue_job("email", {}, tenant_id=f"one{n}", priority_level="normal")
    prioritized, flows = f"{fq_prefix}:email:prioritized", f"{fq_prefix}:email:fq:flows"
    # taken by workers: every one-job tenant's job (and as many of busy's) is gone
    redis_client.zpopmin(prioritized, 2 * idle - 10)
    assert redis_client.zcard(flows) == idle + 1
    broker = get_sync_broker()
    retired = []
    for call in range(3):
        before = redis_client.zcard(flows)
        # one call placing ten new tenants' jobs, each ahead of busy's backlog
        broker.add_jobs("email", [NewJob("x", {}, N, tenant=f"new{call}-{n}") for n in range(10)])
        retired.append(before + 10 - redis_client.zcard(flows))
    # the cap binds while more flows are idle than it, and the rest go in later calls
    assert retired[:2] == [EXPIRE_PER_CALL, EXPIRE_PER_CALL]
    assert 0 < retired[2] <= EXPIRE_PER_CALL


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.lists(
                st.tuples(
                    st.sampled_from(list(PriorityLevel)),
                    st.sampled_from(["a", "b", "c"]),
                    st.sampled_from([1, 2]),
                ),
                max_size=8,
            ),
            st.lists(
                st.tuples(
                    st.sampled_from(list(PriorityLevel)),
                    st.sampled_from(["a", "b", "c"]),
                    st.sampled_from([1.0, 2.5, 16.0, -0.5, -3.0]),
                ),
                max_size=2,
            ),
            st.integers(0, 10),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_settlements_move_placements_as_the_model_and_an_idle_flows_is_carried(rounds):
    """Fairness by time: a settlement of a flow with work moves its waiting jobs and its
    last tag (a refund never behind the virtual time); one of a flow with no work left is
    carried to its next job (``p:`` in fq:state), which pays it with its own turn;
    batches, settlements and jobs taken in between, every job's score exactly the
    model's (``FairClock.charge``, ``replaced_tag``)."""
    prefix = run_prefix()
    broker = SyncBroker(Broker(REDIS_URL, prefix))
    redis_client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    redis_client.hset(f"{prefix}:q:fq:state", "typ", 100)
    clock, placed, owner = FairClock(), {}, {}
    key = f"{prefix}:q:prioritized"
    try:
        # A backlog taken half-way: the virtual time well past the floor, so a refund
        # carried never places a job below it.
        added = _add_as_the_model(broker, redis_client, clock, placed, key, [(L, "z", 1)] * 100)
        owner.update((job.job_id, "z") for job in added)
        _take_as_a_worker(redis_client, clock, placed, key, 50)
        for batch, settlements, taken in rounds:
            added = _add_as_the_model(broker, redis_client, clock, placed, key, batch)
            owner.update((job.job_id, tenant) for (_, tenant, _), job in zip(batch, added))
            if settlements:
                _observe_head(clock, placed)
            merged: dict[tuple[PriorityLevel, str], float] = {}  # one a flow, as a page's
            for level, tenant, debt in settlements:
                merged[(level, tenant)] = merged.get((level, tenant), 0.0) + debt
            commit_history_page(prefix, [(*flow, debt) for flow, debt in merged.items()])
            while broker.run(broker.broker.limits.replace_pages, "q", pages=8):
                pass
            for (level, tenant), debt in merged.items():
                moved = clock.charge(level, tenant, debt)
                for job_id, (units, rank, _, lvl) in list(placed.items()):
                    if moved is None or (lvl, owner[job_id]) != (level, tenant):
                        continue
                    anchor, ratio, shift, upto = moved
                    # as the score keeps its tag, up to the flow's last when it began
                    if anchor < units / TAG_RESOLUTION and units <= upto * TAG_RESOLUTION:
                        tag = replaced_tag(units / TAG_RESOLUTION, anchor, ratio, shift)
                        placed[job_id] = (math.floor(tag * TAG_RESOLUTION), rank, tag, lvl)
            assert {k: float(v) for k, v in redis_client.zscan_iter(key)} == {
                job_id: float(TAG_FLOOR * 2**32 + units * 4 + rank)
                for job_id, (units, rank, _, _) in placed.items()
            }
            assert not redis_client.exists(f"{prefix}:q:fq:rw")
            _take_as_a_worker(redis_client, clock, placed, key, taken)
    finally:
        broker.close()
        redis_client.close()
        delete_prefix(prefix)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.lists(arrival, min_size=1, max_size=10),
            st.none()
            | st.tuples(
                st.sampled_from(list(PriorityLevel)),
                st.sampled_from(["a", "b", "c"]),
                st.sampled_from([4.0, 0.25, 16.0, 1 / 16, 1.0]),
                # refunds too: one carried past a job's cost is left for the next job
                st.sampled_from([0.0, 3.0, 40.0, -3.0]),
            ),
            st.integers(0, 8),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_a_cold_flows_first_measurement_places_its_jobs_again_as_the_model(rounds):
    """Fairness by time: a flow measured for the first time, its cost off what its jobs
    paid cold (one turn), has its waiting jobs placed again from the virtual time at the
    ratio, its overrun so far (the shift) paid at once, each moved job's ``fqPaid`` scaled
    with it; a flow with no work gets the shift as a settlement. Every job's score, moved
    or placed later, is exactly the model's (``FairClock.recost``, ``replaced_tag``)."""
    prefix = run_prefix()
    broker = SyncBroker(Broker(REDIS_URL, prefix))
    redis_client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    redis_client.hset(f"{prefix}:q:fq:state", "typ", 100)
    clock, placed, owner, paid = FairClock(), {}, {}, {}
    key = f"{prefix}:q:prioritized"
    try:
        added = _add_as_the_model(broker, redis_client, clock, placed, key, [(L, "z", 1)] * 30)
        owner.update((job.job_id, "z") for job in added)
        _take_as_a_worker(redis_client, clock, placed, key, 10)
        for batch, recost, taken in rounds:
            # The head as the add script reads it when it starts (a re-placement moves no
            # virtual time: what the head stands for is read by the next placement).
            _, _, head_tag, head_level = min(placed.values())
            clock.observe_head(head_tag, head_level)
            added = _add_as_the_model(broker, redis_client, clock, placed, key, batch)
            for (_, tenant, _), job in zip(batch, added, strict=True):
                owner[job.job_id], paid[job.job_id] = tenant, 1.0  # cold: one turn
            if recost is not None:
                level, tenant, ratio, shift = recost
                before = dict(redis_client.zscan_iter(key))
                commit_history_page(prefix, [], [recost])
                while broker.run(broker.broker.limits.replace_pages, "q", pages=8):
                    pass
                moved = clock.recost(level, tenant, ratio, shift)
                for job_id, (units, rank, _, lvl) in list(placed.items()):
                    if moved is None or (lvl, owner[job_id]) != (level, tenant):
                        continue
                    anchor, ratio_, shift_, upto = moved
                    # as the score keeps its tag, up to the flow's last when it began
                    if anchor < units / TAG_RESOLUTION and units <= upto * TAG_RESOLUTION:
                        tag = replaced_tag(units / TAG_RESOLUTION, anchor, ratio_, shift_)
                        placed[job_id] = (math.floor(tag * TAG_RESOLUTION), rank, tag, lvl)
                        before[job_id] = TAG_FLOOR * 2**32 + placed[job_id][0] * 4 + rank
                        paid[job_id] *= ratio_
                        assert float(
                            redis_client.hget(f"{prefix}:q:{job_id}", "fqPaid")
                        ) == pytest.approx(paid[job_id], rel=1e-5)
                assert dict(redis_client.zscan_iter(key)) == before
                assert not redis_client.exists(f"{prefix}:q:fq:rw")
            _take_as_a_worker(redis_client, clock, placed, key, taken)
    finally:
        broker.close()
        redis_client.close()
        delete_prefix(prefix)


def test_a_cold_flood_measured_slow_is_spread_at_its_cost_and_its_overrun_paid_at_once(
    fq_prefix, redis_client
):
    """A tenant that floods before its first run is measured places its backlog at one
    turn a job, beside a quick tenant's; once measured at 4 turns a job, with 6 turns
    already overrun, its waiting jobs are placed again: of the next 20 jobs a worker takes
    the slow tenant gets 3 (a fifth, by time half, less the turns it overran), not 10."""
    redis_client.hset(f"{fq_prefix}:q:fq:state", "typ", 100)
    broker = SyncBroker(Broker(REDIS_URL, fq_prefix))
    clock, placed = FairClock(), {}
    key = f"{fq_prefix}:q:prioritized"
    try:
        added = _add_as_the_model(
            broker, redis_client, clock, placed, key, [(N, "slow", 1), (N, "quick", 1)] * 40
        )
        owner = {job.job_id: ("slow", "quick")[i % 2] for i, job in enumerate(added)}
        commit_history_page(fq_prefix, [], [(N, "slow", 4.0, 6.0)])
        while broker.run(broker.broker.limits.replace_pages, "q", pages=8):
            pass
        taken = [owner[job_id] for job_id, _ in redis_client.zpopmin(key, 20)]
        assert Counter(taken) == {"quick": 17, "slow": 3}
        slow_left = [j for j in owner if owner[j] == "slow" and redis_client.zscore(key, j)]
        assert {redis_client.hget(f"{fq_prefix}:q:{j}", "fqPaid") for j in slow_left} == {"4"}
    finally:
        broker.close()


def test_a_settlement_moves_the_flows_waiting_jobs_and_one_during_a_move_waits(
    fq_prefix, redis_client
):
    """A flow's overrun moves its waiting jobs at once (from the head up), so the next
    jobs a worker takes are the other flow's; a second settlement while the move is
    still in progress waits in the flow's balance (``d:``) for a later page."""
    redis_client.hset(f"{fq_prefix}:q:fq:state", "typ", 100)
    broker = SyncBroker(Broker(REDIS_URL, fq_prefix))
    clock, placed = FairClock(), {}
    key, state = f"{fq_prefix}:q:prioritized", f"{fq_prefix}:q:fq:state"
    try:
        added = _add_as_the_model(
            broker, redis_client, clock, placed, key, [(N, "slow", 1), (N, "quick", 1)] * 20
        )
        owner = {job.job_id: ("slow", "quick")[i % 2] for i, job in enumerate(added)}
        commit_history_page(fq_prefix, [(N, "slow", 8.0)])  # begun, no page run yet
        last = redis_client.zscore(f"{fq_prefix}:q:fq:flows", "normal\nslow")
        commit_history_page(fq_prefix, [(N, "slow", 3.0)])
        assert float(redis_client.hget(state, "d:normal\nslow")) == 3.0
        assert redis_client.zscore(f"{fq_prefix}:q:fq:flows", "normal\nslow") == last
        while broker.run(broker.broker.limits.replace_pages, "q", pages=1):
            pass
        taken = [owner[job_id] for job_id, _ in redis_client.zpopmin(key, 8)]
        assert Counter(taken) == {"quick": 8}  # 8 turns owed: the next 8 are quick's
    finally:
        broker.close()


def test_an_overrun_of_a_flow_with_no_work_left_is_paid_by_its_next_job(fq_prefix, redis_client):
    """A flow whose last job ran past its turn after its flow had no work left (a flow that
    keeps emptying) is still charged: its next job pays the overrun with its own turn, so
    it lands behind a newcomer's first job instead of beside it."""
    redis_client.hset(f"{fq_prefix}:q:fq:state", "typ", 100)
    broker = SyncBroker(Broker(REDIS_URL, fq_prefix))
    clock, placed = FairClock(), {}
    key = f"{fq_prefix}:q:prioritized"
    try:
        _add_as_the_model(broker, redis_client, clock, placed, key, [(L, "z", 1)] * 10)
        _add_as_the_model(broker, redis_client, clock, placed, key, [(N, "a", 1)])
        _take_as_a_worker(redis_client, clock, placed, key, 3)  # a's job ran; z's go on
        _observe_head(clock, placed)
        commit_history_page(fq_prefix, [(N, "a", 4.0)])  # it used 5 turns, paid 1
        clock.charge(N, "a", 4.0)
        assert float(redis_client.hget(f"{fq_prefix}:q:fq:state", "p:normal\na")) == 4.0
        again, newcomer = _add_as_the_model(
            broker, redis_client, clock, placed, key, [(N, "a", 1), (N, "b", 1)]
        )
        assert redis_client.zscore(key, again.job_id) > redis_client.zscore(key, newcomer.job_id)
        assert not redis_client.hexists(f"{fq_prefix}:q:fq:state", "p:normal\na")  # paid once
    finally:
        broker.close()


def test_a_cold_flow_measured_cheaper_moves_earlier_and_jobs_added_meanwhile_follow(
    fq_prefix, redis_client
):
    """A cold flow measured at half what its jobs paid has its waiting jobs placed again
    at once, half as far from the virtual time, not repaid job by job behind its backlog
    (which a flood's never drains). Jobs it adds while the move is paged go behind its
    old last tag; once the move is done its next job comes the move earlier, before
    them."""
    redis_client.hset(f"{fq_prefix}:q:fq:state", "typ", 100)
    broker = SyncBroker(Broker(REDIS_URL, fq_prefix))
    clock, placed = FairClock(), {}
    key, flows = f"{fq_prefix}:q:prioritized", f"{fq_prefix}:q:fq:flows"
    try:
        added = _add_as_the_model(
            broker, redis_client, clock, placed, key, [(N, "quick", 1), (N, "slow", 1)] * 20
        )
        owner = {job.job_id: ("quick", "slow")[i % 2] for i, job in enumerate(added)}
        last = redis_client.zscore(flows, "normal\nquick")
        commit_history_page(fq_prefix, [], [(N, "quick", 0.5, 0.0)])  # begun, no page run
        assert redis_client.zscore(flows, "normal\nquick") == last
        meanwhile = _add(broker, [(N, "quick", 1)] * 2)
        scores = {job.job_id: redis_client.zscore(key, job.job_id) for job in meanwhile}
        while broker.run(broker.broker.limits.replace_pages, "q", pages=1):
            pass
        _observe_head(clock, placed)
        anchor, ratio, shift, _ = clock.recost(N, "quick", 0.5, 0.0) or (0, 0, 0, 0)
        assert (ratio, shift) == (0.5, 0.0)
        # the jobs added meanwhile keep their place; the flow goes on the move earlier
        assert {job.job_id: redis_client.zscore(key, job.job_id) for job in meanwhile} == scores
        moved = anchor + (last - anchor) * 0.5
        assert redis_client.zscore(flows, "normal\nquick") == last + 2 * 12 - (last - moved)
        (after,) = _add(broker, [(N, "quick", 1)])
        assert redis_client.zscore(key, after.job_id) < min(scores.values())
        # its 20 jobs within 20 turns of the virtual time now within 10: 16 of the next 24
        taken = [owner[job_id] for job_id, _ in redis_client.zpopmin(key, 24)]
        assert Counter(taken) == {"quick": 16, "slow": 8}
    finally:
        broker.close()
