"""Finding the Redis client to lock with.

By default the client comes from a Django cache alias (``REDISLOCK_CACHE``),
reusing that cache's connection pool and always its *write* connection (locks
must never be read from a replica). Supported cache backends:

* ``django_redis.cache.RedisCache`` (default and Sentinel clients), through
  ``django_redis.get_redis_connection(alias, write=True)``;
* Django's own ``django.core.cache.backends.redis.RedisCache`` (Django >= 4.0),
  through its client's ``get_client(write=True)``;
* subclasses of either, such as django-prometheus's instrumented
  ``django_prometheus.cache.backends.redis.RedisCache`` (django-redis) and
  ``NativeRedisCache`` (Django's): the cache object's class decides, not the
  backend's module name. django-redis's ``ShardClient`` is refused (a lock must
  live on one server).

``REDISLOCK_URL`` (a ``redis://`` / ``rediss://`` / ``unix://`` URL) overrides
the cache alias. When it names a node of a Redis Cluster (``REDISLOCK_CLUSTER``,
or asked of the server), the client is a ``redis.cluster.RedisCluster``; a cache
alias whose client is a ``RedisCluster`` works too.
"""

from __future__ import annotations

import codecs
import inspect
import weakref
from typing import Any, TypeVar

import redis
import redis.cluster
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import RedisClusterException

from ..conf import setting
from ..exceptions import LockBackendError
from ..settings_spec import REDIS_URL_SCHEMES, validate_redis_targets


def describe_backend(alias: str) -> str:
    """The dotted path of the cache backend configured for *alias*."""
    from django.conf import settings

    try:
        return str(settings.CACHES[alias]["BACKEND"])
    except KeyError:
        raise ImproperlyConfigured(
            f"REDISLOCK_CACHE is {alias!r}, but CACHES has no such alias"
        ) from None


def client_for_cache(alias: str) -> redis.Redis:
    """Return the write Redis client of the Django cache *alias*, or raise ImproperlyConfigured.

    The cache is recognised by its class, so subclasses of either backend (such
    as django-prometheus's instrumented ``RedisCache`` and ``NativeRedisCache``)
    work as their base does.
    """
    backend = describe_backend(alias)
    cache: Any = caches[alias]
    if issubclass(type(cache), _django_cache_class()):
        client = cache._cache.get_client(None, write=True)
        return usable_client(client, f"the client of cache {alias!r}")  # type: ignore[no-any-return]
    if issubclass(type(cache), _django_redis_cache_class()):
        client = cache.client
        if type(client).__name__ == "ShardClient":
            raise ImproperlyConfigured(
                f"cache {alias!r} uses django-redis's ShardClient; a lock must live on one "
                "server: point REDISLOCK_CACHE at a cache with a single master"
            )
        client = client.get_client(write=True)
        return usable_client(client, f"the client of cache {alias!r}")  # type: ignore[no-any-return]
    if _is_django_valkey(cache):
        raise ImproperlyConfigured(
            f"cache {alias!r} uses {backend}, django-valkey's cache, whose client is valkey-py; "
            "the locks talk to Valkey through redis-py, which speaks Valkey's protocol. Set "
            "REDISLOCK_URL to the same server (redis://host:6379/0; a Valkey cluster: "
            "REDISLOCK_URL on one node), or point REDISLOCK_CACHE at a django-redis or "
            "django.core.cache.backends.redis.RedisCache alias (Sentinel: django-redis's "
            "SentinelClient) on that server; see docs/settings.md#valkey"
        )
    raise ImproperlyConfigured(
        f"cache {alias!r} uses {backend}, which is not a Redis cache; set REDISLOCK_CACHE "
        "to a django-redis or django.core.cache.backends.redis.RedisCache alias (or a "
        "subclass of either), or set REDISLOCK_URL"
    )


def _is_django_valkey(cache: Any) -> bool:
    """Whether *cache* is one of django-valkey's caches (by class, subclasses included)."""
    return any(cls.__module__.startswith("django_valkey.") for cls in type(cache).__mro__)


#: Where redis-py (7+) defines its multi-database failover clients.
_MULTIDB_MODULES = ("redis.multidb.", "redis.asyncio.multidb.")
_C = TypeVar("_C")


