"""Where Redis is: one server by URL, a master found through Sentinel, or a Redis Cluster.

``FAIRQUEUE['REDIS']`` (or ``FAIRQUEUE_REDIS_URL`` / the older ``FAIRQUEUE['REDIS_URL']``)
takes any of these forms; :func:`parse_redis_target` validates one into a
:class:`RedisTarget`, which the broker turns into clients (``broker/connection.py``).
Every form has one URL spelling, so the setting can travel through an environment
variable and a child process rebuilds the same target from :attr:`RedisTarget.url`
(``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``, ``redis+cluster://``,
or their dict forms: docs/configuration.md).

Pure functions: nothing here reads settings or talks to Redis. Error messages name the
setting and what is allowed, and never echo a password (or a URL that may carry one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from django.core.exceptions import ImproperlyConfigured

RedisKind = Literal["url", "sentinel", "cluster"]

_URL_SCHEMES: Final = frozenset({"redis", "rediss", "unix"})
_SENTINEL_SCHEMES: Final = {"redis+sentinel": False, "rediss+sentinel": True}
_CLUSTER_SCHEMES: Final = {"redis+cluster": False, "rediss+cluster": True}
_DICT_KEYS: Final[Mapping[str, frozenset[str]]] = {
    "url": frozenset({"url"}),
    "sentinel": frozenset(
        {"sentinel", "service", "db", "username", "password", "sentinel_password", "ssl"}
    ),
    "cluster": frozenset({"cluster", "username", "password", "ssl"}),
}
_FORMS: Final = (
    "a redis://, rediss:// or unix:// URL, a redis+sentinel://host:port[,host:port]/service"
    "[/db] or redis+cluster://host:port[,host:port] URL, or a dict with one of the keys "
    "'url', 'sentinel' (with 'service') or 'cluster'"
)


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A validated Redis location. Holds credentials: never log it, use :attr:`location`.

    ``nodes`` are the sentinels (``kind == "sentinel"``) or the cluster's startup nodes
    (``kind == "cluster"``); ``url`` is the one-string form of the whole target.
    """

    kind: RedisKind
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    ssl: bool = False
    #: The setting (or variable) this target was read from, so a "Redis is unavailable"
    #: error can say what to fix; not part of the target's identity.
    source: str = field(default="", compare=False)

    def __repr__(self) -> str:  # credentials stay out of logs and tracebacks
        return f"RedisTarget({self.location})"

    @property
    def described(self) -> str:
        """Where this points and which setting said so (``127.0.0.1:6379/0 (from
        FAIRQUEUE['REDIS_URL'])``): what an unreachable-Redis error shows. No password."""
        return f"{self.location} (from {self.source})" if self.source else self.location

    @property
    def location(self) -> str:
        """Where this points, for logs and messages: never a password."""
        if self.kind == "url":
            return redis_location(self.url)
        nodes = ",".join(_address(host, port) for host, port in self.nodes)
        if self.kind == "sentinel":
            return f"sentinel {self.service} via {nodes} (db {self.db})"
        return f"cluster via {nodes}"


def redis_location(url: str) -> str:
    """``host:port/db`` (or ``unix:path/db``) of a Redis URL, without user or password,
    so logs and error messages can say which server was tried."""
    parts = urlsplit(url)
    if parts.scheme in _SENTINEL_SCHEMES or parts.scheme in _CLUSTER_SCHEMES:
        return parse_redis_target(url).location
    if parts.scheme == "unix":
        query = dict(item.partition("=")[::2] for item in parts.query.split("&") if item)
        return f"unix:{parts.path}/{query.get('db', '0') or '0'}"
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    host = parts.hostname or "127.0.0.1"
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"{host}:{port}/{parts.path.strip('/') or '0'}"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_address(name: str, item: Any) -> tuple[str, int]:
    """``"host:port"`` (``"[v6]:port"``) or ``("host", port)`` -> ``(host, port)``."""
    if isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 2:
        host, port = item
    elif isinstance(item, str) and ":" in item:
        host, _, port = item.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
    else:
        host, port = None, None
    if isinstance(port, str) and port.isascii() and port.isdigit():
        port = int(port)
    if (
        not isinstance(host, str)
        or not host
        or isinstance(port, bool)
        or not isinstance(port, int)
        or not 1 <= port <= 65_535
    ):
        raise ImproperlyConfigured(
            f"{name} address {item!r} is not allowed: expected 'host:port' with a port in 1..65535"
        )
    return host, port


