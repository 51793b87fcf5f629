"""The noisy-neighbour rule, watched live: a thread samples what the console and the
``queue_fair_noisy_tenants`` gauge report (``fairqueue.dashboard.overview.noisy_figures``,
the rule of ``fairqueue.scheduling.noisy``) once a second during a run, and keeps when
each flow was first flagged. ``bench_attempts.py`` checks it: a flow holding the workers
(more than 1.5x its share of its level's worker time) is flagged within 10 s, and a flow
within its share never is."""

from __future__ import annotations

import threading
import time

#: How often the rule is read (s).
EVERY_S = 1.0


class NoisyWatch(threading.Thread):
    """From start to :meth:`stop`: when each ``level/tenant`` was first flagged, in s
    from ``t0_ms`` (this machine's clock, as the producer's)."""

    def __init__(self, job_type: str, t0_ms: float) -> None:
        super().__init__(name="noisy-watch", daemon=True)
        self.job_type, self.t0_ms = job_type, t0_ms
        self.first: dict[str, float] = {}
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        from fairqueue.broker import get_sync_broker
        from fairqueue.dashboard.overview import noisy_figures

        broker = get_sync_broker()
        while not self._stop_event.wait(EVERY_S):
            try:
                found = noisy_figures(self.job_type, broker=broker)
            except Exception:  # a read that failed is a sample missed, not a run lost
                continue
            self.samples += 1
            at_s = (time.time() * 1000 - self.t0_ms) / 1000
            for row in found["tenants"]:
                tenant = row["tenant"] if row["tenant"] is not None else "default"
                self.first.setdefault(f"{row['level']}/{tenant}", round(at_s, 1))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)
