"""Accounts, live: one customer's many tenants beside another customer's one, with stock
Node BullMQ workers (``benchmarks/live_worker.mjs``), the real ``rebalance_fair`` loop
and open-loop producers enqueueing through ``enqueue_jobs`` with the database lookups
wired (each tenant's account resolved from its ``TenantPlan``), as
``bench_attempts.py`` runs them (its producer, worker and window).

Scenarios, all at the ``normal`` level, rates in units of the worker's capacity C:

* ``ten-vs-one``   - account A's 10 tenants at 0.3 C each beside account B's one tenant
  at 1.2 C (equal account weights): 50/50 between the accounts, A's ten equal inside.
* ``weights-2-1``  - the same with A's weight 2: 67/33.
* ``returning``    - the same, B idle from 0.5 s until ``--return-s``: B's share of the
  level in each second after it returns (its first: 50%).
* ``retry-storm``  - A's ten at 0.3 C each, one of them failing every job 4 times (5
  attempts each), beside B at 1.2 C: B keeps half of the attempts.
* ``flat``         - ``ten-vs-one`` with the eleven tenants in no account: what the
  accounts change (the ten take 10/11).

Fairness counts jobs (``FAIRNESS_BY="jobs"``): the jobs are equal, and the attempts are
what is judged. The window is [start + ``--warmup-s``, end of arrivals] (the returning
tenant's: from its return). Exit status 1 if a criterion misses (±5% points, as
docs/design.md's accounts promise): ``--quick`` runs shorter, on a shared machine a miss
there is the machine's.

``--entitled`` also samples, once a second, the console's entitlement now of B's tenant
and A's first (``benchmarks/entitled_watch.py``), by account and by the flat rule from
the same read, and prints their medians beside the shares served.

    python benchmarks/bench_accounts.py [--quick] [--scenario ten-vs-one ...] [--seconds 16]
        [--by-time] [--entitled]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import bench_attempts  # noqa: E402
from benchmarks.bench_attempts import Flow, Result, Scenario, run_one  # noqa: E402
from benchmarks.bench_fairness import calibrate, setup_django  # noqa: E402
from benchmarks.breaker_watch import BreakerCount  # noqa: E402
from benchmarks.entitled_watch import EntitledWatch  # noqa: E402

#: The tenants of account A and account B's one (the flat run's take "f-" before them).
A_TENANTS = tuple(f"a{i}" for i in range(10))
B_TENANT = "b0"
TOLERANCE = 0.05


def build(capacity: float, return_s: float) -> dict[str, tuple[Scenario, int]]:
    """Each scenario and account A's weight (B's is 1)."""
    c = capacity

    def flows(prefix: str = "", failing: bool = False, back: bool = False) -> tuple[Flow, ...]:
        ten = tuple(
            Flow("normal", prefix + t, 0.3 * c, fail_times=4 if failing and i == 0 else 0)
            for i, t in enumerate(A_TENANTS)
        )
        periods = ((0.0, 0.5), (return_s, None)) if back else ((0.0, None),)
        return (*ten, Flow("normal", prefix + B_TENANT, 1.2 * c, periods=periods))

    returning = f"normal/{B_TENANT}"
    return {
        "ten-vs-one": (Scenario("ten-vs-one", flows(), "attempts"), 1),
        "weights-2-1": (Scenario("weights-2-1", flows(), "attempts"), 2),
        "returning": (
            Scenario("returning", flows(back=True), "attempts", returning=returning),
            1,
        ),
        "retry-storm": (
            Scenario("retry-storm", flows(failing=True), "attempts", attempts=5),
            1,
        ),
        "flat": (Scenario("flat", flows("f-"), "attempts"), 1),
    }


def setup_accounts(db: ThreadPoolExecutor) -> None:
    """Account A over the ten, account B over its one; the lookups wired."""

    def run() -> None:
        from fairqueue.enqueue.priority import wire_tenant_plan_lookup
        from fairqueue.models import Account, TenantPlan

        a, _ = Account.objects.get_or_create(account_id="A")
        b, _ = Account.objects.get_or_create(account_id="B")
        for tenant in A_TENANTS:
            TenantPlan.objects.update_or_create(tenant_id=tenant, defaults={"account": a})
        TenantPlan.objects.update_or_create(tenant_id=B_TENANT, defaults={"account": b})
        wire_tenant_plan_lookup()

    db.submit(run).result()


def set_weight(db: ThreadPoolExecutor, weight: int) -> None:
    def run() -> None:
        from fairqueue.models import Account

        account = Account.objects.get(account_id="A")
        account.weight = weight
        account.save()  # its tenants' cached lookups are forgotten

    db.submit(run).result()


def judge(name: str, weight: int, result: Result) -> list[tuple[str, str, str, bool]]:
    """(what, value, target, met) of one run."""
    keys = [f.key for f in result.scenario.flows]
    ten = keys[:-1]
    total = sum(result.attempts.get(k, 0) for k in keys)
    if not total:
        return [("attempts in the window", "0", "> 0", False)]
    share_a = sum(result.attempts.get(k, 0) for k in ten) / total
    rows = []
    if name == "flat":
        return [("the ten's share (no accounts)", f"{share_a:.1%}", "10/11: 90.9%", True)]
    if name == "returning":
        first = result.returning_shares[0] if result.returning_shares else 0.0
        seconds = " ".join(f"{v:.0%}" for v in result.returning_shares[:6])
        rows.append(("B's share, 1st s back", f"{first:.1%}", ">= 45%", first >= 0.45))
        rows.append(("B's share, each second", seconds, "~50%", True))
        return rows
    expected = weight / (weight + 1)
    rows.append(
        (
            "A's share",
            f"{share_a:.1%}",
            f"{expected:.0%} ±5",
            abs(share_a - expected) <= TOLERANCE,
        )
    )
    inside = [result.attempts.get(k, 0) for k in ten]
    mean = sum(inside) / len(inside)
    spread = max(abs(n / mean - 1) for n in inside) if mean else 1.0
    if name == "retry-storm":  # the failing tenant asks more than its share of A's
        calm = inside[1:]
        calm_mean = sum(calm) / len(calm)
        spread = max(abs(n / calm_mean - 1) for n in calm) if calm_mean else 1.0
        rows.append(("A's calm nine, worst from equal", f"{spread:.1%}", "<= 5%", spread <= 0.05))
        failing = inside[0] / calm_mean if calm_mean else 0.0
        rows.append(("A's failing one / a calm one", f"{failing:.2f}", "<= 1.05", failing <= 1.05))
    else:
        rows.append(("A's ten, worst from equal", f"{spread:.1%}", "<= 5%", spread <= 0.05))
    return rows


def watch_entitled(scenario: Scenario, weight: int) -> list[EntitledWatch]:
    """Make the next run's noisy watch an :class:`EntitledWatch` of B's tenant and A's
    first (their accounts as :func:`setup_accounts` made them); the list gets it."""
    made: list[EntitledWatch] = []
    tenants = tuple(f.key.split("/")[1] for f in scenario.flows)
    owners = {t: ("A", float(weight)) for t in A_TENANTS} | {B_TENANT: ("B", 1.0)}

    class Watch(EntitledWatch):
        def __init__(self, job_type: str, t0_ms: float) -> None:
            super().__init__(job_type, t0_ms)
            self.tenants = (tenants[-1], tenants[0])
            self.accounts = {t: owners[t] for t in tenants if t in owners}
            made.append(self)

    bench_attempts.NoisyWatch = Watch  # type: ignore[misc]  # run_one's watch
    return made


def entitled_vs_served(name: str, watch: EntitledWatch, result: Result, skip_s: float) -> list[str]:
    """Table rows: each watched tenant's share of the attempts served in the window beside
    its median entitlement now, by account and flat."""
    by_account, flat = watch.medians("accounts", skip_s), watch.medians("flat", skip_s)
    total = sum(result.attempts.values())
    rows = []
    for tenant in watch.tenants:
        served = result.attempts.get(f"normal/{tenant}", 0) / total if total else 0.0
        new, old = by_account.get(tenant), flat.get(tenant)
        rows.append(
            f"| {name} | {tenant} | {served:.1%} | "
            f"{'—' if new is None else f'{new:.1%}'} | {'—' if old is None else f'{old:.1%}'} |"
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=16.0, help="arrivals per run (s)")
    parser.add_argument("--run-ms", type=float, default=10.0, help="the base job run time")
    parser.add_argument("--concurrency", type=int, default=4, help="the Node worker's")
    parser.add_argument("--interval-ms", type=int, default=250, help="rebalance interval")
    parser.add_argument("--bound-ms", type=int, default=3000, help="QUEUE_FAIR_MAX_WAIT_MS")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="left out of the window")
    parser.add_argument("--return-s", type=float, default=8.0, help="when B returns")
    parser.add_argument("--scenario", action="append", help="run only these (repeatable)")
    parser.add_argument("--by-time", action="store_true", help='FAIRNESS_BY="time"')
    parser.add_argument("--quick", action="store_true", help="10 s runs, 2 s warm-up, back at 6")
    parser.add_argument(
        "--entitled",
        action="store_true",
        help="also sample the console's entitlement now, by account and flat, each second",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup_s, args.return_s = 10.0, 2.0, 6.0
    if args.seconds <= max(args.warmup_s, args.return_s) + 2:
        parser.error("--seconds must be 2 more than --warmup-s and --return-s")
    names = args.scenario or list(build(1.0, args.return_s))
    unknown = sorted(set(names) - set(build(1.0, args.return_s)))
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}: expected {list(build(1.0, 1.0))}")
    db = setup_django()
    args.breakers = BreakerCount(False, db)
    setup_accounts(db)
    capacity, alone, _ = calibrate(args, db)
    print(f"capacity: {capacity:.0f} jobs/s at {args.run_ms:g} ms (alone {alone:.0f})")
    scenarios = build(capacity, args.return_s)
    rows = []
    entitled_rows: list[str] = []
    for name in names:
        scenario, weight = scenarios[name]
        set_weight(db, weight)
        print(f"running {name} (A's weight {weight}) ...", flush=True)
        # counting jobs (FAIRNESS_BY="jobs"): on a shared machine the workers' measured
        # times wander, and fairness by time would follow them away from equal attempts
        scheduler = "fairqueue" if args.by_time else "fairqueue-jobs"
        watches: list[EntitledWatch] = []
        if args.entitled:
            watches = watch_entitled(scenario, weight)
        result = run_one(scheduler, scenario, args.bound_ms, args, db)
        shares = {f.key.split("/")[1]: result.attempts.get(f.key, 0) for f in scenario.flows}
        print(f"  attempts in {result.window_s:.1f} s: {shares}")
        if watches:
            entitled_rows += entitled_vs_served(name, watches[0], result, args.warmup_s)
            print(f"  flagged noisy (first, s): {result.noisy or 'nothing'}")
        rows += [(name, *row) for row in judge(name, weight, result)]
    print("\nAccounts, live (stock Node workers, the loop): attempts started in the window")
    print("| run | what | value | target | met |")
    print("|---|---|---|---|---|")
    for name, what, value, target, ok in rows:
        print(f"| {name} | {what} | {value} | {target} | {'yes' if ok else 'NO'} |")
    if entitled_rows:
        print("\nEntitled now (median of 1 s samples after the warm-up) beside the share served")
        print("| run | tenant | served | entitled, by account | entitled, flat |")
        print("|---|---|---|---|---|")
        print("\n".join(entitled_rows))
    failed = sum(1 for row in rows if not row[-1])
    print(f"{len(rows) - failed} of {len(rows)} account criteria met")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
