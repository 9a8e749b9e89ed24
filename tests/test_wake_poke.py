"""A message with a nonce and no fence pokes the waiter (it looks again) instead of granting.

Backends without a queue (Redlock) free a lock without handing it to anyone; they
wake the waiters this way. Both hubs, on a real Redis.
"""

from __future__ import annotations

import asyncio
import threading
import time

import redis
import redis.asyncio
from django.conf import settings

from django_redislock.engine.awakeup import AsyncWakeHub
from django_redislock.engine.wakeup import WakeHub


def test_sync_hub_pokes_a_registered_waiter_and_ignores_unknown_nonces() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    hub = WakeHub(client, "poketest:wake:")
    hub.start()
    hub.wait_ready()
    waiter = hub.register("n1")
    try:
        client.publish(hub.channel, "someone-else")  # not registered: dropped, no grant kept
        threading.Timer(0.05, client.publish, (hub.channel, "n1")).start()
        started = time.monotonic()
        assert hub.wait(waiter, 5.0) is None
        assert time.monotonic() - started < 2.0, "the poke did not wake the waiter"
    finally:
        hub.unregister("n1")
    late = hub.register("someone-else")
    try:
        assert hub.wait(late, 0.05) is None  # no early grant was kept for the poke
    finally:
        hub.unregister("someone-else")


def test_async_hub_pokes_a_registered_waiter() -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        hub = AsyncWakeHub(client, "poketest:wake:")
        hub.start()
        await hub.wait_ready()
        waiter = hub.register("n1")
        try:
            asyncio.get_running_loop().call_later(
                0.05, lambda: asyncio.ensure_future(client.publish(hub.channel, "n1"))
            )
            started = time.monotonic()
            assert await hub.wait(waiter, 5.0) is None
            assert time.monotonic() - started < 2.0, "the poke did not wake the waiter"
        finally:
            hub.unregister("n1")
            await hub.aclose()
            await client.aclose()

    asyncio.run(scenario())