def refuse_failover_client(client: _C, where: str) -> _C:
    """*client*, unless it is redis-py's multi-database failover client (``MultiDBClient``,
    redis-py 7+, blocking or asyncio): then ImproperlyConfigured naming *where* it came from.

    A failover moves its commands to another database, whose locks are not the ones
    held: Active-Active databases replicate asynchronously and merge conflicting
    writes, so a lock held on the first can be granted again on the second.
    """
    for cls in type(client).__mro__:
        if cls.__name__ == "MultiDBClient" and cls.__module__.startswith(_MULTIDB_MODULES):
            raise ImproperlyConfigured(
                f"{where} is redis-py's multi-database failover client (MultiDBClient): on a "
                "failover it switches to another database with a different lock state, so "
                "two clients could hold one lock. Give the locks a client of one primary "
                "(redis.Redis, or through Sentinel), a RedisCluster, or independent masters "
                "in REDISLOCK_REDLOCK_CACHES (see docs/topology.md)"
            )
    return client


class ForeignEncoding(ImproperlyConfigured):
    """A Redis client for locks that encodes text in something other than UTF-8."""


def refuse_foreign_encoding(client: _C, where: str) -> _C:
    """*client*, unless it encodes text in something other than UTF-8: then
    :class:`ForeignEncoding` naming *where* it came from.

    The engine writes its keys and reads its records as UTF-8, while redis-py
    encodes the text it is given (and, with ``decode_responses``, decodes replies)
    with the client's ``encoding``: under ``latin-1`` a lock called ``"café"`` would
    be written under one key and looked up under another, and a name outside
    latin-1 could not be sent at all.
    """
    get_encoder = getattr(client, "get_encoder", None)
    encoding = get_encoder().encoding if get_encoder is not None else "utf-8"
    try:
        canonical = codecs.lookup(encoding).name
    except LookupError:  # not an encoding at all: redis-py would fail at the first text
        canonical = encoding
    if canonical != "utf-8":
        raise ForeignEncoding(
            f"{where} encodes text as {encoding!r}, but django-redislock keeps its keys and "
            "records in UTF-8: a lock whose name is not ASCII would be written under one "
            "key and looked up under another. Give the locks a client with "
            "encoding='utf-8', redis-py's default (leave \"encoding\" out of the cache's "
            "OPTIONS, the URL or the client's arguments)"
        )
    return client


def usable_client(client: _C, where: str) -> _C:
    """*client*, after :func:`refuse_failover_client` and :func:`refuse_foreign_encoding`."""
    return refuse_foreign_encoding(refuse_failover_client(client, where), where)


def _django_cache_class() -> type:
    """Django's own ``RedisCache`` (Django >= 4.0)."""
    from django.core.cache.backends.redis import RedisCache

    return RedisCache


def _django_redis_cache_class() -> type:
    """django-redis's ``RedisCache`` (a class nothing is an instance of when not installed)."""
    try:
        from django_redis.cache import RedisCache
    except ImportError:
        return _NotInstalled
    return RedisCache  # type: ignore[no-any-return]


class _NotInstalled:
    """Stands for the class of a backend whose package is not installed."""


Client = redis.Redis | redis.cluster.RedisCluster

_url_clients: dict[tuple[str, bool | None], Client] = {}

#: Clients made while the server could not be reached to ask whether it is a cluster
#: node: each serves the one call that asked for it, which then fails as any call to
#: an unreachable server does (naming its lock and the server); none is kept.
_provisional: weakref.WeakSet[Client] = weakref.WeakSet()


def client_for_url(url: str) -> Client:
    """Return a (process-wide, cached) client for a Redis URL: a ``RedisCluster``
    when the URL names a cluster node (``REDISLOCK_CLUSTER``, by default asked of
    the server once it can be reached: until then, a :func:`provisional` client)."""
    cluster = setting("REDISLOCK_CLUSTER")
    client = _url_clients.get((url, cluster))
    if client is None:
        if cluster is None:
            cluster = is_cluster_node(url)
        if cluster is None:  # unreachable: asked again by the next call
            unsure = redis.Redis.from_url(url)
            _provisional.add(unsure)
            return unsure
        try:
            made: Client = (
                redis.cluster.RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
            )
        except (redis.RedisError, RedisClusterException) as exc:  # a cluster connects at once
            message = f"could not connect to the Redis Cluster at {url}: {exc}"
            raise LockBackendError(message) from exc
        client = _url_clients.setdefault((url, setting("REDISLOCK_CLUSTER")), made)
    return client


