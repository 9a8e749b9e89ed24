"""System checks and backend resolution from settings."""

from __future__ import annotations

import io

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings

from django_redislock import LockManager, locks
from django_redislock.checks import check_server, check_settings
from tests.redis_server import free_port


def _ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_default_settings_pass() -> None:
    assert check_settings() == []
    assert check_server(databases=["default"]) == []


@override_settings(REDISLOCK_CACHE="locmem")
def test_non_redis_cache_is_an_error_not_a_crash() -> None:
    assert _ids(check_settings()) == ["django_redislock.E001"]
    assert "LocMemCache" in check_settings()[0].msg
    with pytest.raises(ImproperlyConfigured, match="not a Redis cache"):
        locks.lock("x").acquire()


@override_settings(REDISLOCK_CACHE="missing")
def test_unknown_cache_alias_is_an_error() -> None:
    assert _ids(check_settings()) == ["django_redislock.E001"]


@override_settings(REDISLOCK_DEFAULT_TTL=-5, REDISLOCK_KEY_PREFIX="bad{prefix}")
def test_invalid_settings_are_errors() -> None:
    assert _ids(check_settings()) == ["django_redislock.E002", "django_redislock.E002"]


def test_unreachable_redis_is_a_warning() -> None:
    with override_settings(REDISLOCK_URL=f"redis://127.0.0.1:{free_port()}/0"):
        assert _ids(check_server(databases=["default"])) == ["django_redislock.W001"]


def test_the_server_checks_run_only_when_asked_for() -> None:
    """Django's convention for checks that do I/O (its own database checks): a plain
    ``manage.py check`` (or runserver) does not run them, ``--database`` does."""
    with override_settings(REDISLOCK_URL=f"redis://127.0.0.1:{free_port()}/0"):
        assert check_server() == []
        assert check_server(databases=None) == []
        out = io.StringIO()
        call_command("check", "--database", "default", stderr=out)
        assert "django_redislock.W001" in out.getvalue()
        out = io.StringIO()
        call_command("check", stderr=out)
        assert "django_redislock.W001" not in out.getvalue()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl", "allkeys-lfu"])
def test_evicting_maxmemory_policy_is_a_warning(redis_client, policy: str) -> None:
    old = redis_client.config_get("maxmemory*")
    try:
        redis_client.config_set("maxmemory", "512mb")
        redis_client.config_set("maxmemory-policy", policy)
        messages = check_server(databases=["default"])
        assert _ids(messages) == ["django_redislock.W002"]
        assert policy in messages[0].msg
        redis_client.config_set("maxmemory-policy", "noeviction")
        assert check_server(databases=["default"]) == []
    finally:
        redis_client.config_set("maxmemory", old["maxmemory"])
        redis_client.config_set("maxmemory-policy", old["maxmemory-policy"])


def test_settings_switch_backend_lazily(name: str, redis_client) -> None:
    with override_settings(REDISLOCK_CACHE="djredis", REDISLOCK_KEY_PREFIX="other"):
        with locks.lock(name):
            assert redis_client.exists(f"other:{{{name}}}") == 1
    with locks.lock(name):
        assert redis_client.exists(f"redislock:{{{name}}}") == 1


def test_url_setting_overrides_cache(name: str, redis_client) -> None:
    from django.conf import settings

    with override_settings(REDISLOCK_CACHE="locmem", REDISLOCK_URL=settings.REDIS_URL):
        with locks.lock(name):
            assert redis_client.exists(f"redislock:{{{name}}}") == 1


def test_both_backends_share_locks(name: str) -> None:
    builtin, djredis = LockManager("default"), LockManager("djredis")
    with builtin.lock(name, owner="a"):
        assert not djredis.lock(name, owner="b").acquire(blocking=False)
        assert djredis.get(name).owner == "a"


def test_a_lock_client_without_socket_timeout_is_a_warning(redis_client) -> None:
    port = redis_client.connection_pool.connection_kwargs["port"]
    with override_settings(REDISLOCK_URL=f"redis://127.0.0.1:{port}/0"):
        messages = check_settings()
        assert _ids(messages) == ["django_redislock.W003"]
        assert "socket timeout" in messages[0].msg
    with override_settings(REDISLOCK_URL=f"redis://127.0.0.1:{port}/0?socket_timeout=5"):
        assert check_settings() == []
