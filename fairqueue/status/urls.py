"""Optional URLs: ``path("jobs/", include("fairqueue.status.urls"))`` serves
``jobs/<token>/``, a job's status as JSON for its ``EnqueuedJob.status_token``
(:mod:`fairqueue.status.endpoint`)."""

from django.urls import path

from fairqueue.status.endpoint import job_status_view

app_name = "fairqueue_status"

urlpatterns = [
    path("<str:token>/", job_status_view, name="job_status"),
]
