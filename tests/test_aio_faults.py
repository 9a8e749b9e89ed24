"""Waiters across a real Redis restart: sync and asyncio, woken promptly, all served.

Each test runs its own redis-server, SIGKILLs it and starts a new one on the
same port (with an append-only file where the locks must survive).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from django_redislock import LockManager
from example_project.embedded_redis import EmbeddedRedis
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow


class Restartable:
    """A redis-server that can be SIGKILLed and started again on the same port."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.server = EmbeddedRedis(extra_args=args)
        self.server.wait_ready()
        self.port = self.server.port
        self.dir = self.server.dir

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0?socket_timeout=2&socket_connect_timeout=1"

    def restart(self) -> None:
        self.server.process.kill()
        self.server.process.wait(5)
        # The same port and data directory: an append-only file survives.
        self.server = EmbeddedRedis(self.port, extra_args=("--dir", self.dir, *self.args))
        self.server.wait_ready()

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def aof_server() -> Iterator[Restartable]:
    server = Restartable("--appendonly", "yes", "--appendfsync", "always")
    yield server
    server.stop()


@pytest.fixture
def plain_server() -> Iterator[Restartable]:
    server = Restartable()
    yield server
    server.stop()


def _until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _wake_delays(
    server: Restartable, name: str, wait: Callable[[LockManager], float]
) -> list[float]:
    """Per trial: a waiter queued behind a holder; Redis restarts (the lock and the
    queue survive in the AOF); the holder releases at once. How long after the
    release does the waiter hold the lock?"""
    manager = LockManager(url=server.url)
    holder_side = LockManager(url=server.url)
    raw = redis.Redis(port=server.port, socket_timeout=2)
    delays = []
    for trial in range(6):
        lock_name = f"{name}:{trial}"
        holder = holder_side.lock(lock_name, owner="holder")
        assert holder.acquire()
        result: list[float] = []
        waiter = threading.Thread(
            target=lambda n=lock_name, out=result: out.append(wait(manager, n))
        )
        waiter.start()
        queue = manager.backend().keyspace.keys(lock_name).queue
        _until(lambda q=queue: raw.llen(q) == 1, "the waiter never queued")
        time.sleep(0.3)  # the waiter parks on its subscription
        server.restart()
        released_at = time.monotonic()
        holder.release()  # redis-py reconnects; the hand-off is published at once
        waiter.join(15)
        assert result, "the waiter never got the lock"
        delays.append(result[0] - released_at)
    return delays


def _sync_wait(manager: LockManager, name: str) -> float:
    lock = manager.lock(name, owner=f"waiter:{name}")
    assert lock.acquire(timeout=10)
    return time.monotonic()


def _async_wait(manager: LockManager, name: str) -> float:
    async def wait() -> float:
        lock = manager.lock(name, owner=f"waiter:{name}")
        assert await lock.aacquire(timeout=10)
        return time.monotonic()

    return asyncio.run(wait())


@pytest.mark.parametrize("wait", [_sync_wait, _async_wait], ids=["sync", "async"])
def test_a_waiter_is_woken_promptly_after_redis_restarts(
    aof_server: Restartable, name: str, wait: Callable[[LockManager, str], float]
) -> None:
    """A real restart with the lock and the queue kept in the append-only file: the
    hand-off made right after it reaches the waiter at once. (A hand-off published
    while the subscription is still down is the next test's case.)"""
    delays = _wake_delays(aof_server, name, wait)
    assert statistics.median(delays) < 0.3, delays
    assert max(delays) < 1.5, delays


def test_twenty_async_waiters_are_all_served_after_a_restart(
    plain_server: Restartable, name: str
) -> None:
    manager = LockManager(url=plain_server.url)
    raw = redis.Redis(port=plain_server.port, socket_timeout=2)
    holder = manager.lock(name, owner="holder")
    assert holder.acquire()
    queue = manager.backend().keyspace.keys(name).queue

    async def scenario() -> tuple[float, list[float]]:
        acquired: list[float] = []
        inside = 0

        async def waiter() -> None:
            nonlocal inside
            async with manager.lock(name, timeout=30):
                inside += 1
                assert inside == 1, "two holders at once"
                acquired.append(time.monotonic())
                await asyncio.sleep(0.005)
                inside -= 1

        tasks = [asyncio.ensure_future(waiter()) for _ in range(20)]
        deadline = time.monotonic() + 10
        while raw.llen(queue) < 20:
            assert time.monotonic() < deadline, "the waiters never all queued"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(plain_server.restart)  # the lock and the queue are gone
        restarted = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return restarted, sorted(acquired)

    restarted, acquired = asyncio.run(scenario())
    assert len(acquired) == 20
    # None waits past its fallback poll: the first is served within about a poll
    # of the restart, and then they follow one another.
    assert acquired[0] - restarted < 1.5, acquired[0] - restarted
    assert acquired[-1] - restarted < 5.0, acquired[-1] - restarted


@pytest.mark.parametrize("wait", [_sync_wait, _async_wait], ids=["sync", "async"])
def test_a_hand_off_published_while_the_subscription_was_down_is_not_left_to_the_poll(
    name: str, redis_client: redis.Redis, wait: Callable[[LockManager, str], float]
) -> None:
    """The waiter's connection drops (proxy down) right after it parks; the holder
    releases meanwhile, so the hand-off is published to nobody; the connection comes
    back and redis-py re-subscribes on its own. The waiter must ask Redis again then,
    not sleep on until its fallback poll (0.75-1 s after it parked)."""
    upstream = redis_client.connection_pool.connection_kwargs["port"]
    proxy = TcpProxy(upstream)
    try:
        manager = LockManager(url=f"{proxy.url}?socket_timeout=2&socket_connect_timeout=1")
        direct = LockManager("default")
        delays = []
        for trial in range(4):
            lock_name = f"{name}:{trial}"
            holder = direct.lock(lock_name, owner="holder")
            assert holder.acquire()
            queue = direct.backend().keyspace.keys(lock_name).queue
            result: list[float] = []
            waiter = threading.Thread(
                target=lambda n=lock_name, out=result: out.append(wait(manager, n))
            )
            waiter.start()
            _until(lambda q=queue: redis_client.llen(q) == 1, "the waiter never queued", 5)
            time.sleep(0.05)  # parked on its subscription
            proxy.set_down(True)
            time.sleep(0.05)
            released_at = time.monotonic()
            holder.release()  # handed to the waiter; the message reaches nobody
            time.sleep(0.05)
            proxy.set_down(False)
            waiter.join(10)
            assert result, "the waiter never got the lock"
            delays.append(result[0] - released_at)
        assert statistics.median(delays) < 0.4, delays
    finally:
        proxy.close()