def provisional(client: Any) -> bool:
    """Whether *client* was made while its server could not be reached (see
    :func:`client_for_url`): the backend made of it must not be kept."""
    return client in _provisional


def is_cluster_node(url: str) -> bool | None:
    """Whether the server at *url* runs in cluster mode (``INFO cluster``); None when
    the server cannot be reached (connection refused or timed out, authentication);
    raises LockBackendError when it answers but will not say (``INFO`` denied)."""
    probe = redis.Redis.from_url(url)
    try:
        return bool(int(probe.info("cluster").get("cluster_enabled", 0)))
    except (redis.ConnectionError, redis.TimeoutError):
        return None
    except redis.RedisError as exc:
        raise LockBackendError(
            f"could not ask Redis at REDISLOCK_URL whether it is a cluster node: {exc}; "
            "set REDISLOCK_CLUSTER = True or False to skip the question"
        ) from exc
    finally:
        probe.close()


def connection_kwargs(client: Any) -> dict[str, Any]:
    """The connection settings of *client* (of a node's pool for a cluster client)."""
    if isinstance(client, redis.cluster.RedisCluster):
        client = client.get_default_node().redis_connection  # type: ignore[no-untyped-call]
    pool = getattr(client, "connection_pool", None)
    return dict(getattr(pool, "connection_kwargs", {}))


def is_cluster_client(client: Any) -> bool:
    """Whether *client* is a Redis Cluster client (blocking or ``redis.asyncio``)."""
    import redis.asyncio

    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.RedisCluster))


def resolve_client(cache_alias: str | None = None, url: str | None = None) -> Client:
    """The client for an explicit alias/URL, else for ``REDISLOCK_URL`` / ``REDISLOCK_CACHE``."""
    if url is None and cache_alias is None:
        url = setting("REDISLOCK_URL")
    if url:
        return usable_client(client_for_url(url), "the client made from the Redis URL")
    from django.conf import settings

    if not settings.configured:
        raise ImproperlyConfigured(
            "django-redislock has no Redis to use: without Django settings there is no cache "
            "alias to borrow a client from. Set REDISLOCK_URL (django_redislock.standalone."
            "configure(REDISLOCK_URL='redis://...'), or REDISLOCK_URL in your Celery app's conf), "
            "or pass LockManager(client=redis.Redis(...))"
        )
    return client_for_cache(cache_alias or setting("REDISLOCK_CACHE"))


# Connection settings carried over between a sync client and its asyncio twin
# (the rest -- pools, parsers, retry objects, event hooks -- are per flavour).
_TWIN_KWARGS = {
    "host",
    "port",
    "path",
    "db",
    "username",
    "password",
    "credential_provider",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "retry_on_timeout",
    "encoding",
    "encoding_errors",
    "decode_responses",
    "health_check_interval",
    "client_name",
    "protocol",
}


def _twin_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k in _TWIN_KWARGS or k.startswith("ssl_")}


def _twin_connection_class(pool: Any, flavour: Any, kwargs: dict[str, Any]) -> Any:
    """The connection class of *flavour* (``redis.connection`` or its asyncio twin)
    matching *pool*'s: TCP, TLS or a Unix socket (``path`` is dropped unless the last)."""
    connection_class = {
        "SSLConnection": flavour.SSLConnection,
        "UnixDomainSocketConnection": flavour.UnixDomainSocketConnection,
    }.get(pool.connection_class.__name__, flavour.Connection)
    if connection_class is not flavour.UnixDomainSocketConnection:
        kwargs.pop("path", None)
    return connection_class


def redlock_clients(entries: Any) -> list[redis.Redis]:
    """The blocking clients of the Redlock masters named by *entries* (cache aliases or
    ``redis://`` / ``rediss://`` / ``unix://`` URLs); ImproperlyConfigured when unusable."""
    try:
        entries = validate_redis_targets(entries, "REDISLOCK_REDLOCK_CACHES")
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(str(exc)) from None
    clients = []
    for number, entry in enumerate(entries, 1):
        if entry.startswith(REDIS_URL_SCHEMES):
            client: Any = redis.Redis.from_url(entry)
        else:
            client = client_for_cache(entry)
        usable_client(client, f"the client of Redlock master #{number}")
        if is_cluster_client(client):
            raise ImproperlyConfigured(
                f"Redlock master {entry!r} is a Redis Cluster: Redlock needs independent "
                "single masters (use the cluster directly through REDISLOCK_URL instead)"
            )
        clients.append(client)
    return clients


