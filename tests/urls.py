"""The test project's URLs: the admin, where fairqueue's dashboard lives, and
``/metrics`` served with django-prometheus as the README shows (tests/test_metrics.py)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("django_prometheus.urls")),
]
