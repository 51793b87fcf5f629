"""Admission control in Django views: an enqueue refused with
:class:`~fairqueue.exceptions.ExpectedWaitTooLongError` as an HTTP 429 with
``Retry-After``.

```python
from fairqueue.http import refuse_with_429

@refuse_with_429
def export(request):
    job = enqueue_job("export", {...}, tenant_id=request.tenant.id, max_wait_ms=30_000)
    return JsonResponse({"job": job.job_id})
```
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from django.http import HttpResponse, JsonResponse

from fairqueue.exceptions import ExpectedWaitTooLongError

View = TypeVar("View", bound=Callable[..., Any])


def too_busy_response(error: ExpectedWaitTooLongError) -> HttpResponse:
    """A 429 for ``error``: ``Retry-After`` (seconds) and a small JSON body with the
    expected wait and the bound (no tenant, no payload)."""
    response = JsonResponse(
        {
            "error": "expected_wait_too_long",
            "expected_wait_ms": error.expected_wait_ms,
            "max_wait_ms": error.max_wait_ms,
            "retry_after_s": error.retry_after_s,
        },
        status=429,
    )
    response["Retry-After"] = str(error.retry_after_s)
    return response


def refuse_with_429(view: View) -> View:
    """Decorate a view (sync or async) so that an ``ExpectedWaitTooLongError`` it lets
    through becomes :func:`too_busy_response`."""
    if inspect.iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await view(*args, **kwargs)
            except ExpectedWaitTooLongError as error:
                return too_busy_response(error)

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return view(*args, **kwargs)
        except ExpectedWaitTooLongError as error:
            return too_busy_response(error)

    return wrapper  # type: ignore[return-value]
