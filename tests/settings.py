"""Test settings: the demo project's, with an isolated cache and test-only queues."""

from project.settings import *  # noqa: F403

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
FAIRQUEUE = {
    "QUEUES": {"email": "email", "report": "report", "cleanup": "cleanup"},
}
LOGGING = {"version": 1, "disable_existing_loggers": False}

# A private test database name, so runs on a shared PostgreSQL do not collide
# (pytest-django creates and drops ``test_<name>`` otherwise).
if _test_db_name := os.environ.get("FAIRQUEUE_TEST_DB_NAME"):  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": _test_db_name}  # noqa: F405

# Django tasks (@task) run through fairqueue: django-tasks' default queue is the
# `email` job type; `report` is a task queue of its own (tests/test_tasks_backend.py).
INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks"]  # noqa: F405
TASKS = {
    "default": {
        "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
        "QUEUES": ["default", "report"],
        "OPTIONS": {"JOB_TYPES": {"default": "email"}},
    }
}
