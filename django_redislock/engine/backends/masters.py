"""The Redlock masters' own clients, built from the configured ones.

A paused master's kernel still accepts TCP connections, so a connection that
waits for a handshake reply (``HELLO`` of RESP3, ``CLIENT SETINFO``) would hang
there. Each master's client is therefore rebuilt from the configured client's
server, credentials and TLS settings with RESP2, no ``CLIENT SETINFO``, no
connection retries and bounded timeouts.
"""

from __future__ import annotations

import inspect
from typing import Any

import redis
import redis.asyncio
import redis.connection

#: The most a master's connection waits on a socket (s): bounds a handshake with
#: a paused master and the read of a reply that started to arrive.
MAX_SOCKET_TIMEOUT = 1.0
#: The most a master's client waits for a TCP (or TLS) connection (s); no retries.
MAX_CONNECT_TIMEOUT = 0.25

#: The installed redis-py's (major, minor) version.
REDIS_PY_VERSION = tuple(map(int, redis.__version__.split(".")[:2]))
#: redis-py before 5.3 requires a command name in ``get_connection``; 5.3 and
#: later deprecate passing one (a DeprecationWarning).
_CHECKOUT_ARGS = ("EVALSHA",) if REDIS_PY_VERSION < (5, 3) else ()

#: Connection settings a master's own client keeps from the configured client.
_KEPT = {
    "host", "port", "path", "db", "username", "password", "credential_provider",
    "socket_timeout", "socket_connect_timeout", "socket_keepalive",
    "socket_keepalive_options", "client_name",
}  # fmt: skip


def checkout(pool: Any) -> Any:
    """A connection lent by a master's *pool* (sync or asyncio: then awaitable), asked
    for the way this redis-py wants: Redlock's scatter writes on it and reads it
    itself, one connection per master at once (it gives it back with ``release``)."""
    return pool.get_connection(*_CHECKOUT_ARGS)


def master_kwargs(client: Any) -> dict[str, Any]:
    """Connection settings for a Redlock master's own client, from a configured client
    (its server, credentials, TLS; RESP2, no ``CLIENT SETINFO``, bounded timeouts)."""
    kwargs = {
        k: v
        for k, v in client.connection_pool.connection_kwargs.items()
        if k in _KEPT or k.startswith("ssl_")
    }
    for key, most in (
        ("socket_timeout", MAX_SOCKET_TIMEOUT),
        ("socket_connect_timeout", MAX_CONNECT_TIMEOUT),
    ):
        value = kwargs.get(key)
        kwargs[key] = most if value is None else min(value, most)
    kwargs["protocol"] = 2
    kwargs.update(_NO_CLIENT_INFO)
    return kwargs


def _no_client_info() -> dict[str, Any]:
    """The connection option that stops redis-py sending ``CLIENT SETINFO`` on connect
    (``driver_info`` since redis-py 8; ``lib_name``/``lib_version`` before)."""
    if "driver_info" in inspect.signature(redis.connection.AbstractConnection.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


_NO_CLIENT_INFO = _no_client_info()


def connection_class(client: Any, flavour: Any, kwargs: dict[str, Any]) -> Any:
    """*flavour*'s (``redis.connection`` or its asyncio twin) connection class matching
    *client*'s: TCP, TLS or a Unix socket."""
    name = client.connection_pool.connection_class.__name__
    if name == "UnixDomainSocketConnection":
        kwargs.pop("host", None)
        kwargs.pop("port", None)
        return flavour.UnixDomainSocketConnection
    kwargs.pop("path", None)
    return flavour.SSLConnection if name == "SSLConnection" else flavour.Connection


def sync_master(client: Any) -> redis.Redis:
    """A master's own blocking client (see :func:`master_kwargs`)."""
    import redis.connection as flavour
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    kwargs = master_kwargs(client)
    cls = connection_class(client, flavour, kwargs)
    pool = redis.ConnectionPool(connection_class=cls, retry=Retry(NoBackoff(), 0), **kwargs)
    return redis.Redis(connection_pool=pool)


def async_master(client: Any) -> redis.asyncio.Redis:
    """A master's own ``redis.asyncio`` client (see :func:`master_kwargs`)."""
    import redis.asyncio.connection as flavour
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    kwargs = master_kwargs(client)
    cls = connection_class(client, flavour, kwargs)
    pool = redis.asyncio.ConnectionPool(
        connection_class=cls, max_connections=1000, retry=Retry(NoBackoff(), 0), **kwargs
    )
    return redis.asyncio.Redis.from_pool(pool)
