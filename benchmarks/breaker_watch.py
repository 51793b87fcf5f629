"""The ``--breaker`` switch of ``bench_fairness.py`` and ``bench_attempts.py``: the loop
runs with the breaker on (``FAIRQUEUE['BREAKER'] = {"ENABLED": True}``, its other
settings at their defaults, through ``benchmarks/live_settings.py``'s
``FQBENCH_BREAKER``), and each run with the loop counts the breakers that opened (their
``HoldAudit`` rows, event ``opened``). Their failing tenants succeed eventually, so every
opening is a false one (docs/usage.md, "The breaker")."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

ENV = "FQBENCH_BREAKER"


def _clear() -> None:
    from fairqueue.models import HoldAudit, TenantHold

    TenantHold.objects.all().delete()
    HoldAudit.objects.all().delete()


def _openings() -> list[str]:
    from fairqueue.models import HoldAudit

    rows = HoldAudit.objects.filter(reason="breaker", event="opened").order_by("id")
    return [f"{row.tenant_id}: {row.why}" for row in rows]


class BreakerCount:
    """Breaker openings per run (nothing when the switch is off)."""

    def __init__(self, enabled: bool, db: ThreadPoolExecutor) -> None:
        self.enabled = enabled
        self.db = db
        self.runs: dict[str, list[str]] = {}
        if enabled:
            os.environ[ENV] = json.dumps({"ENABLED": True})
        else:
            os.environ.pop(ENV, None)

    def before_run(self) -> None:
        """Forget the holds of the run before (a tenant held there would be held here:
        the loop rebuilds Redis's holds from the database)."""
        if self.enabled:
            self.db.submit(_clear).result()

    def after_run(self, label: str) -> int:
        """Count the run's openings (the loop has stopped)."""
        if not self.enabled:
            return 0
        self.runs[label] = self.db.submit(_openings).result()
        return len(self.runs[label])

    def report(self) -> int:
        """Print the count (and each opening's audit text); returns it."""
        if not self.enabled:
            return 0
        total = sum(len(found) for found in self.runs.values())
        print(f"\nbreaker openings: {total} (in {len(self.runs)} runs with the loop, breaker on)")
        for label, found in self.runs.items():
            for why in found:
                print(f"  {label}: {why}")
        return total
