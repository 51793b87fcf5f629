"""The optional job-status endpoint: ``path("jobs/", include("fairqueue.status.urls"))``
serves a job's state, place and expected start by a signed token (``endpoint``). The
status it serves and the tokens are the producer's (``fairqueue.enqueue``)."""
