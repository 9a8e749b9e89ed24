"""``@single_instance`` on ``async def`` functions and views, and sync locks under asgiref.

An async guarded call waits on the event loop (``aacquire``), not in a thread:
more waiting calls than any thread pool has threads are all queued at once and
served one at a time. Async views answer 409 when the lock is held. Last, the
documented ``sync_to_async`` hazard: a sync lock used from several tasks through
``sync_to_async`` (thread_sensitive, outside a ThreadSensitiveContext) runs in
one shared thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
import redis
from asgiref.sync import async_to_sync, sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, RequestFactory
from django.urls import path

from django_redislock import LockManager, LockNotAcquired, LockNotOwned, locks, single_instance

pytestmark = pytest.mark.urls(__name__)

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """Run *coro* on a fresh event loop, failing the test after *timeout* seconds."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _until_queued(name: str, length: int, redis_client: redis.Redis, timeout: float) -> None:
    queue_key = locks.backend().keyspace.keys(name).queue
    deadline = time.monotonic() + timeout
    while redis_client.llen(queue_key) < length:
        assert time.monotonic() < deadline, (
            f"only {redis_client.llen(queue_key)} of {length} calls queued on {name} "
            f"within {timeout} s"
        )
        await asyncio.sleep(0.005)


class _Overlaps:
    """Counts calls found running while another one ran."""

    def __init__(self) -> None:
        self.inside = 0
        self.overlaps = 0
        self.done = 0

    def enter(self) -> None:
        self.inside += 1
        self.overlaps += self.inside > 1

    def leave(self) -> None:
        self.inside -= 1
        self.done += 1


# -- async functions -------------------------------------------------------------------


def test_sixty_waiting_async_calls_are_queued_at_once_and_run_one_at_a_time(
    name: str, redis_client: redis.Redis
) -> None:
    calls = 60  # more than asyncio's default executor (min(32, cpus + 4)) or asgiref's one thread
    seen = _Overlaps()

    @single_instance("k:{x}", on_locked="wait", ttl=10)
    async def guarded(x: str, i: int) -> int:
        seen.enter()
        await asyncio.sleep(0.005)
        seen.leave()
        return i

    lock_name = f"k:{name}"

    async def main() -> tuple[list[int], int, int, float]:
        # A lease without renewal: should this test fail, the lock frees itself.
        holder = locks.lock(lock_name, owner="holder", ttl=20, auto_renew=False)
        assert await holder.aacquire(blocking=False)
        try:
            threads_before = threading.active_count()
            tasks = [asyncio.create_task(guarded(name, i)) for i in range(calls)]
            # Every call waits at the same time: none is parked in a thread pool's queue.
            await _until_queued(lock_name, calls, redis_client, timeout=10)
            threads_waiting = threading.active_count()
        finally:
            started = time.monotonic()
            assert await holder.arelease() == 0
        results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return results, threads_before, threads_waiting, time.monotonic() - started

    results, threads_before, threads_waiting, elapsed = _run(main())
    assert sorted(results) == list(range(calls))
    assert seen.overlaps == 0 and seen.done == calls
    assert threads_waiting - threads_before < 5, (
        f"{threads_waiting - threads_before} threads started for {calls} waiting calls"
    )
    assert elapsed < 15, f"{calls} calls of 5 ms took {elapsed:.1f} s once released"
    assert locks.get(lock_name) is None


def test_fifty_calls_with_a_timeout_all_succeed(name: str, redis_client: redis.Redis) -> None:
    calls = 50
    seen = _Overlaps()

    @single_instance("t:{x}", timeout=8, ttl=10)
    async def guarded(x: str, i: int) -> int:
        seen.enter()
        await asyncio.sleep(0.02)
        seen.leave()
        return i

    async def main() -> tuple[list[Any], float]:
        started = time.monotonic()
        results = await asyncio.gather(
            *(guarded(name, i) for i in range(calls)), return_exceptions=True
        )
        return results, time.monotonic() - started

    results, elapsed = _run(main())
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == [], f"{len(failures)} calls failed, first: {failures[:1]!r}"
    assert sorted(results) == list(range(calls))
    assert seen.overlaps == 0 and seen.done == calls
    assert elapsed < 8, f"{calls} calls of 20 ms took {elapsed:.1f} s"
    assert locks.get(f"t:{name}") is None
    queue_key = locks.backend().keyspace.keys(f"t:{name}").queue
    assert redis_client.llen(queue_key) == 0


def test_async_call_that_finds_the_lock_held_is_refused_without_waiting(name: str) -> None:
    @single_instance("r:{x}")
    async def guarded(x: str) -> str:
        return "ran"

    @single_instance("r:{x}", on_locked="skip")
    async def skipping(x: str) -> str:
        return "ran"

    async def main() -> None:
        holder = locks.lock(f"r:{name}", owner="holder")
        assert await holder.aacquire(blocking=False)
        started = time.monotonic()
        with pytest.raises(LockNotAcquired) as caught:
            await guarded(name)
        assert caught.value.name == caught.value.lock_name == f"r:{name}"
        assert "holder" in str(caught.value)
        assert await skipping(name) is None
        assert time.monotonic() - started < 1.0
        assert await holder.arelease() == 0
        assert await guarded(name) == "ran"

    _run(main())


