"""The lock client's text encoding: the engine keeps keys and records in UTF-8.

redis-py encodes the text it sends with its client's ``encoding``; the engine
writes its keys as UTF-8 bytes. A client with another encoding would take
``"café"`` under one key and look it up under another, so such a client is
refused with a clear message (and ``django_redislock.E007``), and a UTF-8 client,
with ``decode_responses`` or without, sees non-ASCII names whole.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redislock import LockManager, locks
from django_redislock.checks import check_settings

NAMES = ["café", "日本:レポート", "plain"]


def _url(redis_client: redis.Redis, query: str = "") -> str:
    kwargs = redis_client.connection_pool.connection_kwargs
    return f"redis://127.0.0.1:{kwargs['port']}/0?socket_timeout=5{query}"


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16", "cp1252", "no-such-codec"])
def test_a_client_with_another_encoding_is_refused(redis_client, encoding: str) -> None:
    client = redis.Redis.from_url(_url(redis_client), encoding=encoding)
    with pytest.raises(ImproperlyConfigured, match="UTF-8") as raised:
        LockManager(client=client)
    message = str(raised.value)
    assert "client=" in message and repr(encoding) in message
    assert "encoding='utf-8'" in message
    aclient = redis.asyncio.Redis.from_url(_url(redis_client), encoding=encoding)
    with pytest.raises(ImproperlyConfigured, match="async_client="):
        LockManager(async_client=aclient)
    asyncio.run(aclient.aclose() if hasattr(aclient, "aclose") else aclient.close())
    client.close()


def test_an_encoding_in_the_url_is_error_e007_and_refused_on_use(redis_client) -> None:
    with override_settings(REDISLOCK_URL=_url(redis_client, "&encoding=latin-1")):
        messages = check_settings()
        assert [m.id for m in messages] == ["django_redislock.E007"]
        assert "'latin-1'" in messages[0].msg and "UTF-8" in messages[0].msg
        with pytest.raises(ImproperlyConfigured, match="Redis URL encodes text as 'latin-1'"):
            locks.lock("encoding:refused").acquire(blocking=False)
    assert redis_client.keys("*encoding:refused*") == []  # nothing was written


def test_a_cache_alias_with_another_encoding_is_error_e007(redis_client, settings) -> None:
    caches = {
        **settings.CACHES,
        "latin": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": _url(redis_client),
            "OPTIONS": {"encoding": "latin-1"},
        },
    }
    with override_settings(CACHES=caches, REDISLOCK_CACHE="latin"):
        messages = check_settings()
        assert [m.id for m in messages] == ["django_redislock.E007"]
        assert "cache 'latin'" in messages[0].msg
        with pytest.raises(ImproperlyConfigured, match="cache 'latin' encodes text"):
            locks.lock("encoding:alias").acquire(blocking=False)


def test_a_redlock_master_with_another_encoding_is_refused(redis_client) -> None:
    masters = [_url(redis_client), _url(redis_client, "&encoding=latin-1"), _url(redis_client)]
    with override_settings(REDISLOCK_REDLOCK_CACHES=masters):
        assert [m.id for m in check_settings()] == ["django_redislock.E007"]
        with pytest.raises(ImproperlyConfigured, match="Redlock master #2 encodes text"):
            locks.lock("encoding:redlock").acquire(blocking=False)


@pytest.mark.parametrize("spelling", ["utf-8", "UTF8", "utf_8"])
@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
def test_a_utf8_client_sees_non_ascii_names_whole(redis_client, spelling, decode) -> None:
    client = redis.Redis.from_url(_url(redis_client), encoding=spelling, decode_responses=decode)
    manager = LockManager(client=client)
    held = [manager.lock(name, ttl=30, owner=f"o-{name}") for name in NAMES]
    for lock in held:
        assert lock.acquire(blocking=False)
    try:
        for name in NAMES:
            info = manager.get(name)
            assert info is not None and info.name == name and info.owner == f"o-{name}"
            assert not manager.lock(name, ttl=30).acquire(blocking=False)
        assert sorted(info.name for info in manager.active()) == sorted(NAMES)
        assert [i.name for i in manager.get_many(NAMES)] == NAMES
    finally:
        for lock in held:
            lock.release()
    assert list(manager.active()) == []
    client.close()
