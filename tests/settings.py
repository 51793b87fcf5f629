"""Test settings: the demo project's, with an isolated cache and test-only queues."""

from project.settings import *  # noqa: F403

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
FAIRQUEUE = {
    "QUEUES": {"email": "email", "report": "report", "cleanup": "cleanup"},
}
LOGGING = {"version": 1, "disable_existing_loggers": False}
