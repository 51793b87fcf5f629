"""Optional URLs: ``path("jobs/", include("fairqueue.status_urls"))`` serves
``jobs/<token>/``, a job's status as JSON for its ``EnqueuedJob.status_token``
(:mod:`fairqueue.status_views`)."""

from django.urls import path

from fairqueue.status_views import job_status_view

app_name = "fairqueue_status"

urlpatterns = [
    path("<str:token>/", job_status_view, name="job_status"),
]
