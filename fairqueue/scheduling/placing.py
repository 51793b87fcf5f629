"""Where the add script places a new job, as ``lua/include/eta_place.lua`` reads it
without writing: the same arithmetic in Python, so the tests hold the read-only Lua, this
model and the add script to one tag (docs/design.md, "The rule", "Joining a level",
"Accounts"). Plain data in, plain data out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fairqueue.scheduling.levels import DEFAULT_FAIR_WEIGHTS, PriorityLevel
from fairqueue.scheduling.order import flow_step


@dataclass(frozen=True, slots=True)
class FlowSnapshot:
    """What the fair clock knows of a flow when a job of it is placed, as
    ``lua/include/eta_place.lua`` reads it: the virtual time, the flow's last tag, the weight
    its level counts for it, its catch-up horizon, its level's total (less the flows the
    virtual time has passed), the level's frontier (for a joining flow) and a job's cost
    in turns; the share the flow's last job was placed with (its spacing) and the
    frontier flow's (a joining flow catches up at it).

    A flow of an account (``account``; a flow with work keeps the one it counts under)
    is placed by the hierarchical rule: its account's state in the level (its flows'
    tenant weights ``account_tenants``, the weight the level counts for it
    ``account_counted``, the level split its last job was placed with and its catch-up
    horizon), the flow's own catch-up inside the account (``inner``: horizon, split) and
    the frontier of the account's flows with work (``inner_frontier``, their densest
    split)."""

    level: PriorityLevel
    tenant_weight: int
    vt: float
    last: float | None = None
    counted: int = 0
    horizon: float | None = None
    total: int = 0
    frontier: float | None = None
    cost: float = 1.0
    spacing: float | None = None
    frontier_spacing: float | None = None
    account: str | None = None
    account_weight: int = 1
    account_tenants: float = 0
    account_counted: float = 1
    account_spacing: float | None = None
    account_horizon: float | None = None
    inner: tuple[float, float] | None = None
    inner_frontier: float | None = None
    inner_densest: float | None = None


def place(
    flow: FlowSnapshot, count: int = 1, weights: Mapping[PriorityLevel, int] = DEFAULT_FAIR_WEIGHTS
) -> float:
    """The finish tag the add script gives the ``count``-th of ``count`` new jobs of the
    flow (``fqPlace``, one after the other; docs/design.md, "Joining a level")."""
    if count < 1:
        raise ValueError(f"count={count!r} is not allowed: expected a whole number >= 1")
    if flow.account is not None:
        return _place_in_account(flow, count, weights)
    last, counted, horizon, total = flow.last, flow.counted, flow.horizon, flow.total
    weight, tag, spacing = flow.tenant_weight, flow.vt, flow.spacing
    for index in range(count):
        others = total - counted
        everyone = others + weight
        start = flow.vt if last is None or last <= flow.vt else last
        joined = None
        catch_up = spacing if spacing is not None else others
        if counted == 0 and others > 0 and index == 0:
            if flow.frontier is not None and flow.frontier > start:
                joined = horizon = flow.frontier
                spaced = flow.frontier_spacing
                catch_up = others if spaced is None else min(others, spaced)
        share = catch_up if horizon is not None and start < horizon else everyone
        tag = start + flow_step(weights[flow.level], weight, share, cost=flow.cost)
        spacing = share
        total, counted = everyone, weight
        if joined is None and horizon is not None and start >= horizon:
            horizon = None
        if last is None or tag > last:
            last = tag
    return tag


def _place_in_account(
    flow: FlowSnapshot, count: int, weights: Mapping[PriorityLevel, int]
) -> float:
    """:func:`place` for a flow of an account (``fqPlaceInAccount``): the level's
    accounts share it by account weight, the account's tenants its part by tenant weight;
    an account joining the level's backlogs, or a tenant joining its account's, is placed
    at their spacing until it reaches where they end."""
    last, counted, weight = flow.last, flow.counted, flow.tenant_weight
    total: float = flow.total
    tenants, counted_weight = flow.account_tenants, flow.account_counted
    spacing, horizon, inner = flow.account_spacing, flow.account_horizon, flow.inner
    account_weight, tag = flow.account_weight, flow.vt
    for _ in range(count):
        start = flow.vt if last is None or last <= flow.vt else last
        mates = max(0.0, tenants - counted)
        others = total - (counted_weight if tenants > 0 else 0)
        joined = None
        catch_up = spacing if spacing is not None else others
        frontier = flow.frontier
        if counted == 0 and others > 0 and mates == 0 and frontier is not None:
            if frontier > start:
                joined = horizon = frontier
                spaced = flow.frontier_spacing
                catch_up = others if spaced is None or spaced >= others else spaced
        catching = horizon is not None and start < horizon
        split = catch_up if catching else others + account_weight
        entered = False
        if counted == 0 and mates > 0 and not catching and flow.inner_frontier is not None:
            if flow.inner_frontier > start:
                densest = flow.inner_densest
                if densest is None or densest > mates:
                    densest = mates
                inner, entered = (flow.inner_frontier, densest), True
        part = mates + weight
        inner_done = inner is not None and start >= inner[0]
        if inner is not None and not inner_done:
            part = inner[1]
        share = split * part / account_weight
        tag = start + flow_step(weights[flow.level], weight, share, cost=flow.cost)
        total = others + account_weight
        if joined is None and horizon is not None and start >= horizon:
            horizon = None
        tenants, counted_weight, spacing = mates + weight, account_weight, split
        if inner_done and not entered:
            inner = None
        counted = weight
        if last is None or tag > last:
            last = tag
    return tag
