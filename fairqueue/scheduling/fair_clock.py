"""The add script's placement rule as a reference model, one arrival at a time:
:class:`FairClock` (``lua/include/fair_clock.lua`` is the same rule; the placement tests
require the same tags). Its steps, costs and re-placements are
:mod:`fairqueue.scheduling.order`'s; this module keeps the state between arrivals: the
virtual time, each flow's last tag, the joining and account state, and the charges a
flow's runs left (docs/design.md, "The rule", "Joining a level", "Accounts", "Service
is worker time").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from fairqueue.scheduling.hierarchy import ACCOUNT_MARK, flow_share, group_of, level_groups
from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, PriorityLevel
from fairqueue.scheduling.order import (
    FRONTIER_SCAN,
    MIN_COST_TURNS,
    TAG_SCALE,
    Move,
    flow_step,
    replaced_tag,
)
from fairqueue.scheduling.wire import flow_member


@dataclass
class FairClock:
    """The add script's placement rule, one arrival at a time (a reference model).

    ``vt`` is the virtual time: what the first waiting job stands for, never going back.
    The script reads it from that job's score alone (no per-job record): the job's
    finish tag as the score keeps it (``resolution`` units per tag unit) less one turn of
    a lone weight-1 tenant of its level, which is its start tag or a little past it. A
    flow whose last tag is not ahead of ``vt`` has no work left and stops counting
    towards its level's total; when it comes back it starts at ``vt``. Tags are floats:
    the script keeps them as Lua numbers.
    """

    weights: Mapping[PriorityLevel, int] = field(default_factory=lambda: DEFAULT_FAIR_WEIGHTS)
    resolution: int = 1_024
    vt: float = 0.0
    last: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)
    counted: dict[tuple[PriorityLevel, str], int] = field(default_factory=dict)
    #: A joining account's catch-up horizon: where its level's backlogs ended when it
    #: joined (keyed by level and tenant, or ``ACCOUNT_MARK`` + account).
    horizon: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)
    #: The level's split (its accounts' weights) an account's last job was placed with, so
    #: one joining beside its backlog is placed at its spacing
    #: (docs/design.md, "Joining a level").
    spacing: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)
    #: A charge (turns) a flow's runs left after it had no work: its next job pays it
    #: with its own turn (:meth:`charge`; ``p:`` fields of fq:state).
    carried: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)
    #: The account a flow with work counts under (absent: none, the flow is its own
    #: account), kept until the flow retires, and each (level, account)'s weight.
    accounts: dict[tuple[PriorityLevel, str], str] = field(default_factory=dict)
    account_weights: dict[tuple[PriorityLevel, str], int] = field(default_factory=dict)
    #: A tenant that joined its account's flows with work: where their backlogs ended
    #: then, and the account's split it is placed at until it gets there (the densest its
    #: mates were placed at, at most their weights): the joining rule one level down.
    inner: dict[tuple[PriorityLevel, str], tuple[float, float]] = field(default_factory=dict)
    #: The level's split an account's flows together were last placed at (its spacing
    #: less what its tenants catching up inside it add): what a joining account matches.
    density: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)
    #: The account's split (its flows' weights) a flow's last job was placed with.
    inner_spacing: dict[tuple[PriorityLevel, str], float] = field(default_factory=dict)

    def observe_head(self, head_tag: float | None, head_level: PriorityLevel | None = None) -> None:
        """Advance the virtual time to what the first waiting job (its finish tag and
        level) stands for."""
        if head_tag is None or head_level is None:
            return
        start = (
            math.floor(head_tag * self.resolution) / self.resolution
            - TAG_SCALE / self.weights[head_level]
        )
        if start > self.vt:
            self.vt = start

    def place(
        self,
        level: PriorityLevel,
        tenant: str,
        tenant_weight: int = 1,
        *,
        cost: float = 1.0,
        stored: bool = False,
        account: str | None = None,
        account_weight: int = 1,
    ) -> float:
        """The finish tag of a new job of (``level``, ``tenant``); jobs run in tag order.
        ``cost`` is its worker time in turns. An overdue job is placed the same way: it
        takes its flow's next turn and is charged for it, so a flow over its share never
        takes a turn from another flow by being late.

        Hierarchical max-min (docs/design.md, "Accounts"): a level's accounts share it by
        account weight, an account's tenants share the account's part by tenant weight;
        a tenant without an account is an account of its own, of its weight, so without
        accounts every tag is the flat rule's. A flow with work keeps its account.

        An account that joins a level whose other accounts have backlogs is placed at
        their spacing (the level's split among the others, as their jobs were placed)
        until it reaches where those backlogs ended when it joined: its round-robin turn
        from its first job, instead of paying for the backlogs placed while it was idle.
        A tenant joining its account's flows with work does the same inside the account.

        ``stored``: ``tenant_weight`` was stored with the job when it was enqueued (a
        delayed or held job, a rerun): a flow with work places it by the weight it counts,
        so a weight changed since (:meth:`reweight`) is kept; so is its account's.
        """
        self._retire()
        key = (level, tenant)
        if stored and key in self.counted:
            tenant_weight = self.counted[key]
        if key in self.counted:
            account = self.accounts.get(key)
        group = group_of(tenant, account)
        groups = self._groups(level, key)
        weight = tenant_weight if account is None else account_weight
        if account is not None and stored and group in groups:
            weight = groups[group][0]
        mates = groups.pop(group, (weight, 0))[1]
        others = sum(w for w, _ in groups.values())
        start = max(self.vt, self.last.get(key, self.vt))
        joined = None
        catch_up: float = self.spacing.get((level, group), others)
        if key not in self.counted and others and not mates:
            frontier = self._frontier(level)
            if frontier is not None and frontier[0] > start:
                joined = frontier[0]
                catch_up = others if frontier[1] is None else min(others, frontier[1])
        horizon = joined if joined is not None else self.horizon.get((level, group))
        catching_up = horizon is not None and start < horizon
        split = catch_up if catching_up else others + weight
        inner = self._inner(key, account, mates, start, catching_up)
        part = mates + tenant_weight if inner is None else inner
        share = split * part / weight
        pay = cost + self.carried.pop(key, 0.0)  # a refund past its cost: the next job's
        if pay < (least := min(cost, MIN_COST_TURNS)):
            self.carried[key], pay = pay - least, least
        tag = start + flow_step(self.weights[level], tenant_weight, share, cost=pay)
        self.counted[key] = tenant_weight
        if account is not None:
            self.accounts[key] = account
            self.account_weights[(level, account)] = weight
        self.spacing[(level, group)] = split
        # what a joiner matches: the account's whole spacing, its flows placed denser than
        # its split (catching up inside it) counted (a tenant's own: its split)
        self.density[(level, group)] = split * part / (mates + tenant_weight)
        if account is not None:
            self.inner_spacing[key] = part
        if joined is not None:
            self.horizon[(level, group)] = joined
        elif horizon is not None and start >= horizon:
            del self.horizon[(level, group)]
        self.last[key] = max(tag, self.last.get(key, tag))
        return tag

    def _inner(
        self,
        key: tuple[PriorityLevel, str],
        account: str | None,
        mates: int,
        start: float,
        catching_up: bool,
    ) -> float | None:
        """The account split a tenant joining its account's flows with work is placed at
        until it reaches where their backlogs ended (``None``: its account's split with
        it). Not while its account catches up to the level: matching its mates' density
        as well would compound (each account joining denser than the last)."""
        if key not in self.counted and mates and not catching_up:
            # its mates' backlogs, read as the level's are: among the flows reaching
            # furthest (bounded work, no walk of the account's flows)
            found = self._frontier(key[0], account)
            if found is not None and found[0] > start:
                densest = mates if found[1] is None else min(mates, found[1])
                self.inner[key] = (found[0], densest)
        inner = self.inner.get(key)
        if inner is not None and start >= inner[0]:
            del self.inner[key]
            return None
        return None if inner is None else inner[1]

    def _retire(self) -> None:
        """Flows the virtual time has passed stop counting; an account's catch-up state
        goes with its last flow."""
        gone = [key for key, tag in self.last.items() if tag <= self.vt]
        groups = set()
        for key in gone:
            del self.last[key], self.counted[key]
            self.inner.pop(key, None)
            self.inner_spacing.pop(key, None)
            account = self.accounts.pop(key, None)
            groups.add((key[0], group_of(key[1], account)))
        for level, group in groups:
            if group.startswith(ACCOUNT_MARK) and group in self._groups(level):
                continue
            self.horizon.pop((level, group), None)
            self.spacing.pop((level, group), None)
            self.density.pop((level, group), None)
            if group.startswith(ACCOUNT_MARK):
                del self.account_weights[(level, group[len(ACCOUNT_MARK) :])]

    def _group_of(self, key: tuple[PriorityLevel, str]) -> str:
        return group_of(key[1], self.accounts.get(key))

    def _groups(
        self, level: PriorityLevel, but: tuple[PriorityLevel, str] | None = None
    ) -> dict[str, tuple[int, int]]:
        return level_groups(self.counted, self.accounts, self.account_weights, level, but)

    def reweight(
        self, tenant: str, tenant_weight: int
    ) -> dict[tuple[PriorityLevel, str], tuple[float, float]]:
        """``tenant``'s weight changed: each of its flows with work counts the new one at
        once (so its level's total does too), and places its next jobs by it. Its jobs
        waiting are placed again (:func:`replaced_tag`), and its last tag with them.
        The virtual time stays: the anchor, and what the head stands for once every job
        is placed again (:meth:`observe_head`), never a head part-way through.
        Returns, per flow whose weight changed, the (anchor, ratio) its waiting jobs'
        tags are placed again by."""
        moved = {}
        for key, counted in self.counted.items():
            if key[1] != tenant:
                continue
            last = self.last.get(key)
            if counted != tenant_weight and last is not None and last > self.vt:
                moved[key] = (self.vt, counted / tenant_weight)
                self.last[key] = replaced_tag(last, self.vt, counted / tenant_weight)
            self.counted[key] = tenant_weight
        return moved

    def recost(
        self, level: PriorityLevel, tenant: str, ratio: float, shift_turns: float
    ) -> Move | None:
        """The flow's first runs were measured: its waiting jobs, placed cold, are placed
        again at ``ratio`` (measured cost over what they paid) from the virtual time,
        ``shift_turns`` later (its overrun so far, or less), and its last tag with them,
        as :meth:`charge`, whichever way they move: a cheaper flood's backlog repaid only
        by its jobs' charges would be repaid once it drained, which a flood's never does
        (``None``: no work, the shift is charged as any settlement)."""
        key = (level, tenant)
        last = self.last.get(key)
        if last is None or last <= self.vt:
            return self.charge(level, tenant, shift_turns)
        shift = flow_step(
            self.weights[level], self.counted[key], self._share(key), cost=shift_turns
        )
        self.last[key] = replaced_tag(last, self.vt, ratio, shift)
        return self.vt, ratio, shift, last

    def _share(self, key: tuple[PriorityLevel, str]) -> float:
        """The share a charge of a flow with work moves it by: the spacing its jobs were
        placed at (a flow catching up beside others' backlogs is placed densely, and a
        turn of its own is that long, not the level's split now). A flow of an account
        the same one level up: its account's spacing in the level over its account's
        weight, times the account split its last job was placed at (a tenant catching up
        inside its account is placed densely too). Without them, its share now."""
        group = self._group_of(key)
        spacing = self.spacing.get((key[0], group))
        if spacing is not None and group == key[1]:
            return spacing
        account = self.accounts.get(key)
        part = self.inner_spacing.get(key)
        weight = self.account_weights.get((key[0], account)) if account else None
        if spacing is not None and part is not None and weight:
            return spacing * part / weight
        return flow_share(self._groups(key[0]), group)

    def _frontier(
        self, level: PriorityLevel, account: str | None = None
    ) -> tuple[float, float | None] | None:
        """The last tag of ``level``'s flow that reaches furthest, among the
        :data:`FRONTIER_SCAN` flows of every level that reach furthest (as the script
        reads them: by tag, then member, from the top), and the densest spacing of the
        level's flows among them (``None``: none kept): a backlog placed while fewer
        tenants had work is that dense, though its flow's last jobs may not be. With
        ``account``: of that account's flows of the level among them, and the densest
        account split they were placed with."""
        top = sorted(
            (
                (tag, flow_member(lvl.value, tenant), (lvl, tenant))
                for (lvl, tenant), tag in self.last.items()
            ),
            reverse=True,
        )[:FRONTIER_SCAN]
        mine = [
            (tag, key)
            for tag, _, key in top
            if key[0] == level and (account is None or self.accounts.get(key) == account)
        ]
        if not mine:
            return None
        if account is not None:
            parts = [self.inner_spacing[key] for _, key in mine if key in self.inner_spacing]
            return mine[0][0], min(parts) if parts else None
        found = ((key[0], self._group_of(key)) for _, key in mine)
        spaced = [self.density[group] for group in found if group in self.density]
        return mine[0][0], min(spaced) if spaced else None

    def charge(self, level: PriorityLevel, tenant: str, turns: float) -> Move | None:
        """The flow's attempts used ``turns`` more (less, if negative) than they paid when
        placed: paid at once, its waiting jobs and last tag moved that much later (a
        refund: its last tag earlier; its waiting jobs moved earlier at every page's
        jitter would put equal flows out of step): (anchor, 1, shift in tags, up to) for
        :func:`replaced_tag`. ``None``: no work left, it is carried
        to its next job, which pays it with its own turn (a flow that keeps emptying too;
        docs/design.md, "Service is worker time")."""
        key = (level, tenant)
        if self.last.get(key, self.vt) <= self.vt or not turns:
            self.carried[key] = self.carried.get(key, 0.0) + turns
            return None
        shift = flow_step(self.weights[level], self.counted[key], self._share(key), cost=turns)
        upto = self.last[key]
        if turns < 0:
            self.last[key] += shift  # a refund: its next jobs only
            return None
        self.last[key] = replaced_tag(upto, self.vt, 1.0, shift)
        return self.vt, 1.0, shift, upto
