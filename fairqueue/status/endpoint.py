"""A job's status for the people waiting on it: ``GET <token>/`` as JSON, where the token
is ``EnqueuedJob.status_token`` (Django's signing, salted, expiring after
``settings.FAIRQUEUE_STATUS_TOKEN_MAX_AGE_S`` seconds, 7 days by default).

The answer names the job's state, its place in line and its expected start, nothing of
its payload, its tenant or any other job. A tampered, expired or malformed token, and a
job that is gone, get a 404 alike. Include it where your users may see it::

    path("jobs/", include("fairqueue.status.urls"))
"""

from __future__ import annotations

from typing import Final

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from fairqueue.enqueue.status import job_status
from fairqueue.enqueue.status_tokens import read_status_token
from fairqueue.exceptions import UnknownJobTypeError

#: How long a status token is valid by default (seconds): a week.
DEFAULT_MAX_AGE_S: Final = 7 * 86_400
#: The longest ``FAIRQUEUE_STATUS_TOKEN_MAX_AGE_S`` allowed: a year.
MAX_MAX_AGE_S: Final = 365 * 86_400


def token_max_age_s() -> int:
    """``settings.FAIRQUEUE_STATUS_TOKEN_MAX_AGE_S``, checked."""
    value = getattr(settings, "FAIRQUEUE_STATUS_TOKEN_MAX_AGE_S", DEFAULT_MAX_AGE_S)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MAX_AGE_S:
        raise ImproperlyConfigured(
            f"FAIRQUEUE_STATUS_TOKEN_MAX_AGE_S={value!r} is not allowed: expected a whole "
            f"number of seconds in 1..{MAX_MAX_AGE_S}"
        )
    return value


@require_GET
def job_status_view(request: HttpRequest, token: str) -> JsonResponse:
    """The status of the job ``token`` names, or a 404."""
    named = read_status_token(token, token_max_age_s())
    if named is None:
        raise Http404("no such job")
    job_type, job_id = named
    try:
        status = job_status(job_type, job_id)
    except (UnknownJobTypeError, ValueError):
        raise Http404("no such job") from None
    if status is None:
        raise Http404("no such job")
    response = JsonResponse(status.public())
    response["Cache-Control"] = "no-store"
    return response
