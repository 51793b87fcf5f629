"""The test suite's own settings (the benchmarks use them too).

A project of its own rather than the demo's settings: the apps the admin and dashboard
tests need, fairqueue, django_tasks for the tasks backend, and the demo project's app,
which tests use for what lives there: its ``fairqueue_demo`` command
(tests/e2e/test_demo.py), its ``Invoice`` model and post_save signal (tests/redis/test_signals.py)
and its job handlers (tests/redis/test_worker.py's autodiscovery). None of the demo's wiring
(django_prometheus, the Redis cache, its key prefixes, its logging) is here; the fixtures
point fairqueue at a private prefix (tests/conftest.py).
"""

import os
from importlib.util import find_spec
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "fairqueue-tests-only-not-a-secret"  # noqa: S105 - a test key, on purpose
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
# tests/unit/test_reporting.py: error pages mask Redis passwords with fairqueue's filter.
DEFAULT_EXCEPTION_REPORTER_FILTER = "fairqueue.reporting.CredentialSafeExceptionReporterFilter"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "fairqueue",
    # The backport on Django 5.2; Django 6 has django.tasks built in (`make test-django6`
    # runs without the backport).
    *(["django_tasks"] if find_spec("django_tasks") else []),
    "project.apps.ProjectConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# The admin (fairqueue's dashboard) and /metrics.
ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# PostgreSQL (or anything dj-database-url understands) when DATABASE_URL says so, as in
# CI (.ci/run); SQLite otherwise (pytest-django's test database is then in memory).
DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}", conn_max_age=60
    )
}
# A private test database name, so runs on a shared PostgreSQL do not collide
# (pytest-django creates and drops ``test_<name>`` otherwise).
if _test_db_name := os.environ.get("FAIRQUEUE_TEST_DB_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": _test_db_name}

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The job types the tests enqueue; each test's fixture adds its own PREFIX and REDIS_URL
# (tests/conftest.py's fq_prefix).
#: The suite's own Redis database (not db 0, which may hold anything on a developer's
#: Redis): FAIRQUEUE_REDIS_URL overrides it; tests/conftest.py deletes the run's keys.
TEST_REDIS_URL = "redis://127.0.0.1:6379/9"
FAIRQUEUE = {
    "REDIS_URL": TEST_REDIS_URL,
    "QUEUES": {"email": "email", "report": "report", "cleanup": "cleanup"},
}

# Django tasks (@task) run through fairqueue: django-tasks' default queue is the
# `email` job type; `report` is a task queue of its own (tests/redis/test_tasks_backend.py).
TASKS = {
    "default": {
        "BACKEND": "fairqueue.tasks.backend.FairQueueBackend",
        "QUEUES": ["default", "report"],
        "OPTIONS": {"JOB_TYPES": {"default": "email"}},
    }
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {"version": 1, "disable_existing_loggers": False}
