"""Redis and Valkey as managed services run them: CONFIG refused, evicting policies,
scripting unavailable, redis-py's multi-database failover client.

Every server here is a real redis-server configured the way the case needs,
through a config file it includes (``rename-command CONFIG ""``,
``maxmemory-policy volatile-lru``): ElastiCache refuses ``CONFIG`` and, like
Memorystore, defaults to ``volatile-lru``. No Lua-less Valkey can be had here
(Valkey 9.1 moves Lua into a module), so a server that refuses scripts is one
whose ``EVAL``, ``EVALSHA`` and ``SCRIPT`` commands are renamed away: the
package sees an error reply to its first script either way.
"""

from __future__ import annotations

import asyncio
import importlib.util
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_redislock import LockBackendError, LockManager, locks
from django_redislock.checks import check_server
from django_redislock.engine.backends.base import scripting_refused
from django_redislock.exceptions import ScriptingUnavailable
from tests.redis_server import RedisServer, free_port

NO_CONFIG = 'rename-command CONFIG ""'
NO_SCRIPTS = 'rename-command EVAL ""\nrename-command EVALSHA ""\nrename-command SCRIPT ""'


def _ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [m.id for m in messages]


@pytest.fixture(scope="module")
def start() -> Iterator:
    """Start a redis-server that includes a config file with the given lines."""
    servers: list[RedisServer] = []
    directory = tempfile.TemporaryDirectory(prefix="redislock-conf-")

    def start(*lines: str) -> str:
        conf = Path(directory.name) / f"{len(servers)}.conf"
        conf.write_text("\n".join(lines) + "\n")
        servers.append(RedisServer("--include", str(conf)))
        return f"{servers[-1].url}?socket_timeout=5"

    yield start
    for server in servers:
        server.stop()
    directory.cleanup()


# -- W002: the eviction policy, read from INFO where CONFIG is refused --------------


@pytest.mark.parametrize(
    "policy", ["volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl", "allkeys-lru"]
)
def test_an_evicting_policy_is_a_warning_when_config_is_refused(start, policy: str) -> None:
    url = start(NO_CONFIG, "maxmemory 64mb", f"maxmemory-policy {policy}")
    with pytest.raises(redis.ResponseError, match="unknown command"):
        redis.Redis.from_url(url).config_get("maxmemory*")  # as ElastiCache answers
    with override_settings(REDISLOCK_URL=url):
        messages = check_server(databases=["default"])
    assert _ids(messages) == ["django_redislock.W002"]
    assert policy in messages[0].msg


def test_no_eviction_is_no_warning_when_config_is_refused(start) -> None:
    url = start(NO_CONFIG, "maxmemory 64mb", "maxmemory-policy noeviction")
    with override_settings(REDISLOCK_URL=url):
        assert check_server(databases=["default"]) == []


def test_the_default_managed_policy_warns_through_the_check_command(start) -> None:
    """What an operator runs (docs/settings.md): the server checks are database-tagged."""
    url = start(NO_CONFIG, "maxmemory 64mb", "maxmemory-policy volatile-lru")
    with override_settings(REDISLOCK_URL=url):
        with pytest.raises(SystemCheckError, match="W002"):
            call_command("check", "--database", "default", "--fail-level", "WARNING")
        call_command("check", "--fail-level", "WARNING")  # without --database: not run


# -- E006 and ScriptingUnavailable: a server that refuses scripts --------------------


def test_a_server_that_refuses_scripts_is_an_error_of_the_check(start) -> None:
    url = start(NO_SCRIPTS)
    with override_settings(REDISLOCK_URL=url):
        messages = check_server(databases=["default"])
    assert _ids(messages) == ["django_redislock.E006"]
    assert "Lua" in messages[0].msg and "EVALSHA" in messages[0].msg
    assert "module" in messages[0].hint


def test_a_server_that_refuses_scripts_fails_the_first_lock_call_clearly(start) -> None:
    manager = LockManager(url=start(NO_SCRIPTS))
    with pytest.raises(ScriptingUnavailable, match="Lua scripts") as raised:
        manager.lock("managed:first").acquire(blocking=False)
    assert isinstance(raised.value, LockBackendError)  # a view's 503 still catches it
    assert "Valkey" in str(raised.value) and "loadmodule" in str(raised.value)
    assert isinstance(raised.value.__cause__, redis.ResponseError)
    with pytest.raises(ScriptingUnavailable):
        manager.semaphore("managed:sem", limit=2).acquire(blocking=False)
    with pytest.raises(ScriptingUnavailable):
        manager.force_release("managed:first")


def test_a_server_that_refuses_scripts_fails_the_first_async_lock_call_clearly(start) -> None:
    manager = LockManager(url=start(NO_SCRIPTS))

    async def first_call() -> None:
        try:
            await manager.lock("managed:async").aacquire(blocking=False)
        finally:
            await manager.source.abackend().aclose()

    with pytest.raises(ScriptingUnavailable, match="Lua scripts"):
        asyncio.run(first_call())