def _parse_addresses(name: str, value: Any, what: str) -> tuple[tuple[str, int], ...]:
    if isinstance(value, str):
        value = [item for item in value.split(",") if item]
    if not isinstance(value, Sequence) or not value:
        raise ImproperlyConfigured(
            f"{name} {what} list {value!r} is not allowed: expected a non-empty list of "
            "'host:port' addresses"
        )
    return tuple(_parse_address(name, item) for item in value)


def _optional_str(name: str, key: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    # A password's value is never echoed.
    shown = "" if "password" in key else f"={value!r}"
    raise ImproperlyConfigured(f"{name}[{key!r}]{shown} is not allowed: expected a string")


def _db(name: str, value: Any) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 15_999:
        raise ImproperlyConfigured(
            f"{name} db {value!r} is not allowed: expected a database number 0..15999"
        )
    return value


def _nodes_url(
    scheme: str, nodes: Sequence[tuple[str, int]], username: str | None, password: str | None
) -> str:
    auth = ""
    if username is not None or password is not None:
        auth = quote(username or "", safe="")
        if password is not None:
            auth += ":" + quote(password, safe="")
        auth += "@"
    return f"{scheme}://{auth}{','.join(_address(host, port) for host, port in nodes)}"


def _from_dict(name: str, value: Mapping[str, Any]) -> RedisTarget:
    kinds = [kind for kind in _DICT_KEYS if kind in value]
    if len(kinds) != 1:
        raise ImproperlyConfigured(f"{name} is not allowed: expected {_FORMS}")
    kind = kinds[0]
    unknown = sorted(str(key) for key in set(value) - _DICT_KEYS[kind])
    if unknown:
        raise ImproperlyConfigured(
            f"{name} has unknown keys {unknown} for a {kind!r} setting: allowed keys are "
            f"{sorted(_DICT_KEYS[kind])}"
        )
    if kind == "url":
        return _from_url(name, value["url"])
    username = _optional_str(name, "username", value.get("username"))
    password = _optional_str(name, "password", value.get("password"))
    ssl = value.get("ssl", False)
    if not isinstance(ssl, bool):
        raise ImproperlyConfigured(f"{name}['ssl']={ssl!r} is not allowed: expected true/false")
    nodes = _parse_addresses(name, value[kind], kind)
    if kind == "cluster":
        scheme = "rediss+cluster" if ssl else "redis+cluster"
        url = _nodes_url(scheme, nodes, username, password)
        return RedisTarget("cluster", url, nodes, username=username, password=password, ssl=ssl)
    service = value.get("service")
    if not isinstance(service, str) or not service or "/" in service:
        raise ImproperlyConfigured(
            f"{name}['service']={service!r} is not allowed: expected the master name the "
            "sentinels monitor (a non-empty string without '/')"
        )
    db = _db(name, value.get("db", 0))
    sentinel_password = _optional_str(name, "sentinel_password", value.get("sentinel_password"))
    scheme = "rediss+sentinel" if ssl else "redis+sentinel"
    url = _nodes_url(scheme, nodes, username, password) + f"/{quote(service, safe='')}/{db}"
    if sentinel_password is not None:
        url += "?" + urlencode({"sentinel_password": sentinel_password})
    return RedisTarget(
        "sentinel", url, nodes, service, db, username, password, sentinel_password, ssl
    )


def _check_server_url(name: str, value: str) -> None:
    """A redis://, rediss:// or unix:// URL that redis-py can use: a host, a port in
    1..65535, a database number (path or ``?db=``) of ASCII digits in 0..15999, a socket
    path for unix://. Messages name the setting and the part at fault, never the URL
    (it may carry a password)."""
    parts = urlsplit(value)
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    if parts.scheme == "unix":
        if not parts.path:
            raise ImproperlyConfigured(
                f"{name} is not allowed: a unix:// URL needs the socket's path "
                "(unix:///run/redis.sock)"
            )
        db = query.get("db", "0")
    else:
        host_port = parts.netloc.rpartition("@")[2]
        if not parts.hostname:
            raise ImproperlyConfigured(
                f"{name} is not allowed: the URL has no host (redis://host:port/db)"
            )
        try:
            port = parts.port
        except ValueError:
            port = 0
        port_text = host_port.rpartition("]")[2].partition(":")[2] if ":" in host_port else ""
        if port == 0 or (port_text and not (port_text.isascii() and port_text.isdigit())):
            raise ImproperlyConfigured(
                f"{name} is not allowed: port {port_text!r} is not in 1..65535"
            )
        path = parts.path.strip("/")
        if path and "db" in query:
            raise ImproperlyConfigured(
                f"{name} is not allowed: give the database in the path or as ?db=, not both"
            )
        db = path or query.get("db", "0")
    if not (db.isascii() and db.isdigit()) or not 0 <= int(db) <= 15_999:
        raise ImproperlyConfigured(
            f"{name} is not allowed: database {db!r} is not a number in 0..15999"
        )


def _from_url(name: str, value: Any) -> RedisTarget:
    scheme = value.partition("://")[0] if isinstance(value, str) and "://" in value else None
    if scheme in _URL_SCHEMES:
        _check_server_url(name, value)
        return RedisTarget("url", value)
    if scheme not in _SENTINEL_SCHEMES and scheme not in _CLUSTER_SCHEMES:
        # Never echo the value: a Redis URL may carry a password.
        raise ImproperlyConfigured(f"{name} is not allowed: expected {_FORMS}")
    rest = value.partition("://")[2]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    auth, _, hosts = netloc.rpartition("@")
    username = password = None
    if auth:
        user, has_password, secret = auth.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
    options = {key: values[-1] for key, values in parse_qs(query).items()}
    if scheme in _CLUSTER_SCHEMES:
        if path.strip("/") or set(options):
            raise ImproperlyConfigured(
                f"{name} is not allowed: a redis+cluster:// URL takes no path or options "
                "(a cluster has only database 0)"
            )
        return _from_dict(
            name,
            {
                "cluster": hosts,
                "username": username,
                "password": password,
                "ssl": _CLUSTER_SCHEMES[scheme],
            },
        )
    service, _, db = path.strip("/").partition("/")
    unknown = sorted(set(options) - {"sentinel_password"})
    if unknown:
        raise ImproperlyConfigured(
            f"{name} has unknown URL options {unknown}: allowed is ['sentinel_password']"
        )
    return _from_dict(
        name,
        {
            "sentinel": hosts,
            "service": unquote(service) or None,
            "db": db or 0,
            "username": username,
            "password": password,
            "sentinel_password": options.get("sentinel_password"),
            "ssl": _SENTINEL_SCHEMES[scheme],
        },
    )


def parse_redis_target(value: Any, name: str = "FAIRQUEUE['REDIS']") -> RedisTarget:
    """Validate a Redis setting (a URL string or a dict, see the module docstring).

    Raises:
        ImproperlyConfigured: naming ``name`` and the forms allowed (never a password).
    """
    target = _from_dict(name, value) if isinstance(value, Mapping) else _from_url(name, value)
    return replace(target, source=name)


def hash_tag(key: str) -> str | None:
    """The hash tag Redis Cluster hashes ``key`` by (the text between the first ``{``
    and the next ``}``), or ``None`` when the whole key is hashed."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1 : end]


def queue_hash_tag(prefix: str, queue: str) -> str | None:
    """The hash tag every key of ``queue`` hashes by, whatever follows ``prefix:queue:``
    (BullMQ's job ids, fairqueue's ``fq:`` keys), or ``None`` when keys of the queue could
    land on different slots. The tag must close inside ``prefix:queue:``: a job id with a
    ``}`` must not be able to change it."""
    head = f"{prefix}:{queue}:"
    start = head.find("{")
    if start < 0 or head.find("}", start + 1) < 0:
        return None
    return hash_tag(head)
