"""Signed tokens naming one job, for the status endpoint (``fairqueue.status.urls``):
Django's signing with a salt of fairqueue's own, so a token is good for nothing else and
reveals nothing but the job type and id it names."""

from __future__ import annotations

from typing import Final

from django.core import signing

#: The salt of status tokens (a token signed for anything else never reads as one).
STATUS_TOKEN_SALT: Final = "fairqueue.status"  # noqa: S105 (a salt, not a secret)


def status_token(job_type: str, job_id: str) -> str:
    """A signed token naming one job, for the status endpoint (it expires after
    ``FAIRQUEUE_STATUS_TOKEN_MAX_AGE_S``, checked when it is read)."""
    return signing.dumps([job_type, job_id], salt=STATUS_TOKEN_SALT, compress=True)


def read_status_token(token: str, max_age_s: int) -> tuple[str, str] | None:
    """The (job type, job id) a token names, or ``None``: tampered, expired, malformed."""
    try:
        value = signing.loads(token, salt=STATUS_TOKEN_SALT, max_age=max_age_s)
    except signing.BadSignature:  # SignatureExpired is one
        return None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(part, str) for part in value):
        return value[0], value[1]
    return None
