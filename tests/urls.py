"""The test project's URLs: the admin, where fairqueue's dashboard lives, and
``/metrics`` served with django-prometheus as the README shows (tests/redis/test_metrics.py),
or by fairqueue's own view where django-prometheus does not install (Django 6.1)."""

from importlib.util import find_spec

from django.contrib import admin
from django.urls import include, path

from fairqueue.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobs/", include("fairqueue.status.urls")),
    path("", include("django_prometheus.urls"))
    if find_spec("django_prometheus")
    else path("metrics", metrics_view),
]
