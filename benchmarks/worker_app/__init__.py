"""The job handlers of the worker benchmarks (``bench_worker.py``, and
``bench_fairness.py --worker python``), installed by ``benchmarks/worker_settings.py``."""
