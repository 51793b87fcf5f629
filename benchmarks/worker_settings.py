"""Django settings of the Python worker in the benchmarks (``bench_worker.py``,
``bench_fairness.py --worker python``): ``benchmarks/live_settings.py`` with the
benchmark handlers' app and their job types."""

from benchmarks.live_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.worker_app"]  # noqa: F405
FAIRQUEUE = {  # noqa: F405
    **FAIRQUEUE,  # noqa: F405
    "QUEUES": {"bench": "bench", "wcpu": "wcpu", "wnoop": "wnoop", "wnoopsync": "wnoopsync"},
}
