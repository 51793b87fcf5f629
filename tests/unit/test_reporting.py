"""Error pages and reports never show a Redis password: the demo's DEBUG is off by
default, and ``CredentialSafeExceptionReporterFilter`` masks URL passwords in settings
and frame variables when DEBUG is on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from fairqueue import conf
from fairqueue.dashboard import queue_page
from fairqueue.reporting import mask_url_passwords

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
SECRET_URL = "redis://:hunter2@127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (SECRET_URL, "redis://:********@127.0.0.1:6379/0"),
        ("rediss://user:p@ss:w0rd@host:6380/1", "rediss://user:********@host:6380/1"),
        (
            "unix:///run/redis.sock?db=2&password=hunter2",
            "unix:///run/redis.sock?db=2&password=********",
        ),
        ("{'LOCATION': 'redis://:hunter2@h/0'}", "{'LOCATION': 'redis://:********@h/0'}"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("https://example.com/a:b@c", "https://example.com/a:b@c"),
    ],
)
def test_mask_url_passwords(text, masked):
    assert mask_url_passwords(text) == masked


def _explode(*args, **kwargs):
    # As a failure deep inside a Redis client would: the URL is a local variable of a
    # frame the debug page shows, and the settings hold it under several names.
    redis_url = conf.get_settings().redis_url
    raise RuntimeError(f"boom near {len(redis_url)} characters")


def test_dashboard_error_page_with_debug_on_never_shows_the_password(client, settings, monkeypatch):
    settings.DEBUG = True
    settings.REDIS_URL = SECRET_URL
    settings.CELERY_BROKER_URL = SECRET_URL
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": SECRET_URL,
        }
    }
    settings.FAIRQUEUE = {"QUEUES": {"email": "email"}, "REDIS_URL": SECRET_URL}
    conf.reload_settings()
    monkeypatch.setattr(queue_page, "queues_stats", _explode)
    user = User.objects.create_superuser("root", password="pw")
    client.force_login(user)
    client.raise_request_exception = False
    try:
        response = client.get(reverse("admin:fairqueue_dashboard_changelist"))
    finally:
        conf.reload_settings()
    assert response.status_code == 500
    html = response.content.decode()
    assert "RuntimeError" in html and "REDIS_URL" in html and "redis_url" in html  # the page
    assert "hunter2" not in html
    assert "127.0.0.1:6379/0" in html  # where Redis is stays visible, only masked


def test_project_settings__debug_off_unless_asked_and_the_filter_wired():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_DEBUG"}
    code = "import project.settings as s; print(s.DEBUG, s.DEFAULT_EXCEPTION_REPORTER_FILTER)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [
        "False",
        "fairqueue.reporting.CredentialSafeExceptionReporterFilter",
    ]
