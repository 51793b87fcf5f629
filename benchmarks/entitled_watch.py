"""The console's "entitled now", watched live: a :class:`~benchmarks.noisy_watch.NoisyWatch`
that also reads, once a second, what each flow of the run is entitled to now in its level
(``fairqueue.scheduling.pace.share_of``, the tenant and account pages' figure) from one
read-only estimate read, twice from the same read: with the flows' accounts (the
hierarchical rule) and with them left out (the flat rule, as before accounts were seen),
so the two are compared side by side on one machine state. ``bench_accounts.py`` prints
their medians beside the shares the flows were served."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping

from benchmarks.noisy_watch import EVERY_S, NoisyWatch


class EntitledWatch(NoisyWatch):
    """:class:`NoisyWatch`, plus per sample each of ``tenants``' entitlement now in
    ``level`` with accounts (``accounts``: tenant -> (account, weight)) and without."""

    tenants: tuple[str, ...] = ()
    accounts: Mapping[str, tuple[str, float]] = {}
    level = "normal"

    def __init__(self, job_type: str, t0_ms: float) -> None:
        super().__init__(job_type, t0_ms)
        self.samples_by_rule: dict[str, list[dict[str, float]]] = {"accounts": [], "flat": []}

    def run(self) -> None:
        from fairqueue.broker import get_sync_broker
        from fairqueue.conf import get_settings
        from fairqueue.dashboard.overview import noisy_figures
        from fairqueue.scheduling import estimate as eta
        from fairqueue.scheduling import pace
        from fairqueue.scheduling.levels import PriorityLevel
        from fairqueue.scheduling.shares import BUCKET_S

        broker = get_sync_broker()
        queue = get_settings().queue_for(self.job_type)
        while not self._stop_event.wait(EVERY_S):
            try:
                found = noisy_figures(self.job_type, broker=broker)
            except Exception:  # a read that failed is a sample missed
                found = {"tenants": []}
            self.samples += 1
            at_s = (time.time() * 1000 - self.t0_ms) / 1000
            for row in found["tenants"]:
                tenant = row["tenant"] if row["tenant"] is not None else "default"
                self.first.setdefault(f"{row['level']}/{tenant}", round(at_s, 1))
            for row in found.get("accounts", []):
                self.first.setdefault(f"{row['level']}/account {row['account']}", round(at_s, 1))
            try:
                raw = broker.run(
                    broker.broker.status.estimate,
                    queue,
                    level=PriorityLevel(self.level),
                    tenant=self.tenants[0],
                    tenant_weight=1,
                )
            except Exception:  # a read that failed is a sample missed
                continue
            rate = eta.service_rate(
                raw.history.buckets,
                now_ms=raw.now_ms,
                since_ms=raw.history.since_ms,
                bucket_s=BUCKET_S,
                typical_ms=raw.placement.typical_ms or raw.history.typical_ms,
                by_time=get_settings().fairness_by == "time",
            )
            if raw.asking is None or not rate.known or rate.window_s <= 0:
                continue
            flows = pace.flows_asking(
                raw.asking,
                vt=raw.placement.flow.vt,
                window_s=rate.window_s,
                level_served=rate.level_starts,
                accounts=self.accounts,
            )
            flat = [dataclasses.replace(f, account=None, account_weight=1.0) for f in flows]
            for rule, known in (("accounts", flows), ("flat", flat)):
                got: dict[str, float] = {}
                for tenant in self.tenants:
                    account = self.accounts.get(tenant) if rule == "accounts" else None
                    share = pace.share_of(
                        rate.jobs_per_s, known, self.level, tenant, of_level=True, account=account
                    )
                    if share is not None:
                        got[tenant] = share
                self.samples_by_rule[rule].append(got)

    def medians(self, rule: str, skip_s: float = 0.0) -> dict[str, float]:
        """Each tenant's median entitlement under ``rule`` over the samples after the
        first ``skip_s`` seconds."""
        rows = self.samples_by_rule[rule][int(skip_s / EVERY_S) :]
        return {
            t: statistics.median(r[t] for r in rows if t in r)
            for t in self.tenants
            if any(t in r for r in rows)
        }
