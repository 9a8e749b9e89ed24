"""The asyncio API of Lock and LockManager on a real redis-server.

Every test drives its coroutines with a plain ``asyncio.run`` (bounded by
``_run``'s timeout), so nothing here depends on pytest-asyncio. The lock
behaviour mirrors tests/test_lock.py and tests/test_waiting.py, and redis-py's
own asyncio lock tests: waiting, timeouts, extend, re-entrancy per task,
per-task ownership, ``async with``, fencing, and the manager twins. Then what
only asyncio has: ownership through ``wait_for``/``gather``/``shield``, a
blocking call refused inside a running loop, a blocked loop that keeps its
lease, and sync and async waiters sharing one FIFO queue.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio
from django.conf import settings

from django_redislock import (
    LockError,
    LockLost,
    LockManager,
    LockNotAcquired,
    LockNotOwned,
    locks,
)
from django_redislock.exceptions import BlockingCallInEventLoop
from tests.test_multiprocess import _expect_line

ROOT = Path(__file__).resolve().parent.parent

T = TypeVar("T")

#: A hand-off must wake its waiter well before the ~1 s fallback poll.
WAKE_BOUND = 0.5


def _run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run *coro* on a fresh event loop, failing the test after *timeout* seconds."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _until(
    predicate: Callable[[], Any], what: str, timeout: float = 5.0, step: float = 0.005
) -> None:
    """Await *predicate()* becoming true (checked every *step* s, at most *timeout* s)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(step)


def _queue(manager: LockManager, name: str) -> list[str]:
    """The owners queued on *name*, in order (read with a plain client)."""
    key = manager.backend().keyspace.keys(name).queue
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return [o.decode() for o in client.lrange(key, 0, -1)]
    finally:
        client.close()


def _assert_no_waiters(manager: LockManager, name: str, redis_client: redis.Redis) -> None:
    keys = manager.backend().keyspace.keys(name)
    assert redis_client.llen(keys.queue) == 0, "a queue entry was left behind"
    assert redis_client.hlen(keys.waiters) == 0, "a waiter entry was left behind"


# -- the API --------------------------------------------------------------------


