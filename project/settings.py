"""Settings of the fairqueue demo project (not part of the reusable app).

SQLite by default; ``DATABASE_URL`` switches to PostgreSQL (or anything dj-database-url
understands). Redis for BullMQ and the cache comes from ``FAIRQUEUE_REDIS_URL``.
"""

import os
from importlib.util import find_spec
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "fairqueue-demo-only-not-a-secret")
# Off unless asked for (DJANGO_DEBUG=1): a debug page shows settings and local variables.
# The demo serves its static files without it (runserver --insecure).
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
# Django hides settings named like secrets; this also masks the password of every URL
# (REDIS_URL, CACHES' LOCATION, CELERY_BROKER_URL, FAIRQUEUE) and of frame variables.
DEFAULT_EXCEPTION_REPORTER_FILTER = "fairqueue.reporting.CredentialSafeExceptionReporterFilter"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "fairqueue",
    "project.apps.ProjectConfig",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

# django-prometheus 2.5.0, its latest, requires Django<6.1: without it (Django 6.1) the
# demo serves /metrics with fairqueue's own view (project/urls.py) and has no request metrics.
if not find_spec("django_prometheus"):
    INSTALLED_APPS.remove("django_prometheus")
    MIDDLEWARE = [entry for entry in MIDDLEWARE if not entry.startswith("django_prometheus.")]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

WSGI_APPLICATION = "project.wsgi.application"

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}", conn_max_age=60
    )
}

REDIS_URL = os.environ.get("FAIRQUEUE_REDIS_URL", "redis://127.0.0.1:6379/0")
# fairqueue reads its BullMQ key prefix from FAIRQUEUE_PREFIX ("bull" by default, so
# Node workers find the jobs). The demo runs under its own prefix ("fairqueue-demo",
# `fairqueue_demo --prefix`); the plan cache's keys then live under it too, so deleting
# the prefix when the demo stops leaves nothing behind.
FAIRQUEUE_PREFIX = os.environ.get("FAIRQUEUE_PREFIX", "").strip() or "bull"
CACHE_KEY_PREFIX = "fairqueue-demo" if FAIRQUEUE_PREFIX == "bull" else f"{FAIRQUEUE_PREFIX}:cache"

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": CACHE_KEY_PREFIX,
        "OPTIONS": {"IGNORE_EXCEPTIONS": True},
    }
}
DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS = True

FAIRQUEUE = {
    "QUEUES": {"email": "email", "report": "report", "cleanup": "cleanup"},
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"fairqueue": {"handlers": ["console"], "level": "INFO"}},
}
