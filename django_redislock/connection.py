"""Finding the Redis client to lock with.

By default the client comes from a Django cache alias (``REDISLOCK_CACHE``),
reusing that cache's connection pool and always its *write* connection (locks
must never be read from a replica). Supported cache backends:

* ``django_redis.cache.RedisCache`` (default and Sentinel clients), through
  ``django_redis.get_redis_connection(alias, write=True)``;
* Django's own ``django.core.cache.backends.redis.RedisCache`` (Django >= 4.0),
  through its client's ``get_client(write=True)``.

``REDISLOCK_URL`` (a ``redis://`` / ``rediss://`` / ``unix://`` URL) overrides
the cache alias.
"""

from __future__ import annotations

from typing import Any

import redis
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from .conf import get_setting

DJANGO_REDIS_BACKEND = "django.core.cache.backends.redis.RedisCache"


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
    """Return the write Redis client of the Django cache *alias*, or raise ImproperlyConfigured."""
    backend = describe_backend(alias)
    cache: Any = caches[alias]
    if backend == DJANGO_REDIS_BACKEND or isinstance(
        getattr(cache, "_cache", None), _django_client_class()
    ):
        return cache._cache.get_client(None, write=True)  # type: ignore[no-any-return]
    client = getattr(cache, "client", None)
    if client is not None and type(cache).__module__.startswith("django_redis"):
        if type(client).__name__ == "ShardClient":
            raise ImproperlyConfigured(
                f"cache {alias!r} uses django-redis's ShardClient; a lock must live on one "
                "server: point REDISLOCK_CACHE at a cache with a single master"
            )
        return client.get_client(write=True)  # type: ignore[no-any-return]
    raise ImproperlyConfigured(
        f"cache {alias!r} uses {backend}, which is not a Redis cache; set REDISLOCK_CACHE "
        "to a django-redis or django.core.cache.backends.redis.RedisCache alias, or set "
        "REDISLOCK_URL"
    )


def _django_client_class() -> type:
    try:
        from django.core.cache.backends.redis import RedisCacheClient
    except ImportError:  # pragma: no cover - Django < 4.0 is not supported anyway
        return type(None)
    return RedisCacheClient


_url_clients: dict[str, redis.Redis] = {}


def client_for_url(url: str) -> redis.Redis:
    """Return a (process-wide, cached) client for a Redis URL."""
    client = _url_clients.get(url)
    if client is None:
        client = _url_clients.setdefault(url, redis.Redis.from_url(url))
    return client


def resolve_client(cache_alias: str | None = None, url: str | None = None) -> redis.Redis:
    """The client for an explicit alias/URL, else for ``REDISLOCK_URL`` / ``REDISLOCK_CACHE``."""
    if url is None and cache_alias is None:
        url = get_setting("REDISLOCK_URL")
    if url:
        return client_for_url(url)
    return client_for_cache(cache_alias or get_setting("REDISLOCK_CACHE"))
