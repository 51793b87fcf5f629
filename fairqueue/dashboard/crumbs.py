"""Breadcrumbs in the markup each supported Django admin styles.

Django 6's admin styles an ordered list (``<ol class="breadcrumbs">``, one ``<li>`` a
step); Django 5.2's a ``<div class="breadcrumbs">`` of links joined by "›". The console's
pages give the trail as data and ``fairqueue/_breadcrumbs.html`` draws whichever the
running admin expects, so they look like the admin's own pages on both.
"""

from __future__ import annotations

from typing import Any, Final

import django
from django.urls import reverse

#: Django 6.0 moved the admin's breadcrumbs to an ordered list.
AS_LIST: Final = django.VERSION >= (6, 0)


def trail(opts: Any, *steps: tuple[str, str | None]) -> dict[str, Any]:
    """Template context for the breadcrumbs: Home, the app, then ``steps`` (label, url;
    the last one, the page itself, without a url)."""
    crumbs = [
        {"label": "Home", "url": reverse("admin:index")},
        {
            "label": str(opts.app_config.verbose_name),
            "url": reverse("admin:app_list", kwargs={"app_label": opts.app_label}),
        },
        *({"label": label, "url": url} for label, url in steps),
    ]
    return {"crumbs": crumbs, "crumbs_as_list": AS_LIST}
