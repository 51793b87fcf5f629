import importlib.util

from django.apps import AppConfig


class FairqueueConfig(AppConfig):
    name = "fairqueue"
    verbose_name = "Fair queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registration only: no I/O, no settings read at start-up.
        from fairqueue import checks, signals  # noqa: F401
        from fairqueue.redis_metrics import register_redis_collector

        # Read from Redis only when /metrics is scraped (whichever view serves it).
        register_redis_collector()
        # Django 6.0 registers its task backends' checks (fairqueue.E010, W025 among them)
        # only when django.tasks is imported, which `manage.py check` itself never does:
        # importing it here makes `check` report them as run_checks() does. Import only.
        if importlib.util.find_spec("django.tasks") is not None:
            importlib.import_module("django.tasks")
