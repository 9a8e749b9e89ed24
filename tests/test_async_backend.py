"""The asyncio backend: one client per event loop, made from the blocking one's settings."""

from __future__ import annotations

import asyncio
import time

import redis
import redis.asyncio

from django_redislock import LockManager


def _connections(redis_client: redis.Redis, marker: str) -> int:
    return sum(1 for c in redis_client.client_list() if c.get("name") == marker)


def test_each_event_loop_gets_its_own_client_closed_with_the_loop(
    redis_client: redis.Redis, name: str
) -> None:
    marker = f"redislock-test-{name.split(':')[1]}"
    url = redis_client.connection_pool.connection_kwargs
    sync_client = redis.Redis(host=url["host"], port=url["port"], client_name=marker)
    manager = LockManager(client=sync_client)
    clients = []

    async def contended_round() -> None:
        holder = manager.lock(name, owner="holder", ttl=5)
        assert await holder.aacquire()
        waiter = asyncio.ensure_future(manager.lock(name).aacquire(timeout=5))
        await asyncio.sleep(0.05)  # the waiter queues and its hub subscribes
        await holder.arelease()
        assert await waiter
        clients.append(manager.source.abackend().client)
        await manager.lock(name).arelease()
        assert _connections(redis_client, marker) >= 2, "acquire and pub/sub connections"

    for _ in range(3):
        asyncio.run(contended_round())
        pool = sync_client.connection_pool  # the watchdog's blocking connections stay
        blocking = len(pool._available_connections) + len(pool._in_use_connections)
        deadline = time.monotonic() + 5
        while _connections(redis_client, marker) > blocking:
            assert time.monotonic() < deadline, "the loop's connections outlived it"
            time.sleep(0.01)
    assert len({id(c) for c in clients}) == 3, "one asyncio client per event loop"
    assert all(isinstance(c, redis.asyncio.Redis) for c in clients)


def test_the_asyncio_twin_keeps_the_connection_settings(redis_client: redis.Redis) -> None:
    kwargs = redis_client.connection_pool.connection_kwargs
    sync_client = redis.Redis(
        host=kwargs["host"], port=kwargs["port"], db=3, socket_timeout=2.5, client_name="twin"
    )
    manager = LockManager(client=sync_client)

    async def inspect() -> dict:
        return dict(manager.source.abackend().client.connection_pool.connection_kwargs)

    twin = asyncio.run(inspect())
    assert (twin["host"], twin["port"], twin["db"]) == (kwargs["host"], kwargs["port"], 3)
    assert twin["socket_timeout"] == 2.5 and twin["client_name"] == "twin"


def test_an_explicit_asyncio_client_is_used_and_renewals_get_a_blocking_twin(
    redis_client: redis.Redis, name: str
) -> None:
    kwargs = redis_client.connection_pool.connection_kwargs

    async def scenario() -> None:
        aclient = redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"])
        manager = LockManager(async_client=aclient)
        assert manager.source.abackend().client is aclient
        async with manager.lock(name, ttl=1) as held:
            await asyncio.sleep(1.5)  # longer than the lease: the watchdog renews it
            assert (await manager.aget(name)).fencing_token == held.fencing_token
        assert isinstance(manager.backend().client, redis.Redis)
        await aclient.aclose()

    asyncio.run(scenario())
