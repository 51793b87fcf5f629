"""Accounts in the scripts: the add, adoption (re-runs) and history scripts place a job of
an account by level, then account, then tenant exactly as the reference model
(``FairClock.place(account=...)``, docs/design.md "Accounts"), for nested weights, joins,
retries and charges; tenants without an account as before."""

import math
from collections import Counter

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairqueue.broker import MAX_PRIORITY, TAG_FLOOR, TAG_RESOLUTION, Broker, NewJob, SyncBroker
from fairqueue.broker.lock_store import Fence
from fairqueue.scheduling.fair_clock import FairClock
from fairqueue.scheduling.levels import PriorityLevel
from fairqueue.scheduling.order import replaced_tag
from fairqueue.scheduling.wire import flow_member
from tests.helpers.history import commit_history_page
from tests.helpers.keys import REDIS_URL, delete_prefix, run_prefix


def packed(key: str, field: str) -> list:
    """A flow's account field, or an account's state, of the flows' weights as the
    scripts wrote it: msgpack after a msgpack true (wire.lua)."""
    raw = redis.Redis.from_url(REDIS_URL).hget(key, field)
    assert raw is not None and raw[:1] == b"\xc3", raw
    unpacker = msgpack.Unpacker()
    unpacker.feed(raw)
    return list(unpacker)[1:]


pytestmark = pytest.mark.django_db

C, H, N, L = PriorityLevel.CRITICAL, PriorityLevel.HIGH, PriorityLevel.NORMAL, PriorityLevel.LOW
RANK = {C: 0, H: 1, N: 2, L: 3}
TENANTS = ("a", "b", "c", "d", "e")


