"""Django settings for ``benchmarks/bench_fairness.py`` and the ``rebalance_fair`` loop it
starts: the test settings with one job type, ``bench``, and a SQLite database.

The BullMQ prefix, wait bound and pass interval come from the environment
(``FAIRQUEUE_PREFIX``, ``QUEUE_FAIR_MAX_WAIT_MS``, ``QUEUE_FAIR_REBALANCE_INTERVAL_MS``),
which the benchmark sets alike for its producer and for the loop.
"""

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
}
# The test settings' @task backend maps its queues onto the test job types; here the
# only job type is `bench` (manage.py check, which rebalance_fair runs, requires it).
TASKS = {
    "default": {
        "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
        "OPTIONS": {"JOB_TYPES": {"default": "bench"}},
    }
}
