"""Cache backends recognised by class: django-prometheus's instrumented subclasses
of django-redis's and Django's RedisCache lock on the suite's real Redis."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redislock import LockManager
from django_redislock.client.connection import client_for_cache

pytest.importorskip("django_prometheus")

PROMETHEUS_CACHES = {
    **settings.CACHES,
    "prom_djredis": {
        "BACKEND": "django_prometheus.cache.backends.redis.RedisCache",
        "LOCATION": settings.REDIS_URL,
    },
    "prom_native": {
        "BACKEND": "django_prometheus.cache.backends.redis.NativeRedisCache",
        "LOCATION": settings.REDIS_URL,
    },
    "shards": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": [settings.REDIS_URL],
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.ShardClient"},
    },
}


@pytest.mark.parametrize("alias", ["prom_djredis", "prom_native"])
def test_django_prometheus_backends_lock_on_their_redis(
    alias: str, name: str, redis_client: redis.Redis
) -> None:
    with override_settings(CACHES=PROMETHEUS_CACHES):
        client = client_for_cache(alias)
        assert client.ping()
        locks = LockManager(alias)
        first = locks.lock(name, ttl=5)
        second = locks.lock(name, ttl=5, owner="someone-else")
        with first:
            assert first.locked()
            assert redis_client.exists(first.key)  # in the suite's Redis, under the usual key
            assert second.acquire(blocking=False) is False
        assert second.acquire(blocking=False) is True
        second.release()


def test_shard_client_is_still_refused() -> None:
    with override_settings(CACHES=PROMETHEUS_CACHES):
        with pytest.raises(ImproperlyConfigured, match="ShardClient"):
            client_for_cache("shards")


def test_a_cache_that_is_not_redis_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="not a Redis cache"):
        client_for_cache("locmem")
