"""``manage.py fairqueue_demo``: show what the fair policy does to a starving backlog."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.core.management.base import BaseCommand

from fairqueue.conf import get_settings
from fairqueue.levels import PriorityLevel
from fairqueue.scheduler import PendingJob, order_by_occupancy, order_pending_jobs


class Command(BaseCommand):
    help = "Demonstrate fairqueue's ordering on a flooded backlog (8,000 critical, 200 low)."

    def handle(self, *args: Any, **options: Any) -> None:
        settings = get_settings()
        now = 10**12
        jobs = [
            PendingJob(str(i), PriorityLevel.CRITICAL, f"tenant-{i % 7}", now - 60_000 + i)
            for i in range(8000)
        ] + [
            PendingJob(str(8000 + i), PriorityLevel.LOW, "tenant-low", now - 60_000 + i)
            for i in range(200)
        ]
        levels = {job.job_id: job.priority_level for job in jobs}
        self.stdout.write("Backlog: 8,000 critical + 200 low jobs waiting.\n")
        for name, policy in (
            ("plain BullMQ priorities", None),
            ("seed-1 occupancy ratio", order_by_occupancy),
            ("fairqueue", order_pending_jobs),
        ):
            if policy is None:
                order = [job.job_id for job in jobs]  # strict ladder: every critical job first
            else:
                result = policy(jobs, now_ms=now, max_wait_ms=settings.max_wait_ms)
                order = [item.job_id for item in result]
            head = Counter(levels[job_id].value for job_id in order[:1000])
            first_low = next(i for i, j in enumerate(order, 1) if levels[j] is PriorityLevel.LOW)
            self.stdout.write(
                f"  {name:<24} first 1,000 jobs: {head.get('critical', 0):>4} critical, "
                f"{head.get('low', 0):>3} low; first low job at position {first_low}"
            )
