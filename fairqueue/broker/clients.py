"""Redis clients of every kind fairqueue talks to (one server, Sentinel, Cluster), with
the timeouts, retry policies and connection names the broker relies on."""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.asyncio.sentinel as aiosentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from fairqueue.broker.sentinel import (
    AsyncFailoverAwareConnection,
    AsyncFailoverAwareSSLConnection,
    FailoverAwareConnection,
    FailoverAwareSSLConnection,
)
from fairqueue.redis_target import RedisTarget


def client_name(prefix: str) -> str:
    """The name fairqueue's Redis connections carry (``CLIENT LIST`` shows it), so an
    operator sees which connections are fairqueue's and for which prefix."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in prefix)
    return f"fairqueue.{safe}"[:64]


#: A ``redis.asyncio`` client of any kind the broker makes (all take the same commands;
#: a cluster client routes each one, and each script call, to the slot of its keys).
AsyncClient = aioredis.Redis | aiocluster.RedisCluster
#: A blocking client of any kind (enqueues from sync code).
SyncClient = redis.Redis | redis.cluster.RedisCluster

_TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 2, "socket_timeout": 10}
#: How long async Sentinel clients (workers, the pass, the dashboard) keep retrying a
#: command that failed because the master went away or was left behind (0.1 s doubling
#: to 1 s, ~25 s in all): through a failover, so that a worker's "job done" write reaches
#: the new master instead of failing and leaving the job active, to run again once BullMQ
#: finds it stalled. Each retry follows a connection error or NOREPLICAS, where the
#: script did not run. (Enqueues, on the sync client, fail fast instead: retry them with
#: the same job id, or enqueue durably.)
FAILOVER_RETRIES = 30


def async_client(target: RedisTarget, name: str | None = None) -> AsyncClient:
    """A ``redis.asyncio`` client for ``target``: one server's pool, the master Sentinel
    names now (re-asked after a failover: the pool reconnects on a connection error or a
    READONLY or NOREPLICAS reply, see ``sentinel.py``), or a cluster client that follows
    MOVED/ASK redirections. BullMQ's Python package takes any of them as its
    ``connection``.

    ``name`` is the connections' ``CLIENT SETNAME`` (see :func:`client_name`). Replies
    are decoded with ``errors="replace"``: the dashboard and the pass read what any
    producer wrote, and bytes that are not UTF-8 must not turn a page into a 500
    (strict on what fairqueue writes, tolerant on what it reads)."""
    named: dict[str, Any] = {"client_name": name, "encoding_errors": "replace"}
    if target.kind == "sentinel":
        sentinel = aiosentinel.Sentinel(
            list(target.nodes),
            sentinel_kwargs={**_TIMEOUTS, "password": target.sentinel_password},
            **_TIMEOUTS,
        )
        return sentinel.master_for(
            cast(str, target.service),  # a Sentinel target names its service
            decode_responses=True,
            db=target.db,
            username=target.username,
            password=target.password,
            connection_class=(
                AsyncFailoverAwareSSLConnection if target.ssl else AsyncFailoverAwareConnection
            ),
            retry=AsyncRetry(ExponentialBackoff(cap=1.0, base=0.05), FAILOVER_RETRIES),
            health_check_interval=30,
            **named,
        )
    if target.kind == "cluster":
        return aiocluster.RedisCluster(
            startup_nodes=[aiocluster.ClusterNode(host, port) for host, port in target.nodes],
            decode_responses=True,
            username=target.username,
            password=target.password,
            ssl=target.ssl,
            health_check_interval=30,
            **named,
            **_TIMEOUTS,
        )
    return aioredis.from_url(
        target.url,
        decode_responses=True,
        health_check_interval=30,
        # No silent resend (aenqueue_job's adds go through this client; see sync_client).
        # Workers on one server use BullMQ's own clients, and a pass or a page that fails
        # is run again by its loop or its reader.
        retry=AsyncRetry(NoBackoff(), 0),
        **named,
        **_TIMEOUTS,
    )


def sync_client(target: RedisTarget, name: str | None = None) -> SyncClient:
    """A blocking client for ``target`` (see :func:`async_client`). For one server it holds
    a single connection (the enqueue hot path checks nothing out of a pool)."""
    named: dict[str, Any] = {"client_name": name}
    if target.kind == "sentinel":
        sentinel = redis.sentinel.Sentinel(
            list(target.nodes),
            sentinel_kwargs={**_TIMEOUTS, "password": target.sentinel_password},
            **_TIMEOUTS,
        )
        return sentinel.master_for(
            cast(str, target.service),  # a Sentinel target names its service
            decode_responses=True,
            db=target.db,
            username=target.username,
            password=target.password,
            connection_class=FailoverAwareSSLConnection if target.ssl else FailoverAwareConnection,
            retry=Retry(NoBackoff(), 0),  # no silent resend of an add (see below)
            **named,
        )
    if target.kind == "cluster":
        return redis.cluster.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(host, port) for host, port in target.nodes],
            decode_responses=True,
            username=target.username,
            password=target.password,
            ssl=target.ssl,
            **named,
            **_TIMEOUTS,
        )
    return redis.Redis.from_url(
        target.url,
        decode_responses=True,
        single_connection_client=True,
        **named,
        # No silent resend: an add whose reply was lost may have run, and a resent add
        # of a job without an id would enqueue it twice. The caller gets
        # BrokerUnavailableError and retries under its job id.
        retry=Retry(NoBackoff(), 0),
        **_TIMEOUTS,
    )


def drop_if_stale(client: SyncClient) -> None:
    """Disconnect a kept connection that Redis closed (restart, idle timeout), as
    redis-py's pool does on check-out; the next command then reconnects. Sending on it
    instead would fail after the fact, unsure whether the command ran. (Pooled clients,
    Sentinel's and Cluster's, check their connections themselves.)"""
    connection = getattr(client, "connection", None)
    if connection is None:
        return
    try:
        if connection.can_read(timeout=0):  # a healthy idle connection has nothing to read
            connection.disconnect()
    except (RedisConnectionError, OSError):
        connection.disconnect()
