"""How a tenant id sits in the console's URLs: one path segment no id can confuse.

A tenant id may hold any character (``acme/do/pause``, ``..``, ``%2F``, spaces, emoji),
so the raw id in a ``<path:...>`` route let ``acme/do/pause`` resolve to acme's pause
action and ``acme/limits`` to acme's limits form. Here the id is escaped into one
segment of ``[A-Za-z0-9_-]``: letters, digits and ``-`` stand for themselves, every other
UTF-8 byte is ``_`` and two upper-case hex digits (``acme/x`` is ``acme_2Fx``, ``_`` is
``_5F``). The segment never holds ``/``, ``.`` or ``%``, so neither the router nor a
browser's dot-segment or percent handling can change what it names; every id has exactly
one segment (a non-canonical escape is a 404), and common ids stay readable.

The converter is registered as ``fq_tenant``; every tenant URL is built by reversing the
console's tenant route names, through :func:`tenant_url` (which passes the raw id: the
converter escapes it), or ``{% url 'admin:fairqueue_dashboard_tenant' tenant_id %}`` in
a template.
"""

from __future__ import annotations

import re
from typing import Final

from django.urls import register_converter, reverse

#: The bytes that stand for themselves in a segment.
_PLAIN: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
_ESCAPE: Final = re.compile(r"_([0-9A-F]{2})")
#: The console's tenant route names (``admin:fairqueue_dashboard_<name>``).
TENANT_PAGE: Final = "tenant"
TENANT_LIMITS: Final = "tenant_limits"
TENANT_ACTION: Final = "tenant_action"
#: The account page's route name: an account id follows a tenant id's rules, so its
#: segment is escaped the same way.
ACCOUNT_PAGE: Final = "account"
ACCOUNT_ACTION: Final = "account_action"


def encode_tenant_segment(tenant_id: str) -> str:
    """``tenant_id`` as its one URL path segment (see the module's docstring)."""
    return "".join(
        chr(byte) if byte in _PLAIN else f"_{byte:02X}" for byte in tenant_id.encode("utf-8")
    )


def decode_tenant_segment(segment: str) -> str:
    """The tenant id of a segment :func:`encode_tenant_segment` made; ``ValueError`` for
    any other string (a stray ``_``, lower-case hex, an escaped plain character, bytes
    that are not UTF-8), so each id has one URL."""
    raw = bytearray()
    at = 0
    while at < len(segment):
        char = segment[at]
        if char == "_":
            match = _ESCAPE.match(segment, at)
            if match is None:
                raise ValueError("a tenant segment's '_' is followed by two hex digits")
            raw.append(int(match.group(1), 16))
            at = match.end()
        else:
            raw.append(ord(char))
            at += 1
    tenant_id = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if not tenant_id or encode_tenant_segment(tenant_id) != segment:
        raise ValueError("not the canonical segment of a tenant id")
    return tenant_id


class TenantIdConverter:
    """Django path converter ``fq_tenant``: the raw tenant id in views and ``reverse``,
    its escaped segment in the URL."""

    regex = "[A-Za-z0-9_-]+"

    def to_python(self, value: str) -> str:
        return decode_tenant_segment(value)

    def to_url(self, value: str) -> str:
        return encode_tenant_segment(value)


register_converter(TenantIdConverter, "fq_tenant")


def tenant_url(tenant_id: str, action: str = "", *, site: str = "admin") -> str:
    """The console URL of ``tenant_id``'s page; with ``action``, of its limits form
    (``"limits"``) or of one of its actions' confirmation (``"pause"``, ``"resume"``,
    ``"retry"``, ``"remove"``). ``site`` is the admin site's name."""
    prefix = f"{site}:fairqueue_dashboard_"
    if not action:
        return reverse(prefix + TENANT_PAGE, args=[tenant_id])
    if action == "limits":
        return reverse(prefix + TENANT_LIMITS, args=[tenant_id])
    return reverse(prefix + TENANT_ACTION, args=[tenant_id, action])


def account_url(account_id: str, action: str = "", *, site: str = "admin") -> str:
    """The console URL of ``account_id``'s page (the id escaped as a tenant id is), or
    with ``action`` of its confirmation (``"pause"``, ``"resume"``)."""
    prefix = f"{site}:fairqueue_dashboard_"
    if not action:
        return reverse(prefix + ACCOUNT_PAGE, args=[account_id])
    return reverse(prefix + ACCOUNT_ACTION, args=[account_id, action])
