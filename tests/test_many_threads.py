"""A thousand threads (or asyncio tasks) of one process on one lock, on default pools.

redis-py 8's ``ConnectionPool`` allows 100 connections and raises ``Too many
connections`` past them instead of waiting (issue 42: 257 threads on one lock got
``LockBackendError`` from it). A waiting acquire holds no connection (the wake-up
hub's one subscription serves every waiter), and the engine's round trips in flight
on a pool are bounded below its size (engine/backends/gate.py). Each thread takes
and releases the lock once: all complete, none fails, never two hold it at once,
and the pool never lends more connections than the gate allows plus the hub's.
Sized for a 2-core machine shared with other work: the bounds are generous.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from django.conf import settings

from django_redislock import LockManager
from django_redislock.engine.backends.gate import size_for

WAITERS = 1000
#: All of them through the lock, one after another (about 1-3 s here).
BOUND = 60.0


class Holders:
    """Counts who holds the lock now (it must never be two), and who is done."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self.now = 0
        self.most = 0
        self.done = 0
        self.errors: list[BaseException] = []

    def enter(self) -> None:
        with self._mutex:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self._mutex:
            self.now -= 1
            self.done += 1

    def failed(self, exc: BaseException) -> None:
        with self._mutex:
            self.errors.append(exc)


def _connections() -> int:
    """How many clients the test server has (this worker's own server: this process's
    connections, which a pool keeps open once made)."""
    observer = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10)
    try:
        return int(observer.info("clients")["connected_clients"]) - 1  # not the observer
    finally:
        observer.close()


def _client_of(kind: str) -> tuple[LockManager, Any]:
    if kind == "plain":
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10)
        return LockManager(client=client), client
    manager = LockManager("default" if kind == "django-cache" else "djredis")
    return manager, manager.client


@pytest.mark.parametrize("kind", ["plain", "django-cache", "django-redis"])
def test_a_thousand_threads_take_one_lock_in_turn_on_a_default_pool(kind: str, name: str) -> None:
    manager, client = _client_of(kind)
    pool = client.connection_pool
    # redis-py 8's default, which ran out (2**31 before 8: no limit, the gate's 64 then)
    assert pool.max_connections in (100, 2**31)
    holders = Holders()
    start = threading.Barrier(WAITERS + 1)
    before = _connections()

    def run() -> None:
        try:
            start.wait(30)
            lock = manager.lock(name, ttl=30)
            assert lock.acquire(timeout=BOUND)
            holders.enter()
            time.sleep(0)  # let another thread run while this one holds the lock
            assert holders.now == 1
            holders.leave()
            lock.release()
        except BaseException as exc:  # reported below, with the others
            holders.failed(exc)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(WAITERS)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    start.wait(30)
    for thread in threads:
        thread.join(max(0.1, started + BOUND - time.monotonic()))
    elapsed = time.monotonic() - started
    assert not any(thread.is_alive() for thread in threads), f"not done in {BOUND} s"
    assert holders.errors == [], holders.errors[:3]
    assert holders.done == WAITERS
    assert holders.most == 1
    # The gate's slots (the kept connection among them) and the hub's subscription.
    assert _connections() - before <= size_for(pool) + 1
    print(f"{kind}: {WAITERS} threads through one lock in {elapsed:.2f} s")


def test_a_thousand_tasks_take_one_lock_in_turn_on_a_default_asyncio_pool(name: str) -> None:
    made: list[Any] = []

    before = _connections()

    async def main() -> tuple[int, int, list[BaseException], int]:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL, socket_timeout=10)
        made.append(client)
        assert client.connection_pool.max_connections in (100, 2**31)  # (see above)
        manager = LockManager(async_client=client)
        now = most = done = 0
        errors: list[BaseException] = []
        gate = asyncio.Event()

        async def run() -> None:
            nonlocal now, most, done
            try:
                await gate.wait()
                lock = manager.lock(name, ttl=30)
                assert await lock.aacquire(timeout=BOUND)
                now += 1
                most = max(most, now)
                await asyncio.sleep(0)  # other tasks run while this one holds it
                now -= 1
                done += 1
                await lock.arelease()
            except BaseException as exc:
                errors.append(exc)

        tasks = [asyncio.ensure_future(run()) for _ in range(WAITERS)]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
        lent = _connections() - before
        await client.aclose()
        return most, done, errors, lent

    started = time.monotonic()
    most, done, errors, lent = asyncio.run(main())
    assert errors == [], errors[:3]
    assert done == WAITERS
    assert most == 1
    assert lent <= size_for(made[0].connection_pool) + 1
    print(f"asyncio: {WAITERS} tasks through one lock in {time.monotonic() - started:.2f} s")


def _burst(size: int, call: Callable[[], Any]) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(size)

    def run() -> None:
        try:
            start.wait(30)
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND)
    return errors


def test_a_burst_of_one_attempts_on_a_small_pool_waits_for_connections(name: str) -> None:
    """300 threads try once at the same moment on a pool of 8 connections: each
    waits for a slot rather than meeting ``Too many connections``."""
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10, max_connections=8)
    before = _connections()
    manager = LockManager(client=client)
    names = [f"{name}:{i}" for i in range(300)]
    index = iter(range(300))
    picked = threading.Lock()

    def one() -> None:
        with picked:
            mine = names[next(index)]
        lock = manager.lock(mine, ttl=30, auto_renew=False)
        assert lock.acquire(blocking=False)
        lock.release()

    assert _burst(300, one) == []
    assert size_for(client.connection_pool) == 4
    assert _connections() - before <= 4


def test_a_wait_takes_its_hand_off_so_a_later_wait_does_not_return_it_again() -> None:
    """A claim that finds a hand-off lapsed queues the wait again: its next park must
    wait for a new hand-off, not return the dead one at once."""
    from django_redislock.engine.wakeup import WakeHub

    hub = WakeHub(redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10), "t:wake:")
    waiter = hub.register("n1")
    waiter.deliver(41)
    assert hub.wait(waiter, 1.0) == 41
    started = time.monotonic()
    assert hub.wait(waiter, 0.2) is None
    assert time.monotonic() - started >= 0.19
    hub.unregister("n1")
