"""django-valkey's caches: refused as a lock client with a message that says what to
do, and the configuration docs/settings.md#valkey recommends (django-valkey for the
cache, REDISLOCK_URL for the locks, one server) works. Against the real test server."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redislock import LockManager
from django_redislock.checks import check_settings

pytest.importorskip("django_valkey", reason="needs django-valkey")


def _caches() -> dict[str, dict[str, str]]:
    return {
        **settings.CACHES,
        "valkey": {
            "BACKEND": "django_valkey.cache.ValkeyCache",
            "LOCATION": settings.REDIS_URL.replace("redis://", "valkey://", 1),
        },
    }


def test_a_django_valkey_cache_is_refused_with_what_to_do() -> None:
    with override_settings(CACHES=_caches(), REDISLOCK_CACHE="valkey"):
        messages = check_settings()
        assert [m.id for m in messages] == ["django_redislock.E001"]
        assert "django-valkey" in messages[0].msg and "REDISLOCK_URL" in messages[0].msg
        with pytest.raises(ImproperlyConfigured, match="valkey-py"):
            LockManager("valkey").lock("x").acquire()


def test_django_valkey_for_the_cache_and_redislock_url_for_the_locks() -> None:
    url = f"{settings.REDIS_URL}?socket_timeout=5"
    with override_settings(CACHES=_caches(), REDISLOCK_CACHE="valkey", REDISLOCK_URL=url):
        assert check_settings() == []
        caches["valkey"].set("shared", "by the cache")
        with LockManager(url=url).lock("valkey:report") as held:
            assert held.fencing_token >= 1
        assert caches["valkey"].get("shared") == "by the cache"