class Queue:
    """A queue ``q`` under a fresh prefix, and the model beside it: every placement's
    score must be the model's tag in fixed point."""

    def __init__(self, accounts: dict[str, tuple[str, int]]) -> None:
        self.prefix = run_prefix()
        self.broker = SyncBroker(Broker(REDIS_URL, self.prefix))
        self.redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.key = f"{self.prefix}:q:prioritized"
        self.clock = FairClock()
        self.accounts = accounts  # tenant -> (account, account weight)
        self.placed: dict[str, tuple[int, int, float, PriorityLevel]] = {}
        self.owner: dict[str, str] = {}  # job id -> tenant
        self.taken: list[tuple[str, PriorityLevel, str]] = []
        self.parked = 0

    def close(self) -> None:
        self.broker.close()
        self.redis.close()
        delete_prefix(self.prefix)

    def _observe(self) -> None:
        """The model reads the head where a script does (an add, an adoption, a
        settlement), not as workers take jobs: the virtual time moves only then."""
        if self.placed:
            _, _, head_tag, head_level = min(self.placed.values())
            self.clock.observe_head(head_tag, head_level)

    def _expect(self, job_id: str, level: PriorityLevel, tag: float) -> None:
        self.placed[job_id] = (math.floor(tag * TAG_RESOLUTION), RANK[level], tag, level)
        _, _, head_tag, head_level = min(self.placed.values())
        self.clock.observe_head(head_tag, head_level)
        expected = TAG_FLOOR * 2**32 + math.floor(tag * TAG_RESOLUTION) * 4 + RANK[level]
        assert self.redis.zscore(self.key, job_id) == expected

    def add(self, batch: list[tuple[PriorityLevel, str, int]]) -> None:
        if batch:
            self._observe()
        jobs = []
        for level, tenant, weight in batch:
            account, account_weight = self.accounts.get(tenant, (None, 1))
            data = {"tenantId": tenant, "priorityLevel": level.value}
            jobs.append(
                NewJob(
                    "x",
                    data,
                    level,
                    tenant=tenant,
                    tenant_weight=weight,
                    account=account,
                    account_weight=account_weight,
                )
            )
        added = self.broker.add_jobs("q", jobs)
        for (level, tenant, weight), job in zip(batch, added, strict=True):
            account, account_weight = self.accounts.get(tenant, (None, 1))
            tag = self.clock.place(
                level, tenant, weight, account=account, account_weight=account_weight
            )
            self.owner[job.job_id] = tenant
            self._expect(job.job_id, level, tag)

    def take(self, count: int) -> None:
        """Take the ``count`` lowest scores (one job always left), as a worker would."""
        count = min(count, len(self.placed) - 1)
        if count > 0:
            for job_id, _ in self.redis.zpopmin(self.key, count):
                level = self.placed.pop(job_id)[3]
                tenant = self.redis.hget(f"{self.prefix}:q:{job_id}", "data")
                self.taken.append((job_id, level, tenant))

    def retry(self, picks: list[int]) -> None:
        """Jobs taken run again (as BullMQ re-adds them: at the cap, behind everything),
        then one adoption page places them, each as a new arrival of its flow."""
        chosen = []
        for pick in picks:
            if self.taken:
                chosen.append(self.taken.pop(pick % len(self.taken)))
        if not chosen:
            return
        self._observe()
        for job_id, _, _ in chosen:
            self.parked += 1
            self.redis.zadd(self.key, {job_id: MAX_PRIORITY * 2**32 + self.parked})
        fence = Fence(f"{self.prefix}:q:fq:leader", "t", 10_000)
        page = self.broker.run(
            self.broker.broker.passes.adopt_page,
            "q",
            fence=fence,
            page_size=len(chosen),
            max_wait_ms=10**9,
            max_payload_bytes=10_000,
            fairness_by="jobs",
        )
        assert page.adopted == len(chosen)
        for job_id, level, data in chosen:
            tenant = data.split('"tenantId":"')[1].split('"')[0]
            # the adoption's weight: the one its flow counts (1 with no work), as it reads it
            counted = self.redis.hget(f"{self.prefix}:q:fq:fweights", flow_member(level, tenant))
            account, account_weight = self.accounts.get(tenant, (None, 1))
            tag = self.clock.place(
                level,
                tenant,
                int(counted or 1),
                stored=True,
                account=account,
                account_weight=account_weight,
            )
            self.owner[job_id] = tenant
            self._expect(job_id, level, tag)

    def _move(
        self, level: PriorityLevel, tenant: str, moved: tuple[float, float, float, float]
    ) -> None:
        """The model's waiting jobs of the flow placed again as the pages place them."""
        anchor, ratio, shift, upto = moved
        for job_id, (units, rank, _, lvl) in list(self.placed.items()):
            mine = (lvl, self.owner[job_id]) == (level, tenant)
            # as the score keeps its tag, up to the flow's last when the move began
            if mine and anchor < units / TAG_RESOLUTION and units <= upto * TAG_RESOLUTION:
                tag = replaced_tag(units / TAG_RESOLUTION, anchor, ratio, shift)
                self.placed[job_id] = (math.floor(tag * TAG_RESOLUTION), rank, tag, lvl)

    def settle(self, settlements: list[tuple[PriorityLevel, str, float]]) -> None:
        """A history page that carries only ``settlements`` (flow, turns; one a flow, as
        the loop's page sums them), as the loop commits it (``history_commit.lua``), the
        re-placement pages that move a charged flow's waiting jobs, and the model's
        charges: every waiting job's score is then the model's."""
        if not settlements:
            return
        self._observe()
        merged: dict[tuple[PriorityLevel, str], float] = {}
        for level, tenant, debt in settlements:
            merged[(level, tenant)] = merged.get((level, tenant), 0.0) + debt
        settlements = [(*flow, debt) for flow, debt in merged.items()]
        commit_history_page(self.prefix, settlements)
        while self.broker.run(self.broker.broker.limits.replace_pages, "q", pages=8):
            pass
        for level, tenant, debt in settlements:
            moved = self.clock.charge(level, tenant, debt)
            if moved is not None:
                self._move(level, tenant, moved)
        assert {k: float(v) for k, v in self.redis.zscan_iter(self.key)} == {
            job_id: float(TAG_FLOOR * 2**32 + units * 4 + rank)
            for job_id, (units, rank, _, _) in self.placed.items()
        }

    def recost(self, recost: tuple[PriorityLevel, str, float, float] | None) -> None:
        """A history page that carries only a first measurement of a flow (its ratio and
        shift, in turns), as the loop commits it, the re-placement pages, and the model's
        ``recost``: every waiting job's score is then the model's."""
        if recost is None:
            return
        self._observe()
        level, tenant, ratio, shift = recost
        commit_history_page(self.prefix, [], [recost])
        while self.broker.run(self.broker.broker.limits.replace_pages, "q", pages=8):
            pass
        moved = self.clock.recost(level, tenant, ratio, shift)
        if moved is not None:
            self._move(level, tenant, moved)
        assert {k: float(v) for k, v in self.redis.zscan_iter(self.key)} == {
            job_id: float(TAG_FLOOR * 2**32 + units * 4 + rank)
            for job_id, (units, rank, _, _) in self.placed.items()
        }