def test_a_redlock_master_that_refuses_scripts_is_named_by_the_check(start) -> None:
    urls = [start(), start(NO_SCRIPTS), start()]
    with override_settings(REDISLOCK_REDLOCK_CACHES=urls):
        messages = [
            m for m in check_server(databases=["default"]) if m.id == "django_redislock.E006"
        ]
    assert len(messages) == 1
    assert "#2" in messages[0].msg


def test_a_server_that_runs_scripts_passes(start) -> None:
    with override_settings(REDISLOCK_URL=start()):
        assert check_server(databases=["default"]) == []


@pytest.mark.parametrize(
    "reply",
    [
        "ERR unknown command 'evalsha', with args beginning with: 'abc' '1' 'k' ",
        "ERR unknown command `EVAL`, with args beginning with: ",
        "ERR unknown command 'script|load'",
        # Valkey 9.1 without its Lua module (src/eval.c; SCRIPT LOAD and EVAL answer it)
        "Could not find scripting engine 'LUA'",
        "NOPERM User app has no permissions to run the 'evalsha' command",
    ],
)
def test_scripting_refusals_are_told_apart(reply: str) -> None:
    assert scripting_refused(redis.ResponseError(reply))


@pytest.mark.parametrize(
    "reply",
    [
        "ERR unknown command 'foo', with args beginning with: 'eval' ",
        "ERR Error running script (call to f_1): @user_script:1: ERR unknown command",
        "OOM command not allowed when used memory > 'maxmemory'.",
    ],
)
def test_other_errors_are_not_scripting_refusals(reply: str) -> None:
    assert not scripting_refused(redis.ResponseError(reply))


# -- redis-py's multi-database failover client --------------------------------------

HAS_MULTIDB = importlib.util.find_spec("redis.multidb") is not None
#: redis-py says so each time one is made.
EXPERIMENTAL = "ignore:MultiDBClient is an experimental:UserWarning"


def _multidb_client(flavour: str) -> object:
    """A redis-py MultiDBClient over two servers (made without connecting)."""
    if not HAS_MULTIDB:
        pytest.skip(f"redis-py {redis.__version__} has no multi-database client (redis.multidb)")
    if importlib.util.find_spec("pybreaker") is None:
        pytest.skip("redis-py's MultiDBClient needs pybreaker (redis[circuit-breaker])")
    if flavour == "async":
        from redis.asyncio.multidb.client import MultiDBClient
        from redis.asyncio.multidb.config import DatabaseConfig, MultiDbConfig
    else:
        from redis.multidb.client import MultiDBClient  # type: ignore[assignment]
        from redis.multidb.config import DatabaseConfig, MultiDbConfig  # type: ignore[assignment]
    urls = [f"redis://127.0.0.1:{free_port()}/0" for _ in range(2)]
    config = MultiDbConfig(
        databases_config=[
            DatabaseConfig(from_url=url, weight=1.0 - i / 2) for i, url in enumerate(urls)
        ]
    )
    return MultiDBClient(config)


@pytest.mark.filterwarnings(EXPERIMENTAL)
def test_a_multidb_client_is_refused() -> None:
    client = _multidb_client("sync")
    with pytest.raises(ImproperlyConfigured, match="MultiDBClient") as raised:
        LockManager(client=client).lock("managed:multi").acquire(blocking=False)
    assert "failover" in str(raised.value)


@pytest.mark.filterwarnings(EXPERIMENTAL)
def test_an_async_multidb_client_is_refused() -> None:
    client = _multidb_client("async")
    with pytest.raises(ImproperlyConfigured, match="MultiDBClient"):
        LockManager(async_client=client)


class PoolMultiDBClient:
    """django-redis's ``REDIS_CLIENT_CLASS`` hook, which calls the class with a
    ``connection_pool``: a redis-py MultiDBClient over that pool and a second database."""

    def __new__(cls, connection_pool: object, **kwargs: object) -> object:
        from redis.multidb.client import MultiDBClient
        from redis.multidb.config import DatabaseConfig, MultiDbConfig

        second = f"redis://127.0.0.1:{free_port()}/0"
        databases = [DatabaseConfig(from_pool=connection_pool), DatabaseConfig(from_url=second)]
        return MultiDBClient(MultiDbConfig(databases_config=databases))


@pytest.mark.filterwarnings(EXPERIMENTAL)
def test_a_cache_whose_client_is_a_multidb_client_is_refused() -> None:
    _multidb_client("sync")  # skips where there is none
    from django.conf import settings

    caches = {
        **settings.CACHES,
        "multidb": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": settings.REDIS_URL,
            "OPTIONS": {"REDIS_CLIENT_CLASS": f"{__name__}.PoolMultiDBClient"},
        },
    }
    with override_settings(CACHES=caches, REDISLOCK_CACHE="multidb"):
        with pytest.raises(ImproperlyConfigured, match="MultiDBClient"):
            locks.lock("managed:multi").acquire(blocking=False)
