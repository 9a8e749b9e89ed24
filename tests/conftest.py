"""Shared fixtures: a clean Redis per test, and lock managers over both cache backends."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from django_redislock import LockManager
from django_redislock.engine.watchdog import watchdog
from tests.postgres_server import PostgresServer, postgres_binaries
from tests.redis_server import RedisServer, redis_server_binary, server_version
from tests.tcp_proxy import TcpProxy


def pytest_report_header(config: pytest.Config) -> str:
    """Name the Redis this run tests on (a matrix cell picks it, see noxfile.py)."""
    return f"redis-server: {server_version(settings.REDIS_URL)} ({redis_server_binary()})"


@pytest.fixture
def redis_client() -> redis.Redis:
    """A plain client on the test server (not the one under test)."""
    return redis.Redis.from_url(settings.REDIS_URL)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client: redis.Redis) -> Iterator[None]:
    redis_client.flushdb()
    yield


@pytest.fixture(autouse=True)
def _forget_left_holds() -> Iterator[None]:
    """Stop renewing the holds a test left behind, so that none outlives it in the
    process's watchdog.

    A Lock still held when its test ended (kept alive by a reference cycle until
    the garbage collector runs, by a thread, or on purpose), on a Redis the test
    has stopped, is retried by the process-wide watchdog until its lease is over
    (29 s of the default 30 s) -- into later tests, which then see the watchdog
    busy (tests/test_watchdog.py). Forgotten here, its lease runs out in Redis."""
    before = set(watchdog.entries())
    yield
    for entry in watchdog.entries():
        if entry not in before:
            watchdog.unwatch(entry)


@pytest.fixture(params=["default", "djredis"], ids=["django-cache", "django-redis"])
def manager(request: pytest.FixtureRequest) -> LockManager:
    """A LockManager on Django's built-in RedisCache, then on django-redis."""
    return LockManager(request.param)


@pytest.fixture
def name() -> str:
    """A lock name unique to the test."""
    return f"test:{uuid.uuid4().hex[:12]}"


@pytest.fixture
def masters() -> Iterator[list[RedisServer]]:
    """Three independent redis-server masters (a Redlock's), stopped after the test."""
    servers = [RedisServer() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster of the test module's own, on loopback (skipped without
    PostgreSQL's binaries or the psycopg driver)."""
    bindir = postgres_binaries()
    if bindir is None:
        pytest.skip(
            "PostgreSQL's initdb and postgres are not installed (apt-get install postgresql)"
        )
    pytest.importorskip("psycopg", reason="the psycopg driver is in the test group")
    server = PostgresServer(bindir)
    yield server
    server.stop()


@pytest.fixture
def counting_proxy(redis_client: redis.Redis) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the test server; its ``requests`` counts the request
    bursts clients send through it (the round trips they start: a pipeline is one)."""
    proxy = TcpProxy(redis_client.connection_pool.connection_kwargs["port"])
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def proxy(counting_proxy: TcpProxy) -> TcpProxy:
    """A TCP proxy in front of the test server, which the test sets down, blackholes,
    slows or makes lose replies (tests/tcp_proxy.py)."""
    return counting_proxy


@pytest.fixture
def counted(counting_proxy: TcpProxy) -> LockManager:
    """A manager whose every call goes through ``counting_proxy``."""
    return LockManager(url=f"{counting_proxy.url}?socket_timeout=10")