# -- async views -------------------------------------------------------------------------


@single_instance("report:{pk}", ttl=30)
async def report(request: HttpRequest, pk: int) -> HttpResponse:
    info = await locks.aget(f"report:{pk}")  # held by this very request while it runs
    return JsonResponse({"kind": info.kind if info else None, "purpose": info.purpose})


urlpatterns = [path("report/<int:pk>/", report)]


@pytest.fixture
def held() -> Any:
    """report:7 held by another request with a 20 s lease."""
    lock = locks.lock("report:7", ttl=20, owner="other-request")
    assert lock.acquire(blocking=False)
    yield lock
    if lock.owned():
        lock.release()


def _assert_409(response: Any) -> None:
    assert response.status_code == 409
    assert 18 <= int(response["Retry-After"]) <= 20  # the holder's remaining lease
    assert "already running" in response.content.decode()


def test_async_view_answers_409_when_held_through_the_async_client(held: Any) -> None:
    async def main() -> None:
        client = AsyncClient()
        _assert_409(await client.get("/report/7/"))
        other = await client.get("/report/8/")
        assert other.status_code == 200
        assert other.json() == {"kind": "view", "purpose": "GET /report/8/"}
        assert (await locks.aget("report:7")).owner == "other-request"
        assert await sync_to_async(held.release)() == 0
        assert (await client.get("/report/7/")).status_code == 200
        assert await locks.aget("report:7") is None

    _run(main())


def test_async_view_answers_409_when_held_called_directly(held: Any) -> None:
    factory = RequestFactory()

    async def main() -> None:
        _assert_409(await report(factory.post("/report/7/"), pk=7))
        assert (await report(factory.post("/report/9/"), pk=9)).status_code == 200
        assert await locks.aget("report:9") is None

    _run(main())


# -- the sync_to_async hazard ------------------------------------------------------------


def test_sync_lock_through_sync_to_async_gives_each_task_its_own_owner(
    manager: LockManager, name: str
) -> None:
    """A sync Lock used from two tasks through ``sync_to_async`` (thread_sensitive,
    outside a ThreadSensitiveContext). Both calls run in asgiref's one shared thread,
    so an owner keyed by the thread would let the second task take, and release, the
    first task's lock. The owner follows the calling task instead (one task's
    successive calls share it)."""
    lock = manager.lock(name)
    threads: set[int] = set()

    def try_acquire() -> tuple[bool, str]:
        threads.add(threading.get_ident())
        return lock.acquire(blocking=False), lock.owner

    def owned() -> bool:
        threads.add(threading.get_ident())
        return lock.owned()

    def release() -> int:
        threads.add(threading.get_ident())
        return lock.release()

    async def first(holding: asyncio.Event, checked: asyncio.Event) -> str:
        acquired, owner = await sync_to_async(try_acquire)()
        assert acquired
        holding.set()
        await checked.wait()
        # Later calls of the same task are the same owner.
        assert await sync_to_async(owned)()
        assert await sync_to_async(release)() == 0
        return owner

    async def second(holding: asyncio.Event, checked: asyncio.Event) -> tuple[bool, bool, str]:
        await holding.wait()
        try:
            acquired, owner = await sync_to_async(try_acquire)()
            is_owner = await sync_to_async(owned)()
            with pytest.raises(LockNotOwned):
                await sync_to_async(release)()
            return acquired, is_owner, owner
        finally:
            checked.set()

    async def main() -> tuple[str, tuple[bool, bool, str]]:
        holding, checked = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(first(holding, checked), second(holding, checked))

    first_owner, (acquired, is_owner, second_owner) = _run(main())
    assert len(threads) == 1, "the premise: every call ran in asgiref's one shared thread"
    assert threads != {threading.get_ident()}
    assert (acquired, is_owner) == (False, False), "the second task passed for the holder"
    assert first_owner != second_owner
    assert manager.get(name) is None


def test_sync_to_async_owners_do_not_leak_from_an_earlier_event_loop(
    manager: LockManager, name: str
) -> None:
    """A call owner asgiref copied back into this thread's context (async_to_sync
    restores the context variables its coroutine set) is not inherited by the tasks of
    a later event loop: they are still two owners."""
    lock = manager.lock(name)
    seen = contextvars.copy_context()

    async def leak() -> str:
        return await sync_to_async(lambda: lock.owner)()

    leaked = seen.run(async_to_sync(leak))

    async def two() -> list[str]:
        return list(await asyncio.gather(leak(), leak()))

    owners = seen.run(lambda: _run(two()))
    assert len(set(owners)) == 2 and leaked not in owners
