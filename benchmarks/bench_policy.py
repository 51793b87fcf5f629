"""How fast is the pure policy, and how do fairqueue's and the occupancy policy differ?

Prints, for 1k/10k/100k random waiting jobs, the time of ``order_pending_jobs`` and of
the literal ``order_by_occupancy`` side by side (ratio = fairqueue / occupancy), and
for the flood scenario (8,000 critical + 200 low) where each puts the first low job.

    python benchmarks/bench_policy.py [--sizes 1000 10000 100000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairqueue.scheduling.levels import PriorityLevel  # noqa: E402
from fairqueue.scheduling.order import PendingJob, order_by_occupancy, order_pending_jobs  # noqa: E402

NOW = 10**12
BOUND = 300_000


def random_jobs(n: int, seed: int = 1) -> list[PendingJob]:
    rnd = random.Random(seed)
    levels = list(PriorityLevel)
    return [
        PendingJob(
            str(i),
            rnd.choice(levels),
            f"tenant-{rnd.randrange(200)}",
            NOW - rnd.randrange(2 * BOUND),
        )
        for i in range(n)
    ]


def best_of(fn, jobs, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(jobs, now_ms=NOW, max_wait_ms=BOUND)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    args = parser.parse_args()
    print("Policy speed (median wall time)")
    print(f"{'jobs':>8} | {'order_pending_jobs':>18} | {'order_by_occupancy':>18} | {'ratio':>6}")
    print("-" * 60)
    for n in args.sizes:
        jobs = random_jobs(n)
        repeat = 5 if n < 100_000 else 3
        fair = best_of(order_pending_jobs, jobs, repeat)
        occ = best_of(order_by_occupancy, jobs, repeat)
        print(f"{n:>8} | {fair * 1000:>15.1f} ms | {occ * 1000:>15.1f} ms | {fair / occ:>6.2f}")

    print()
    print("Flood: 8,000 critical + 200 low waiting (no job overdue)")
    jobs = [PendingJob(str(i), PriorityLevel.CRITICAL, "t", NOW - 1000 + i) for i in range(8000)]
    jobs += [PendingJob(str(8000 + i), PriorityLevel.LOW, "t", NOW - 1000 + i) for i in range(200)]
    low_ids = {job.job_id for job in jobs if job.priority_level is PriorityLevel.LOW}
    print(f"{'policy':>20} | {'first low at':>12} | {'low in first 1,000':>18}")
    print("-" * 58)
    for name, fn in (("fairqueue", order_pending_jobs), ("occupancy", order_by_occupancy)):
        order = [item.job_id for item in fn(jobs, now_ms=NOW, max_wait_ms=BOUND)]
        first = next(i for i, job_id in enumerate(order, 1) if job_id in low_ids)
        head = sum(job_id in low_ids for job_id in order[:1000])
        print(f"{name:>20} | {first:>12} | {head:>18}")


if __name__ == "__main__":
    main()
