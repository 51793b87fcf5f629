from importlib.util import find_spec

from django.contrib import admin
from django.urls import include, path

from fairqueue.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    # django-prometheus where it installs (its 2.5.0 requires Django<6.1), else fairqueue's view.
    path("", include("django_prometheus.urls"))
    if find_spec("django_prometheus")
    else path("metrics", metrics_view),
]
