"""Tasks of both frameworks side by side, for tests/redis/test_django6.py's run on Django 6 with
the backport importable too (a subprocess: the Django 6.1 suite itself has no backport).
Not a test module: importing it needs both ``django.tasks`` and ``django_tasks``."""

from django.tasks import task
from django_tasks.base import Task as BackportTask


@task()
def django_add(a: int, b: int) -> int:
    return a + b


def backport_add(a: int, b: int) -> int:
    return a + b


# A Task of the backport's own class (its @task would build the backend's task class,
# Django's): what a project that still imports django_tasks.base.Task hands the backend.
backport_add = BackportTask(func=backport_add)