def test_aacquire_arelease_store_metadata_and_delete_the_key(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    async def main() -> str:
        lock = manager.lock(name, ttl=10, purpose="async report", extra={"n": 1})
        assert await lock.alocked() is False
        assert await lock.attl() is None
        assert await lock.aacquire(blocking=False) is True
        info = await manager.aget(name)
        assert info is not None
        assert info.owner == lock.owner
        assert info.hold_count == 1
        assert info.fencing_token == lock.fencing_token is not None
        assert info.purpose == "async report" and info.extra == {"n": 1}
        assert info.meta.get("task") == asyncio.current_task().get_name()
        assert 9 < info.ttl <= 10
        assert await lock.alocked() is True
        assert await lock.aowned() is True
        assert 9 < await lock.attl() <= 10
        assert await lock.arelease() == 0
        assert lock.fencing_token is None
        assert await lock.alocked() is False
        assert await manager.aget(name) is None
        return info.key

    key = _run(main())
    assert redis_client.exists(key) == 0


def test_two_tasks_are_two_owners_of_one_lock_object(manager: LockManager, name: str) -> None:
    lock = manager.lock(name)

    async def other_task() -> dict[str, Any]:
        seen: dict[str, Any] = {"owner": lock.owner}
        seen["acquired"] = await lock.aacquire(blocking=False)
        seen["owned"] = await lock.aowned()
        seen["token"] = lock.fencing_token
        for action, call in (("release", lock.arelease), ("release_all", lock.arelease_all)):
            try:
                await call()
            except LockNotOwned as exc:
                seen[action] = ("refused", exc.name, exc.lock_name)
        try:
            await lock.aextend(5)
        except LockNotOwned:
            seen["extend"] = "refused"
        return seen

    async def main() -> None:
        assert await lock.aacquire(blocking=False)
        seen = await asyncio.create_task(other_task())
        assert seen["owner"] != lock.owner
        assert seen["acquired"] is False and seen["owned"] is False and seen["token"] is None
        assert seen["release"] == ("refused", name, name)
        assert seen["release_all"] == ("refused", name, name)
        assert seen["extend"] == "refused"
        info = await manager.aget(name)
        assert info.owner == lock.owner and info.hold_count == 1
        assert await lock.arelease() == 0

    _run(main())


def test_reentrant_per_task_and_release_all(manager: LockManager, name: str) -> None:
    async def main() -> None:
        lock = manager.lock(name)
        same_task_other_object = manager.lock(name)
        assert await lock.aacquire(blocking=False)
        assert await same_task_other_object.aacquire(blocking=False)
        assert await lock.aacquire()
        assert (await manager.aget(name)).hold_count == 3
        assert await lock.arelease() == 2
        assert await same_task_other_object.arelease() == 1
        assert await lock.aowned()
        assert await lock.arelease() == 0
        assert not await lock.alocked()
        with pytest.raises(LockNotOwned):
            await lock.arelease()
        # release_all drops every hold of the task at once.
        for _ in range(3):
            assert await lock.aacquire(blocking=False)
        assert (await manager.aget(name)).hold_count == 3
        assert await lock.arelease_all() == 0
        assert await manager.aget(name) is None
        with pytest.raises(LockNotOwned):
            await lock.arelease_all()

    _run(main())


def test_explicit_owner_is_shared_by_tasks(manager: LockManager, name: str) -> None:
    async def hold_once() -> int | None:
        lock = manager.lock(name, owner="shared-owner")
        assert await lock.aacquire(blocking=False)
        return lock.fencing_token

    async def release_once() -> int:
        return await manager.lock(name, owner="shared-owner").arelease()

    async def main() -> None:
        first = await asyncio.create_task(hold_once())
        second = await asyncio.create_task(hold_once())
        assert first == second is not None
        info = await manager.aget(name)
        assert info.owner == "shared-owner" and info.hold_count == 2
        assert not await manager.lock(name).aacquire(blocking=False)  # this task is not it
        assert await asyncio.create_task(release_once()) == 1
        assert await asyncio.create_task(release_once()) == 0
        assert await manager.aget(name) is None

    _run(main())


def test_async_with_holds_releases_and_refuses(manager: LockManager, name: str) -> None:
    async def main() -> None:
        lock = manager.lock(name)
        async with lock as held:
            assert held is lock
            assert await held.aowned()
            assert held.fencing_token is not None
            assert 29 < await held.attl() <= 30  # the default lease
        assert held.fencing_token is None
        assert await manager.aget(name) is None
        holder = manager.lock(name, owner="someone-else")
        assert await holder.aacquire(blocking=False)
        for lock in (manager.lock(name, blocking=False), manager.lock(name, timeout=0.05)):
            started = time.monotonic()
            with pytest.raises(LockNotAcquired) as caught:
                async with lock:
                    pytest.fail("the body must not run")
            assert time.monotonic() - started < 1.0
            assert caught.value.name == caught.value.lock_name == name
        assert (await manager.aget(name)).owner == "someone-else"
        assert await holder.arelease() == 0

    _run(main())


def test_async_with_raises_lock_lost_but_never_masks_the_body_error(
    manager: LockManager, name: str
) -> None:
    async def main() -> None:
        with pytest.raises(LockLost):
            async with manager.lock(name, auto_renew=False, raise_on_lost=True):
                assert await manager.aforce_release(name)
        with pytest.raises(LockLost):  # by default too, and renewed
            async with manager.lock(name):
                assert await manager.aforce_release(name)
        async with manager.lock(name, raise_on_lost=False) as held:
            assert await manager.aforce_release(name)
        assert not await held.alocked()
        with pytest.raises(KeyError):
            async with manager.lock(name, raise_on_lost=True):
                assert await manager.aforce_release(name)
                raise KeyError("body")

    _run(main())


def test_waiting_task_is_handed_the_lock_promptly(manager: LockManager, name: str) -> None:
    async def main() -> None:
        holder = manager.lock(name, owner="holder")
        assert await holder.aacquire()
        fence_before = holder.fencing_token
        waiter = manager.lock(name)
        granted: list[float] = []

        async def wait() -> int | None:
            assert await waiter.aacquire(timeout=10)
            granted.append(time.monotonic())
            token = waiter.fencing_token
            assert await waiter.arelease() == 0
            return token

        task = asyncio.create_task(wait())
        await _until(lambda: len(_queue(manager, name)) == 1, "the waiter queued")
        released_at = time.monotonic()
        assert await holder.arelease() == 0
        fence = await asyncio.wait_for(task, 10)
        assert granted[0] - released_at < WAKE_BOUND
        assert fence > fence_before

    _run(main())


def test_timeout_is_kept_and_leaves_no_queue_entry(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    async def main() -> None:
        holder = manager.lock(name, owner="holder")
        assert await holder.aacquire()
        for kwargs in ({"timeout": 0.3}, {"blocking_timeout": 0.3}):
            started = time.monotonic()
            assert await manager.lock(name).aacquire(**kwargs) is False
            elapsed = time.monotonic() - started
            assert 0.3 <= elapsed < 0.3 + WAKE_BOUND, elapsed
            _assert_no_waiters(manager, name, redis_client)
        started = time.monotonic()
        assert await manager.lock(name, timeout=0.2).aacquire() is False
        assert 0.2 <= time.monotonic() - started < 0.2 + WAKE_BOUND
        _assert_no_waiters(manager, name, redis_client)
        assert (await manager.aget(name)).owner == "holder"
        assert await holder.arelease() == 0

    _run(main())


def test_zero_wait_is_one_attempt_as_in_redis_py(manager: LockManager, name: str) -> None:
    async def main() -> None:
        holder = manager.lock(name, owner="holder")
        assert await holder.aacquire()
        other = manager.lock(name)
        started = time.monotonic()
        assert await other.aacquire(timeout=0) is False
        assert await other.aacquire(blocking_timeout=0) is False
        assert await manager.lock(name, timeout=0).aacquire() is False
        # The sync spellings are one attempt as well, so they are allowed in a loop.
        assert other.acquire(timeout=0) is False
        assert other.acquire(blocking_timeout=0) is False
        assert time.monotonic() - started < 1.0, "a zero wait must not wait"
        assert await holder.arelease() == 0
        assert await other.aacquire(blocking_timeout=0) is True
        assert await other.arelease() == 0

    _run(main())


def test_bytes_token_names_the_owner(manager: LockManager, name: str) -> None:
    async def main() -> None:
        lock = manager.lock(name)
        assert await lock.aacquire(token=b"owner-bytes")
        assert lock.owner == "owner-bytes"
        assert (await manager.aget(name)).owner == "owner-bytes"
        # The owner stays with the Lock: another task releases it as that owner.
        assert await asyncio.create_task(lock.arelease()) == 0
        assert await manager.aget(name) is None

    _run(main())


def test_ttl_extend_reacquire(manager: LockManager, name: str) -> None:
    async def main() -> None:
        lock = manager.lock(name, ttl=10, auto_renew=False)
        assert await lock.attl() is None
        assert await lock.aacquire()
        assert 9 < await lock.attl() <= 10
        assert await lock.aextend(10) is True
        assert 19 < await lock.attl() <= 20
        assert await lock.aextend(5, replace_ttl=True) is True
        assert 4 < await lock.attl() <= 5
        assert await lock.areacquire() is True
        assert 9 < await lock.attl() <= 10
        assert await lock.arelease() == 0
        with pytest.raises(LockNotOwned):
            await lock.aextend(1)
        with pytest.raises(LockNotOwned):
            await lock.areacquire()
        forever = manager.lock(name, ttl=None, no_expiry=True)
        assert await forever.aacquire()
        assert await forever.attl() == math.inf
        with pytest.raises(LockError, match="no expiry"):
            await forever.aextend(5)
        assert await forever.arelease() == 0

    _run(main())


def test_argument_checks(manager: LockManager, name: str) -> None:
    async def main() -> None:
        lock = manager.lock(name)
        with pytest.raises(ValueError, match="positive"):
            await lock.aacquire(blocking_timeout=-1)
        with pytest.raises(ValueError, match="positive"):
            await lock.aextend(-1)
        assert not await lock.alocked()

    _run(main())


def test_fencing_tokens_increase_across_holders(manager: LockManager, name: str) -> None:
    tokens: list[int] = []

    async def hold(owner: str | None) -> None:
        async with manager.lock(name, owner=owner) as held:
            tokens.append(held.fencing_token)

    def hold_in_a_thread() -> None:
        with manager.lock(name) as held:
            tokens.append(held.fencing_token)

    async def main() -> None:
        for i in range(8):
            if i % 3 == 2:
                thread = threading.Thread(target=hold_in_a_thread)
                thread.start()
                await asyncio.to_thread(thread.join, 10)
            else:
                await asyncio.create_task(hold(f"explicit-{i}" if i % 2 else None))

    _run(main())
    assert len(tokens) == 8
    assert all(a < b for a, b in zip(tokens, tokens[1:], strict=False)), tokens


def test_manager_twins(manager: LockManager, name: str, redis_client: redis.Redis) -> None:
    async def main() -> None:
        names = [f"{name}:a", f"{name}:b", f"{name}x"]
        held = [manager.lock(n, owner="holder", ttl=10, auto_renew=False) for n in names]
        for lock in held:
            assert await lock.aacquire(blocking=False)
        assert await manager.aget(f"{name}:missing") is None
        # aget_many leaves out the names nobody holds and keeps the order asked for.
        many = await manager.aget_many([names[1], f"{name}:missing", names[0]])
        assert [info.name for info in many] == [names[1], names[0]]
        listed = sorted([info.name async for info in manager.aactive(f"{name}:")])
        assert listed == [f"{name}:a", f"{name}:b"]
        assert sorted([i.name async for i in manager.aactive(name)]) == sorted(names)
        token = held[0].fencing_token
        # aforce_extend compares owner and token; it adds to the lease.
        assert (await manager.aforce_extend(names[0], 5, owner="other")).status == "changed"
        result = await manager.aforce_extend(names[0], 20, owner="holder", fencing_token=token)
        assert result.extended and 29 < result.ttl <= 30
        assert 29 < (await manager.aget(names[0])).ttl <= 30
        # aforce_release compares them too.
        assert not await manager.aforce_release(names[0], owner="somebody")
        assert not await manager.aforce_release(names[0], fencing_token=token + 1)
        assert await manager.aget(names[0]) is not None
        assert await manager.aforce_release(names[0], owner="holder", fencing_token=token)
        assert await manager.aget(names[0]) is None
        assert not await manager.aforce_release(names[0])
        assert (await manager.aforce_extend(names[0], 5)).status == "gone"
        with pytest.raises(LockNotOwned):
            await held[0].arelease()
        for lock in held[1:]:
            assert await lock.arelease() == 0
        assert [i async for i in manager.aactive(name)] == []

    _run(main())
    assert redis_client.exists(manager.backend().keyspace.keys(f"{name}:a").lock) == 0


# -- ownership through wait_for / gather / shield ---------------------------------


async def _in_wait_for(coro: Coroutine[Any, Any, T]) -> T:
    return await asyncio.wait_for(coro, 5)


async def _in_gather(coro: Coroutine[Any, Any, T]) -> T:
    (result,) = await asyncio.gather(coro)
    return result


async def _in_shield(coro: Coroutine[Any, Any, T]) -> T:
    return await asyncio.shield(coro)


@pytest.mark.parametrize("wrap", [_in_wait_for, _in_gather, _in_shield])
def test_ownership_is_the_callers_through_task_wrappers(
    manager: LockManager, name: str, wrap: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]]
) -> None:
    async def which_task() -> asyncio.Task[Any] | None:
        return asyncio.current_task()

    async def main() -> None:
        me = asyncio.current_task()
        if sys.version_info < (3, 12):
            # The premise: these wrappers run the coroutine in another task here,
            # so only an owner captured at call time keeps it the caller's.
            assert await wrap(which_task()) is not me
        lock = manager.lock(name)
        assert await wrap(lock.aacquire()) is True
        info = await manager.aget(name)
        assert info.owner == lock.owner, "the hold must belong to the calling task"
        assert lock.fencing_token == info.fencing_token
        assert await lock.aowned()
        # Re-entry through the wrapper counts for the same owner.
        assert await wrap(lock.aacquire(blocking=False)) is True
        assert (await manager.aget(name)).hold_count == 2
        assert await wrap(lock.arelease()) == 1
        assert await lock.arelease() == 0
        assert lock.fencing_token is None
        assert await manager.aget(name) is None

    _run(main())


