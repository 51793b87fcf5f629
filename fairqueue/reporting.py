"""An exception reporter filter that keeps Redis (and other) passwords off error pages.

Django's ``SafeExceptionReporterFilter`` hides settings whose *names* look secret
(``PASSWORD``, ``SECRET``, ``KEY``...), but a Redis URL lives in settings named
``REDIS_URL``, ``CACHES['default']['LOCATION']``, ``CELERY_BROKER_URL`` or
``FAIRQUEUE['REDIS_URL']``, and in the local variables of the frames a traceback shows.
With ``DEBUG = True`` the 500 page printed the password of every one of them. This
filter also masks the password of any ``scheme://user:password@host`` URL, in settings
and in frame variables, whatever the name::

    DEFAULT_EXCEPTION_REPORTER_FILTER = "fairqueue.reporting.CredentialSafeExceptionReporterFilter"

(the demo project sets it). Error reports mailed to ``ADMINS`` use the same filter.
"""

from __future__ import annotations

import re
from pprint import pformat
from typing import Any, Final

from django.views.debug import SafeExceptionReporterFilter

#: ``scheme://[user]:password@`` (the password is whatever lies between the first ``:``
#: after the scheme and the last ``@`` before the host).
_URL_CREDENTIALS: Final = re.compile(
    r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:/@\s'\"]*:)[^\s'\"]*@", re.IGNORECASE
)
#: ``?password=...`` in a URL's query (redis-py accepts it for unix:// URLs).
_QUERY_PASSWORD: Final = re.compile(r"(?P<head>[?&](?:password|sentinel_password)=)[^&\s'\"]*")


def mask_url_passwords(text: str, substitute: str = "********") -> str:
    """``text`` with the password of every URL in it replaced by ``substitute``."""
    text = _URL_CREDENTIALS.sub(lambda match: f"{match['head']}{substitute}@", text)
    return _QUERY_PASSWORD.sub(lambda match: f"{match['head']}{substitute}", text)


class _Masked:
    """A frame variable shown by its masked ``pformat`` (the page prints ``repr``)."""

    def __init__(self, text: str) -> None:
        self._text = text

    def __repr__(self) -> str:
        return self._text


class CredentialSafeExceptionReporterFilter(SafeExceptionReporterFilter):
    """Django's filter, plus: no URL password in any setting or frame variable."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str):
            return mask_url_passwords(cleansed, self.cleansed_substitute)
        return cleansed

    def get_traceback_frame_variables(self, request: Any, tb_frame: Any) -> Any:
        variables = super().get_traceback_frame_variables(request, tb_frame)
        masked = []
        for name, value in variables:
            try:
                text = pformat(value)
            except Exception:  # a broken __repr__ must not break the error page
                masked.append((name, value))
                continue
            safe = mask_url_passwords(text, self.cleansed_substitute)
            masked.append((name, _Masked(safe) if safe != text else value))
        return masked
