"""System checks: report bad fairqueue settings under ``manage.py check``.

The same validation raises ``ImproperlyConfigured`` when a process first uses the
settings; the check lets ``manage.py check`` (and CI) say so before anything runs.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, register
from django.core.exceptions import ImproperlyConfigured

from . import conf


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """fairqueue.E001: a setting or environment variable is out of range or malformed."""
    try:
        conf.load_settings()
    except ImproperlyConfigured as exc:
        return [
            Error(
                str(exc),
                hint="Fix the environment variable or the FAIRQUEUE setting it names.",
                id="fairqueue.E001",
            )
        ]
    return []