def is_async_client(client: Any) -> bool:
    """Whether *client* is a ``redis.asyncio`` client."""
    import redis.asyncio

    return isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster))


def async_twin(client: redis.Redis) -> Any:
    """A new ``redis.asyncio`` client to the same server, with the same connection settings.

    Built from the sync client's pool, so a Django cache alias, a URL or a
    Sentinel set-up yields an asyncio client for the current event loop; a
    ``RedisCluster`` yields a ``redis.asyncio.RedisCluster`` on its known nodes.
    """
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.asyncio.connection as aconn
    import redis.asyncio.sentinel
    import redis.sentinel

    if isinstance(client, redis.cluster.RedisCluster):
        nodes = client.get_nodes()
        return redis.asyncio.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(n.host, n.port) for n in nodes],
            **_cluster_twin_kwargs(
                nodes[0].redis_connection.connection_pool, redis.asyncio.RedisCluster
            ),
        )
    pool = client.connection_pool
    kwargs = _twin_kwargs(dict(pool.connection_kwargs))
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        manager = pool.sentinel_manager
        sentinels = [
            (
                s.connection_pool.connection_kwargs["host"],
                s.connection_pool.connection_kwargs["port"],
            )
            for s in manager.sentinels
        ]
        sentinel_kwargs = _twin_kwargs(dict(manager.sentinels[0].connection_pool.connection_kwargs))
        for key in ("host", "port", "path"):
            sentinel_kwargs.pop(key, None)
            kwargs.pop(key, None)
        asentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            sentinels, sentinel_kwargs=sentinel_kwargs
        )
        return asentinel.master_for(pool.service_name, **kwargs)
    connection_class = _twin_connection_class(pool, aconn, kwargs)
    # Many tasks may run a lock call at once (a waiting task holds no connection,
    # but a burst of calls can), and redis.asyncio's pool fails past its size
    # (100 by default) instead of waiting: allow many. (A BlockingConnectionPool
    # would wait, but costs a timer task on every command.) The backend's gate
    # (engine/backends/gate.py) bounds the calls in flight well below this.
    # from_pool: the client owns the pool, so closing the client closes its connections.
    pool_size = max(1000, getattr(pool, "max_connections", 0) or 0)
    if pool_size > 10_000:  # redis-py's "unlimited" (2**31): keep a sane bound
        pool_size = 10_000
    return redis.asyncio.Redis.from_pool(
        redis.asyncio.ConnectionPool(
            connection_class=connection_class, max_connections=pool_size, **kwargs
        )
    )


def sync_twin(client: Any) -> redis.Redis:
    """A blocking client to the same server as the ``redis.asyncio`` *client* (for
    renewals); a ``RedisCluster`` on the asyncio client's startup nodes for a cluster."""
    import redis.asyncio
    import redis.connection as sconn

    if isinstance(client, redis.asyncio.RedisCluster):
        nodes = list(client.nodes_manager.startup_nodes.values())
        return redis.cluster.RedisCluster(  # type: ignore[return-value]
            startup_nodes=[
                redis.cluster.ClusterNode(n.host, n.port)  # type: ignore[no-untyped-call]
                for n in nodes
            ],
            **_cluster_twin_kwargs(nodes[0], redis.cluster.RedisCluster),
        )
    pool = client.connection_pool
    kwargs = _twin_kwargs(dict(pool.connection_kwargs))
    connection_class = _twin_connection_class(pool, sconn, kwargs)
    return redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=connection_class, **kwargs)
    )


def _cluster_twin_kwargs(pool: Any, cluster_class: type) -> dict[str, Any]:
    """The connection settings of a cluster node's *pool* (or asyncio ``ClusterNode``)
    that *cluster_class* takes: no address, database or socket path; ``ssl`` for TLS."""
    kwargs = _twin_kwargs(dict(pool.connection_kwargs))
    for key in ("host", "port", "path", "db"):
        kwargs.pop(key, None)
    if pool.connection_class.__name__ == "SSLConnection":
        kwargs["ssl"] = True
    params = inspect.signature(cluster_class).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return kwargs
