"""django-redis's Sentinel client, against a real redis-server in sentinel mode."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.core.cache import caches
from django.test import override_settings

from django_redislock import LockManager
from tests.redis_server import RedisServer, free_port, redis_server_binary

SERVICE = "locksmaster"


@pytest.fixture(scope="module")
def sentinel_setup() -> Iterator[tuple[RedisServer, int]]:
    """A master and one sentinel monitoring it, both on loopback."""
    master = RedisServer()
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="redislock-sentinel-"))
    conf = workdir / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 5000\n"
    )
    process = subprocess.Popen(
        [redis_server_binary(), str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sentinel = redis.Redis(port=port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                if sentinel.sentinel_get_master_addr_by_name(SERVICE):
                    break
            except redis.RedisError:
                pass
            assert time.monotonic() < deadline, "sentinel did not come up"
            time.sleep(0.05)
        yield master, port
    finally:
        process.terminate()
        process.wait(10)
        master.stop()


@pytest.fixture
def sentinel_cache(sentinel_setup: tuple[RedisServer, int]) -> Iterator[str]:
    master, port = sentinel_setup
    from django.conf import settings

    cache_settings = {
        **settings.CACHES,
        "sentinel": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{SERVICE}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": [("127.0.0.1", port)],
                "SOCKET_TIMEOUT": 5,
            },
        },
    }
    with override_settings(CACHES=cache_settings):
        yield "sentinel"
        caches["sentinel"].close()
    redis.Redis(port=master.port).flushdb()


def test_locks_go_to_the_master_found_by_sentinel(
    sentinel_setup: tuple[RedisServer, int], sentinel_cache: str, name: str
) -> None:
    master, _ = sentinel_setup
    manager = LockManager(sentinel_cache)
    with manager.lock(name, purpose="via sentinel") as held:
        assert redis.Redis(port=master.port).exists(held.key) == 1
        assert manager.get(name).purpose == "via sentinel"
    assert redis.Redis(port=master.port).exists(manager.backend().keyspace.keys(name).lock) == 0


def test_hand_off_through_a_sentinel_managed_pool(sentinel_cache: str, name: str) -> None:
    manager = LockManager(sentinel_cache)
    holder = manager.lock(name, owner="holder")
    holder.acquire()
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(manager.lock(name).acquire(timeout=10)))
    thread.start()
    queue_key = manager.backend().keyspace.keys(name).queue
    deadline = time.monotonic() + 5
    while manager.client.llen(queue_key) < 1:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.005)
    holder.release()
    thread.join(10)
    assert got == [True]
    assert manager.get(name).owner != "holder"


def test_async_locks_use_the_master_found_by_sentinel(
    sentinel_setup: tuple[RedisServer, int], sentinel_cache: str, name: str
) -> None:
    master, _ = sentinel_setup
    manager = LockManager(sentinel_cache)
    direct = redis.Redis(port=master.port)

    async def scenario() -> None:
        holder = manager.lock(name, owner="holder")
        assert await holder.aacquire()
        assert direct.exists(holder.key) == 1
        waiter = manager.lock(name)
        task = asyncio.ensure_future(waiter.aacquire(timeout=10))
        queue_key = manager.backend().keyspace.keys(name).queue
        deadline = time.monotonic() + 5
        while direct.llen(queue_key) < 1:
            assert time.monotonic() < deadline, "the async waiter never queued"
            await asyncio.sleep(0.005)
        await holder.arelease()
        assert await asyncio.wait_for(task, 10) is True
        assert (await manager.aget(name)).owner not in (None, "holder")

    asyncio.run(scenario())
