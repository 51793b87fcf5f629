"""Django settings for ``benchmarks/bench_fairness.py`` and the ``rebalance_fair`` loop it
starts: the test settings with one job type, ``bench``, and a SQLite database.

The BullMQ prefix, wait bound and pass interval come from the environment
(``FAIRQUEUE_PREFIX``, ``QUEUE_FAIR_MAX_WAIT_MS``, ``QUEUE_FAIR_REBALANCE_INTERVAL_MS``),
which the benchmark sets alike for its producer and for the loop. So do the usage
settings (``benchmarks/bench_ledger.py``; ``FQBENCH_BREAKER`` also for the breaker's check
in ``bench_fairness.py`` and ``bench_attempts.py``): ``FQBENCH_LEDGER=0`` turns the usage
ledger off, ``FQBENCH_QUOTAS`` and ``FQBENCH_BREAKER`` are JSON for ``QUOTAS`` and
``BREAKER``, and ``FQBENCH_CACHE_URL`` makes the Django cache a shared ``django_redis``
one (as the demo project's), which a demotion's end of caching reaches in every process.
"""

import json
import os

from tests.settings import *  # noqa: F403

# FQBENCH_DB: the file the benchmark migrated, shared with the loop it starts (whose
# passes read tenants' limits and pauses from the database); in memory otherwise.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("FQBENCH_DB", ":memory:"),
    }
}
# benchmarks/bench_attempts.py's "fairqueue-jobs" run sets FQBENCH_FAIRNESS_BY=jobs.
FAIRQUEUE = {
    "QUEUES": {"bench": "bench"},
    "FAIRNESS_BY": os.environ.get("FQBENCH_FAIRNESS_BY", "time"),
    "USAGE_LEDGER": os.environ.get("FQBENCH_LEDGER", "1") != "0",
    "QUOTAS": json.loads(os.environ.get("FQBENCH_QUOTAS") or "{}"),
    "BREAKER": json.loads(os.environ.get("FQBENCH_BREAKER") or "{}"),
}
if os.environ.get("FQBENCH_CACHE_URL"):
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": os.environ["FQBENCH_CACHE_URL"],
        }
    }
# The test settings' @task backend maps its queues onto the test job types; here the
# only job type is `bench` (manage.py check, which rebalance_fair runs, requires it).
TASKS = {
    "default": {
        "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
        "OPTIONS": {"JOB_TYPES": {"default": "bench"}},
    }
}