# -- sync calls inside a running loop --------------------------------------------------


def test_blocking_sync_acquire_inside_a_loop_is_refused(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    async def main() -> None:
        lock = manager.lock(name)
        for call in (
            lambda: lock.acquire(),
            lambda: lock.acquire(blocking=True),
            lambda: lock.acquire(timeout=5),
            lambda: lock.acquire(blocking_timeout=5),
            lambda: manager.lock(name, timeout=5).acquire(),
            lambda: lock.__enter__(),
        ):
            with pytest.raises(BlockingCallInEventLoop) as caught:
                call()
            error = caught.value
            assert isinstance(error, LockError) and isinstance(error, RuntimeError)
            assert "aacquire" in str(error) and "async with" in str(error)
            assert error.name == error.lock_name == name
        # Refused before anything reached Redis: nothing held, nothing queued.
        assert await manager.aget(name) is None
        _assert_no_waiters(manager, name, redis_client)
        # One attempt cannot block: allowed.
        assert lock.acquire(blocking=False) is True
        assert lock.acquire(timeout=0) is True
        assert (await manager.aget(name)).hold_count == 2
        assert lock.release() == 1
        assert lock.release() == 0

    _run(main())
    # Outside a loop the same call blocks as it always did.
    lock = manager.lock(name)
    assert lock.acquire(timeout=1)
    lock.release()


def test_a_client_of_the_wrong_kind_is_refused() -> None:
    async_client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    sync_client = redis.Redis.from_url(settings.REDIS_URL)
    with pytest.raises(TypeError, match="async_client"):
        LockManager(client=async_client)
    with pytest.raises(TypeError, match="client="):
        LockManager(async_client=sync_client)
    sync_client.close()


def test_manager_on_an_asyncio_client_locks_and_renews(name: str, redis_client) -> None:
    async def main() -> None:
        async_client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            manager = LockManager(async_client=async_client)
            lock = manager.lock(name, ttl=1)
            async with lock:
                # Renewed by the watchdog (a thread, on a blocking twin of the client).
                await asyncio.sleep(1.6)
                info = await manager.aget(name)
                assert info is not None and info.owner == lock.owner
                assert redis_client.hget(info.key, "owner").decode() == lock.owner
                assert not lock.lost
            assert await manager.aget(name) is None
        finally:
            await async_client.aclose()

    _run(main())


# -- many tasks, one lock -------------------------------------------------------------


@pytest.mark.slow
def test_200_tasks_x_50_sections_lose_no_update_and_never_overlap(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    tasks, sections = 200, 50
    counter_key = f"{name}:counter"
    inside = 0
    overlaps = 0
    max_inside = 0

    async def work(i: int, shared: Any, counter: Any) -> None:
        nonlocal inside, overlaps, max_inside
        # Half the tasks share one Lock object (each task is its own owner there).
        lock = shared if i % 2 else manager.lock(name, timeout=120)
        for _ in range(sections):
            async with lock:
                inside += 1
                max_inside = max(max_inside, inside)
                overlaps += inside > 1
                value = int(await counter.get(counter_key) or 0)
                await asyncio.sleep(0)  # let every other task run in the middle
                await counter.set(counter_key, value + 1)
                inside -= 1

    async def main() -> float:
        counter = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            shared = manager.lock(name, timeout=120)
            started = time.monotonic()
            await asyncio.gather(*(work(i, shared, counter) for i in range(tasks)))
            return time.monotonic() - started
        finally:
            await counter.aclose()

    elapsed = _run(main(), timeout=170)
    print(f"{tasks} tasks x {sections} sections: {elapsed:.1f} s")
    assert overlaps == 0 and max_inside == 1
    assert int(redis_client.get(counter_key)) == tasks * sections
    assert manager.get(name) is None
    _assert_no_waiters(manager, name, redis_client)


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.aproc", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_three_processes_of_twenty_tasks_lose_no_update(
    name: str, redis_client: redis.Redis
) -> None:
    counter, inside = f"{name}:counter", f"{name}:inside"
    procs = [_spawn("count", name, "20", "10", counter, inside) for _ in range(3)]
    try:
        overlaps = [int(_expect_line(p, "done", timeout=120)[1]) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    assert overlaps == [0, 0, 0]
    assert int(redis_client.get(counter)) == 3 * 20 * 10
    assert locks.get(name) is None


@pytest.mark.slow
def test_a_sigkilled_async_holder_frees_the_lock_after_its_lease(name: str) -> None:
    holder = _spawn("hold", name, "1")
    try:
        token = int(_expect_line(holder, "acquired")[1])
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert locks.get(name) is not None, "the lock outlives its killed holder (lease)"

        async def take_over() -> tuple[bool, float, int | None]:
            lock = locks.lock(name)
            started = time.monotonic()
            acquired = await lock.aacquire(timeout=10)
            elapsed, fence = time.monotonic() - started, lock.fencing_token
            if acquired:
                await lock.arelease()
            return acquired, elapsed, fence

        acquired, elapsed, fence = _run(take_over())
        assert acquired and fence > token
        # Freed by the lease (1 s), which the waiter was told about.
        assert elapsed < 1 + 0.5
    finally:
        holder.kill()
        holder.wait(10)


# -- the watchdog keeps leases while the loop is blocked ---------------------------------


def test_a_blocked_loop_keeps_its_one_second_lease(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    samples: list[str | None] = []
    stop = threading.Event()

    def watch(key: str) -> None:
        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            while not stop.is_set():
                owner = client.hget(key, "owner")
                samples.append(owner.decode() if owner else None)
                stop.wait(0.01)
        finally:
            client.close()

    async def main() -> str:
        lock = manager.lock(name, ttl=1, raise_on_lost=True)
        async with lock:  # LockLost here would mean the lease ran out
            owner = lock.owner
            watcher = threading.Thread(target=watch, args=(lock.key,))
            watcher.start()
            try:
                time.sleep(3)  # blocks the event loop: nothing of ours runs on it
            finally:
                stop.set()
                watcher.join(5)
            assert not watcher.is_alive()
            assert not lock.lost
            assert await lock.aowned()
        return owner

    owner = _run(main())
    assert len(samples) > 50, "the watcher barely ran"
    assert all(s == owner for s in samples), (
        f"the lock was seen free or held by another {sum(s != owner for s in samples)} "
        f"times out of {len(samples)} during the blocked loop"
    )
    assert manager.get(name) is None


# -- sync and async contenders on one name ---------------------------------------------


class _Background:
    """An event loop running in a thread of its own, for async waiters next to sync ones."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_sync_threads_and_async_tasks_exclude_each_other(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    rounds = 30
    counter_key = f"{name}:counter"
    guard = threading.Lock()
    inside = 0
    overlaps = 0

    def enter() -> None:
        nonlocal inside, overlaps
        with guard:
            inside += 1
            overlaps += inside > 1

    def leave() -> None:
        nonlocal inside
        with guard:
            inside -= 1

    def sync_worker() -> None:
        lock = manager.lock(name, timeout=60)
        client = redis.Redis.from_url(settings.REDIS_URL)
        for _ in range(rounds):
            with lock:
                enter()
                value = int(client.get(counter_key) or 0)
                time.sleep(0)
                client.set(counter_key, value + 1)
                leave()
        client.close()

    async def async_worker(counter: Any) -> None:
        lock = manager.lock(name, timeout=60)
        for _ in range(rounds):
            async with lock:
                enter()
                value = int(await counter.get(counter_key) or 0)
                await asyncio.sleep(0)
                await counter.set(counter_key, value + 1)
                leave()

    async def main() -> None:
        counter = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            await asyncio.gather(*(async_worker(counter) for _ in range(4)))
        finally:
            await counter.aclose()

    threads = [threading.Thread(target=sync_worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        _run(main(), timeout=90)
    finally:
        for thread in threads:
            thread.join(90)
    assert not any(t.is_alive() for t in threads)
    assert overlaps == 0
    assert int(redis_client.get(counter_key)) == (3 + 4) * rounds
    assert manager.get(name) is None


def test_sync_and_async_waiters_are_served_in_arrival_order(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    keyspace = manager.backend().keyspace
    queue_key = keyspace.keys(name).queue
    assert queue_key == f"{keyspace.prefix}:queue:{{{name}}}"
    holder = manager.lock(name, owner="holder")
    assert holder.acquire(blocking=False)
    order: list[int] = []
    owners: dict[int, str] = {}
    loop = _Background()
    threads: list[threading.Thread] = []
    futures: list[Any] = []

    def sync_waiter(i: int) -> None:
        lock = manager.lock(name, timeout=30)
        owners[i] = lock.owner
        with lock:
            order.append(i)
            time.sleep(0.01)

    async def async_waiter(i: int) -> None:
        lock = manager.lock(name, timeout=30)
        owners[i] = lock.owner
        async with lock:
            order.append(i)
            await asyncio.sleep(0.01)

    try:
        for i in range(8):
            if i % 2 == 0:
                thread = threading.Thread(target=sync_waiter, args=(i,))
                thread.start()
                threads.append(thread)
            else:
                futures.append(loop.submit(async_waiter(i)))
            deadline = time.monotonic() + 5
            while redis_client.llen(queue_key) < i + 1:
                assert time.monotonic() < deadline, f"waiter {i} did not queue"
                time.sleep(0.002)
        queued = [o.decode() for o in redis_client.lrange(queue_key, 0, -1)]
        assert queued == [owners[i] for i in range(8)]
        # A newcomer trying once does not jump the queue.
        assert not manager.lock(name, owner="newcomer").acquire(blocking=False)
        holder.release()
        for thread in threads:
            thread.join(30)
        for future in futures:
            future.result(30)
    finally:
        loop.close()
    assert order == list(range(8))
    assert manager.get(name) is None
    _assert_no_waiters(manager, name, redis_client)