arrival = st.tuples(
    st.sampled_from([C, N, L]), st.sampled_from(TENANTS), st.sampled_from([1, 1, 2, 3])
)
#: Which tenants share an account, and each account's weight: a..e each in account X,
#: Y or none.
accounts_of = st.tuples(
    st.lists(st.sampled_from(["X", "Y", None]), min_size=5, max_size=5),
    st.sampled_from([1, 2, 5]),
    st.sampled_from([1, 3]),
).map(
    lambda drawn: {
        tenant: (account, drawn[1] if account == "X" else drawn[2])
        for tenant, account in zip(TENANTS, drawn[0], strict=True)
        if account is not None
    }
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    accounts_of,
    st.lists(
        st.tuples(
            st.lists(arrival, min_size=1, max_size=10),
            st.integers(0, 10),
            st.lists(st.integers(0, 50), max_size=3),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_the_scripts_place_accounts_jobs_as_the_model(accounts, rounds):
    """Batches of arrivals of tenants in accounts (nested weights: tenant weights inside
    account weights) and of tenants without one, jobs taken in between (flows run out of
    work and join again, accounts with them), and taken jobs run again (adopted as new
    arrivals of their flows): every score is exactly the model's."""
    queue = Queue(accounts)
    try:
        for batch, taken, retried in rounds:
            queue.add(batch)
            queue.take(taken)
            queue.retry(retried)
    finally:
        queue.close()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    accounts_of,
    st.lists(
        st.tuples(
            st.lists(arrival, min_size=1, max_size=8),
            st.lists(
                st.tuples(
                    st.sampled_from([C, N, L]),
                    st.sampled_from(TENANTS),
                    st.sampled_from([1.0, 2.5, -0.5]),
                ),
                max_size=2,
            ),
            st.integers(0, 8),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_charges_move_an_accounts_flow_by_its_hierarchical_step_as_the_model(accounts, rounds):
    """Worker time charged to a flow of an account (the history page's settlements) moves
    its last tag by its own hierarchical step, as the model's charge does; later jobs'
    scores stay exactly the model's."""
    queue = Queue(accounts)
    queue.redis.hset(f"{queue.prefix}:q:fq:state", "typ", 100)  # fairness by time, measured
    try:
        # a backlog taken half-way: a refund carried never places a job below the floor
        queue.add([(L, "z", 1)] * 100)
        queue.take(50)
        for batch, settlements, taken in rounds:
            queue.add(batch)
            queue.settle(settlements)
            queue.take(taken)
    finally:
        queue.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    accounts_of,
    st.lists(
        st.tuples(
            st.lists(arrival, min_size=1, max_size=8),
            st.none()
            | st.tuples(
                st.sampled_from([C, N, L]),
                st.sampled_from(TENANTS),
                st.sampled_from([4.0, 0.25, 1.0]),
                st.sampled_from([0.0, 3.0, -3.0]),
            ),
            st.integers(0, 8),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_a_first_measurement_places_an_accounts_flow_again_as_the_model(accounts, rounds):
    """A flow of an account measured for the first time has its waiting jobs placed again
    at the ratio, its overrun shifted by a turn of its own spacing inside its account's,
    as the model's ``recost``; later jobs' scores stay exactly the model's."""
    queue = Queue(accounts)
    queue.redis.hset(f"{queue.prefix}:q:fq:state", "typ", 100)  # fairness by time, measured
    try:
        queue.add([(L, "z", 1)] * 30)
        queue.take(10)
        for batch, recost, taken in rounds:
            queue.add(batch)
            queue.recost(recost)
            queue.take(taken)
    finally:
        queue.close()


def test_ten_tenants_of_one_account_beside_another_accounts_one_take_half():
    """The case accounts are for, in the script: one account's 10 tenants flooding a level
    beside another account's single tenant take half of it (flat, they took 10/11), the
    ten sharing that half equally; and a weight change of one of the ten leaves its
    level's total, which counts accounts, as it was."""
    accounts = {f"big-{i}": ("big", 1) for i in range(10)} | {"small": ("small", 1)}
    queue = Queue(accounts)
    try:
        for _ in range(40):
            queue.add([(N, f"big-{i}", 1) for i in range(10)] + [(N, "small", 1)] * 10)
        order = [job_id for job_id, _ in queue.redis.zrange(queue.key, 0, 199, withscores=True)]
        owners = Counter(
            queue.redis.hget(f"{queue.prefix}:q:{job_id}", "data").split('"tenantId":"')[1][:5]
            for job_id in order
        )
        assert owners["small"] == 100
        state = f"{queue.prefix}:q:fq:state"
        assert queue.redis.hget(state, "W:normal") == "2"  # two accounts of weight 1
        changed = queue.broker.run(queue.broker.broker.limits.set_weight, "q", "big-3", 4)
        assert changed == 1
        assert queue.redis.hget(state, "W:normal") == "2"
        # the account's tenant weights with work, 13, and its weight, 1 (its state's first two)
        assert packed(f"{queue.prefix}:q:fq:fweights", "normal\n\nbig")[:2] == [13, 1]
    finally:
        queue.close()


def test_every_enqueue_path_places_a_tenants_jobs_under_its_account(
    fq_prefix, redis_client, django_capture_on_commit_callbacks
):
    """The account the enqueue resolved reaches the scripts on every path: a direct and a
    durable enqueue are placed under it, a held job (its tenant limited) carries it in
    its held meta and is placed under it when released, and a delayed job keeps it in its
    opts for when it is placed (as a re-run does)."""
    from fairqueue import pause_tenant, resume_tenant
    from fairqueue.enqueue.api import enqueue_job, enqueue_jobs, enqueue_on_commit
    from fairqueue.enqueue.priority import wire_tenant_plan_lookup
    from fairqueue.models import Account, TenantPlan
    from tests.helpers import release

    big = Account.objects.create(account_id="big", weight=2)
    TenantPlan.objects.create(tenant_id="big-1", account=big)
    TenantPlan.objects.create(tenant_id="big-2", account=big, max_active=5)
    wire_tenant_plan_lookup()
    pause_tenant("big-2")
    direct = enqueue_job("email", {}, tenant_id="big-1")
    with django_capture_on_commit_callbacks(execute=True):
        durable = enqueue_on_commit("email", {}, tenant_id="big-1")
    held = enqueue_jobs("email", [{}, {}], tenant_id="big-2")
    later = enqueue_job("email", {}, tenant_id="big-1", delay_ms=60_000)
    level = direct.level.value
    assert durable.level == direct.level and held[0].level == direct.level
    weights = f"{fq_prefix}:email:fq:fweights"
    group = f"{level}\n\nbig"
    # a flow's account after a line feed where a spacing would be; the account's tenant
    # weights with work and its weight first in its state
    assert packed(weights, f"s\n{level}\nbig-1")[0] == "big"
    assert packed(weights, group)[:2] == [1, 2]
    meta = redis_client.hget(f"{fq_prefix}:email:fq:lim:meta", held[0].job_id)
    assert meta.endswith("\n2\nbig")
    resume_tenant("big-2")
    release()
    assert packed(weights, f"s\n{level}\nbig-2")[0] == "big"
    assert packed(weights, group)[:2] == [2, 2]
    assert redis_client.hget(f"{fq_prefix}:email:fq:state", f"W:{level}") == "2"
    opts = redis_client.hget(f"{fq_prefix}:email:{later.job_id}", "opts")
    assert '"fqAcct":"2\\nbig"' in opts
