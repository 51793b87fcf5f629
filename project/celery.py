"""Celery app of the demo project, with a beat schedule for the rebalance pass.

Teams that run Celery beat can use it instead of ``manage.py rebalance_fair``:

    celery -A project worker -B
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["fairqueue.contrib"], related_name="celery")


def _interval_s() -> float:
    """QUEUE_FAIR_REBALANCE_INTERVAL_MS, read the way fairqueue reads it."""
    import django

    django.setup()
    from fairqueue.conf import get_settings

    return get_settings().rebalance_interval_ms / 1000


@app.on_after_configure.connect
def _schedule_rebalance(sender: Celery, **kwargs: object) -> None:
    sender.add_periodic_task(
        _interval_s(), app.signature("fairqueue.rebalance_fair"), name="fairqueue rebalance"
    )
