"""The asyncio API on a real redis-server: the same Lock, awaited.

Each test runs its own event loop with ``asyncio.run``; waits are bounded with
``asyncio.wait_for`` or deadlines.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from asgiref.sync import sync_to_async

from django_redislock import LockError, LockLost, LockManager, LockNotAcquired, LockNotOwned
from django_redislock.exceptions import BlockingCallInEventLoop
from tests.tcp_proxy import TcpProxy


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro_fn())  # type: ignore[arg-type]


async def _until(condition: Callable[[], bool], what: str, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.002)


def test_async_with_acquires_and_releases(manager: LockManager, name: str) -> None:
    async def scenario() -> None:
        lk = manager.lock(name, purpose="async")
        async with lk as held:
            assert held is lk and lk.fencing_token is not None
            assert await lk.aowned() and await lk.alocked()
            info = await manager.aget(name)
            assert info is not None and info.purpose == "async" and info.owner == lk.owner
            assert 29 < await lk.attl() <= 30
        assert not await lk.alocked()
        assert await manager.aget(name) is None

    run(scenario)


def test_tasks_are_different_owners_and_a_task_re_enters(manager: LockManager, name: str) -> None:
    async def scenario() -> None:
        lk = manager.lock(name)
        assert await lk.aacquire()
        assert await lk.aacquire()  # the same task: re-entry
        assert (await manager.aget(name)).hold_count == 2

        async def other() -> bool:
            return await lk.aacquire(blocking=False)

        assert await asyncio.create_task(other()) is False  # another task, another owner
        assert await lk.arelease() == 1
        assert await lk.arelease() == 0
        with pytest.raises(LockNotOwned):
            await lk.arelease()

    run(scenario)


def test_an_explicit_owner_is_shared_between_tasks(manager: LockManager, name: str) -> None:
    async def scenario() -> None:
        lk = manager.lock(name, owner="job-7")
        assert await lk.aacquire()

        async def release_elsewhere() -> int:
            return await lk.arelease()

        assert await asyncio.create_task(release_elsewhere()) == 0

    run(scenario)


def test_waiting_timeouts_and_one_attempt(manager: LockManager, name: str) -> None:
    async def scenario() -> None:
        holder = manager.lock(name, owner="holder")
        assert await holder.aacquire()
        waiter = manager.lock(name)
        started = time.monotonic()
        assert await waiter.aacquire(timeout=0.3) is False
        assert 0.25 < time.monotonic() - started < 2.0
        assert await waiter.aacquire(blocking=False) is False
        assert await waiter.aacquire(blocking_timeout=0) is False
        with pytest.raises(LockNotAcquired):
            async with manager.lock(name, timeout=0.1):
                pass
        queue = manager.backend().keyspace.keys(name).queue
        assert manager.client.llen(queue) == 0, "a timed-out wait leaves the queue"
        task = asyncio.ensure_future(waiter.aacquire(timeout=5))
        await _until(lambda: manager.client.llen(queue) == 1, "the waiter never queued")
        released = time.monotonic()
        await holder.arelease()
        assert await asyncio.wait_for(task, 5)
        assert time.monotonic() - released < 0.5, "woken by the hand-off, not a poll"

    run(scenario)


def test_extend_reacquire_and_errors(manager: LockManager, name: str) -> None:
    async def scenario() -> None:
        lk = manager.lock(name, ttl=2)
        with pytest.raises(LockNotOwned):
            await lk.aextend(1)
        assert await lk.aacquire()
        assert await lk.aextend(10)
        assert 11 < await lk.attl() <= 12
        assert await lk.aextend(5, replace_ttl=True)
        assert 4 < await lk.attl() <= 5
        assert await lk.areacquire()
        assert 1.5 < await lk.attl() <= 2
        await lk.arelease()
        forever = manager.lock(name, ttl=None, no_expiry=True)
        assert await forever.aacquire()
        with pytest.raises(LockError, match="no expiry"):
            await forever.aextend(1)
        assert await forever.attl() == float("inf")
        await forever.arelease()

    run(scenario)


def test_manager_twins(manager: LockManager, name: str) -> None:
    async def scenario() -> None:
        held = [manager.lock(f"{name}:{i}", owner=f"o{i}") for i in range(3)]
        for lk in held:
            assert await lk.aacquire()
        names = sorted([info.name async for info in manager.aactive(f"{name}:")])
        assert names == [f"{name}:{i}" for i in range(3)]
        assert [i.name for i in await manager.aget_many([f"{name}:2", "nope", f"{name}:0"])] == [
            f"{name}:2",
            f"{name}:0",
        ]
        result = await manager.aforce_extend(f"{name}:0", 60)
        assert result.extended and result.ttl > 80
        assert await manager.aforce_release(f"{name}:1", owner="someone else") is False
        assert await manager.aforce_release(f"{name}:1", owner="o1") is True
        assert await manager.aget(f"{name}:1") is None

    run(scenario)


def test_fencing_tokens_increase_across_async_holders(manager: LockManager, name: str) -> None:
    async def scenario() -> list[int]:
        tokens: list[int] = []
        for _ in range(5):
            async with manager.lock(name) as held:
                tokens.append(held.fencing_token)
        return tokens

    tokens = run(scenario)
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


@pytest.mark.slow
def test_two_hundred_tasks_lose_no_update(manager: LockManager, name: str, redis_client) -> None:
    counter = f"{name}:counter"
    sections = 50

    async def scenario() -> tuple[int, int]:
        client = redis.asyncio.Redis.from_pool(
            redis.asyncio.BlockingConnectionPool(**_kwargs(redis_client), max_connections=50)
        )
        inside = 0
        overlaps = 0
        lk = manager.lock(name, timeout=120)

        async def worker() -> None:
            nonlocal inside, overlaps
            for _ in range(sections):
                async with lk:
                    inside += 1
                    overlaps += inside > 1
                    value = int(await client.get(counter) or 0)
                    await asyncio.sleep(0)
                    await client.set(counter, value + 1)
                    inside -= 1

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(200))), 240)
        total = int(await client.get(counter))
        await client.aclose()
        return total, overlaps

    total, overlaps = run(scenario)
    assert overlaps == 0
    assert total == 200 * sections, "lost updates"


def _kwargs(redis_client: redis.Redis) -> dict[str, Any]:
    kwargs = redis_client.connection_pool.connection_kwargs
    return {"host": kwargs["host"], "port": kwargs["port"], "db": kwargs.get("db", 0)}


@pytest.mark.parametrize("wrap", ["wait_for", "gather", "shield"])
def test_ownership_survives_wait_for_gather_and_shield(
    manager: LockManager, name: str, wrap: str
) -> None:
    async def scenario() -> None:
        lk = manager.lock(name)
        coro = lk.aacquire()  # the owner is the task that calls aacquire()
        if wrap == "wait_for":
            assert await asyncio.wait_for(coro, 5)
        elif wrap == "gather":
            assert (await asyncio.gather(coro)) == [True]
        else:
            assert await asyncio.shield(coro)
        assert await lk.aowned()
        assert await lk.arelease() == 0

    run(scenario)


def test_a_blocking_acquire_inside_the_event_loop_is_refused(
    manager: LockManager, name: str
) -> None:
    async def scenario() -> None:
        lk = manager.lock(name)
        with pytest.raises(BlockingCallInEventLoop, match="aacquire"):
            lk.acquire()
        with pytest.raises(BlockingCallInEventLoop):
            with lk:
                pass
        assert lk.acquire(blocking=False)  # one attempt does not wait: allowed
        lk.release()

    run(scenario)
    assert issubclass(BlockingCallInEventLoop, LockError)
    assert issubclass(BlockingCallInEventLoop, RuntimeError)


def test_a_client_of_the_wrong_kind_is_refused_at_construction(redis_client) -> None:
    async def scenario() -> None:
        aclient = redis.asyncio.Redis(**_kwargs(redis_client))
        with pytest.raises(TypeError, match="async_client="):
            LockManager(client=aclient)
        await aclient.aclose()

    run(scenario)
    with pytest.raises(TypeError, match="client="):
        LockManager(async_client=redis_client)


@pytest.mark.slow
def test_a_blocked_event_loop_does_not_lose_a_one_second_lease(
    manager: LockManager, name: str, redis_client
) -> None:
    key = manager.backend().keyspace.keys(name).lock
    seen_free: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if not redis_client.exists(key):
                seen_free.append(time.monotonic())
            time.sleep(0.01)

    async def scenario() -> None:
        async with manager.lock(name, ttl=1) as held:
            watcher = threading.Thread(target=watch)
            watcher.start()
            time.sleep(3)  # the loop is blocked: no task runs, the watchdog thread does
            stop.set()
            watcher.join(5)
            assert not held.lost

    run(scenario)
    assert seen_free == [], "the lock was free while its holder's loop was blocked"


@pytest.mark.slow
def test_sync_and_async_contenders_exclude_each_other_and_keep_fifo(
    manager: LockManager, name: str
) -> None:
    queue = manager.backend().keyspace.keys(name).queue
    order: list[str] = []
    inside = [0]
    overlaps = [0]

    def critical(who: str) -> None:
        inside[0] += 1
        overlaps[0] += inside[0] > 1
        order.append(who)
        time.sleep(0.01)
        inside[0] -= 1

    def sync_waiter(who: str) -> None:
        with manager.lock(name, timeout=30):
            critical(who)

    async def scenario() -> None:
        holder = manager.lock(name, owner="holder")
        assert await holder.aacquire()
        expected: list[str] = []
        tasks: list[asyncio.Future[Any]] = []
        threads: list[threading.Thread] = []
        for i in range(6):
            who = f"{'sync' if i % 2 else 'async'}-{i}"
            expected.append(who)
            if i % 2:
                thread = threading.Thread(target=sync_waiter, args=(who,))
                thread.start()
                threads.append(thread)
            else:

                async def async_waiter(who: str = who) -> None:
                    async with manager.lock(name, timeout=30):
                        critical(who)

                tasks.append(asyncio.ensure_future(async_waiter()))
            await _until(lambda n=i + 1: manager.client.llen(queue) == n, f"waiter {i} queued")
        await holder.arelease()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        for thread in threads:
            await asyncio.to_thread(thread.join, 30)
        assert order == expected, "served in arrival order"

    run(scenario)
    assert overlaps[0] == 0


def test_sync_to_async_gives_each_task_its_own_owner(manager: LockManager, name: str) -> None:
    """asgiref runs every task's sync code in one shared thread outside a
    ThreadSensitiveContext; a sync lock there must still tell two tasks apart."""

    async def scenario() -> list[bool]:
        lk = manager.lock(name, ttl=10)
        release = asyncio.Event()

        async def one(first: bool) -> bool:
            got = await sync_to_async(lk.acquire)(blocking=False)
            if first:
                await release.wait()
            if got:
                await sync_to_async(lk.release)()  # the same task's next call: same owner
            return bool(got)

        first = asyncio.ensure_future(one(True))
        await _until(lambda: manager.get(name) is not None, "the first task never acquired")
        second = await one(False)
        release.set()
        return [await first, second]

    assert run(scenario) == [True, False], "the second task must not re-enter the first's lock"
    assert manager.get(name) is None


def test_lost_at_exit_raises_lock_lost(manager: LockManager, name: str) -> None:
    async def scenario() -> None:
        with pytest.raises(LockLost):
            async with manager.lock(name):
                assert await manager.aforce_release(name)

    run(scenario)


@pytest.mark.slow
def test_cancelled_acquires_and_releases_leave_no_orphaned_lock(
    manager: LockManager, name: str
) -> None:
    """Cancel aacquire/arelease at random points, contended and not, many times."""
    assert _cancellation_trials(manager, name, 1000) == 1000


@pytest.mark.slow
def test_cancellations_while_replies_are_in_flight_leave_no_orphaned_lock(
    name: str, redis_client
) -> None:
    """The same through a proxy that holds every reply back 1-3 ms, so that many
    cancellations land while a script has run but its reply has not arrived."""
    proxy = TcpProxy(redis_client.connection_pool.connection_kwargs["port"])
    try:
        proxy.reply_delay = 0.002
        manager = LockManager(url=f"{proxy.url}?socket_timeout=5")
        assert _cancellation_trials(manager, name, 500, spread=0.008) == 500
    finally:
        proxy.close()


def _cancellation_trials(
    manager: LockManager, name: str, trials: int, spread: float = 0.004
) -> int:
    async def scenario() -> int:
        rng = random.Random(7)
        holder = manager.lock(name, owner="holder", ttl=30)
        checked = 0
        for trial in range(trials):
            lk = manager.lock(name, ttl=30)
            contended = trial % 3 == 0
            if contended:
                assert await holder.aacquire()
            delay = rng.uniform(0, spread)

            async def attempt(lk: Any = lk) -> None:
                if await lk.aacquire(timeout=5):
                    try:
                        await asyncio.sleep(rng.uniform(0, 0.002))
                    finally:
                        await lk.arelease()  # a cancel can land in here too

            task = asyncio.ensure_future(attempt())
            releaser = None
            if contended:  # the holder lets go at a random point of the wait
                releaser = asyncio.ensure_future(_release_later(holder, delay * 2))
            await asyncio.sleep(delay)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            if releaser is not None:
                await releaser
            info = await manager.aget(name)
            # Whatever point it was cancelled at, nobody holds the lock unknowingly.
            assert info is None, f"trial {trial}: orphaned lock held by {info.owner}"
            checked += 1
        return checked

    return int(run(scenario))


async def _release_later(holder: Any, delay: float) -> None:
    await asyncio.sleep(delay)
    await holder.arelease()
