"""A release that hands an asyncio lock to a waiter of its own event loop delivers the
grant from its reply: the waiter is woken as the releasing task reads that reply, and
nothing goes through Redis's pub/sub (``PUBLISH`` is counted by the server).

Each test lengthens the waiters' fallback poll to a minute, so a wake-up that did not
arrive shows as a waiter still blocked after five seconds, not as a slow test.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis

from django_redislock import LockManager
from django_redislock.engine import flows
from django_redislock.engine.lua.common import WAKE_SURE
from django_redislock.engine.wake import release_outcome

WAIT = 5.0


@pytest.fixture(autouse=True)
def _no_fallback_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flows, "POLL_SLICE", 60.0)


def _publishes(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_publish", {}).get("calls", 0))


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.002)


async def _queued(manager: LockManager, name: str, count: int) -> None:
    deadline = time.monotonic() + WAIT
    while True:
        info = await manager.aget(name)
        if info is not None and info.queue_length == count:
            return
        assert time.monotonic() < deadline, f"{count} waiter(s) queued: {info}"
        await asyncio.sleep(0.002)


async def _acquire(lock: Any) -> int:
    """A blocking acquire in a task of its own (a task is an owner of its own); once
    held (Redis says so), released. Its fencing token."""
    assert await lock.aacquire(timeout=30)
    try:
        info = await lock.manager.aget(lock.name)
        assert info is not None and info.owner == lock.owner and info.hold_count == 1
        assert lock.fencing_token == info.fencing_token
        return int(lock.fencing_token)
    finally:
        await lock.arelease()


async def _held_with_a_waiter(
    manager: LockManager, name: str, fair: bool = True
) -> tuple[Any, asyncio.Future[int]]:
    """A lock held by the calling task, and a task of this loop queued for it."""
    holder = manager.lock(name, ttl=30, fair=fair)
    assert await holder.aacquire(blocking=False)
    waiting = asyncio.ensure_future(_acquire(manager.lock(name, ttl=30, fair=fair)))
    await _queued(manager, name, 1)
    await _marked(manager, name)
    return holder, waiting


async def _marked(manager: LockManager, name: str) -> None:
    """Until every queued waiter has marked its entry's channel as subscribed
    (``scripts.WAKE_SURE``): a waiter's first wait queues before its hub has
    subscribed and asks Redis once more when it has; before that ask it may take a
    lock handed to it by its own reply instead of the hand-off's message."""
    client = manager.client
    entries = manager.backend().keyspace.keys(name).waiters
    deadline = time.monotonic() + WAIT
    while True:
        channels = [
            entry.split(b"|")[4]
            for owner, entry in client.hgetall(entries).items()
            if owner != b"~cur"  # (the holder on record, not a waiter)
        ]
        if channels and all(channel.startswith(WAKE_SURE) for channel in channels):
            return
        assert time.monotonic() < deadline, f"waiters' channels not marked: {channels}"
        await asyncio.sleep(0.002)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "fair=False"])
def test_a_waiter_of_the_same_event_loop_is_woken_from_the_release_reply(
    manager: LockManager, name: str, redis_client: redis.Redis, fair: bool
) -> None:
    async def scenario() -> None:
        holder, waiting = await _held_with_a_waiter(manager, name, fair)
        first = holder.fencing_token
        published = _publishes(redis_client)
        await holder.arelease()
        assert await asyncio.wait_for(waiting, WAIT) > first
        # fair: handed over in the release (the waiter's own wake-up); fair=False:
        # poked, and it took the free lock itself. Neither went through pub/sub.
        assert _publishes(redis_client) == published

    run(scenario)


def test_a_semaphore_place_is_handed_within_the_loop_from_the_release_reply(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    async def scenario() -> None:
        sem = manager.semaphore(name, 1, ttl=30, timeout=30)
        assert await sem.aacquire(blocking=False)
        inside = asyncio.Event()

        async def wait() -> None:
            async with sem:
                inside.set()

        waiting = asyncio.ensure_future(wait())
        await _queued(manager, name, 1)
        published = _publishes(redis_client)
        await sem.arelease()
        await asyncio.wait_for(waiting, WAIT)
        assert inside.is_set() and _publishes(redis_client) == published
        assert await manager.aget(name) is None

    run(scenario)


def test_a_write_release_hands_every_queued_read_within_the_loop(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    """One release hands two places (a list of wake-ups in its reply): both readers
    hold at once, and neither was published."""

    async def scenario() -> None:
        rw = manager.rw_lock(name, ttl=30, timeout=30)
        writer = rw.write()
        assert await writer.aacquire(blocking=False)
        readers_in = 0

        async def read() -> int:
            nonlocal readers_in
            async with rw.read():
                readers_in += 1
                await _until(lambda: readers_in == 2, "both readers inside")
                return readers_in

        reading = [asyncio.ensure_future(read()) for _ in range(2)]
        await _queued(manager, name, 2)
        published = _publishes(redis_client)
        await writer.arelease()
        assert await asyncio.wait_for(asyncio.gather(*reading), WAIT) == [2, 2]
        assert _publishes(redis_client) == published
        assert await manager.aget(name) is None

    run(scenario)


def test_a_waiter_of_another_event_loop_is_woken_through_pub_sub(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    got = threading.Event()
    queued = threading.Event()

    def other_loop() -> None:
        async def wait() -> None:
            waiter = manager.lock(name, ttl=30)
            acquiring = asyncio.ensure_future(_acquire(waiter))
            await _queued(manager, name, 1)
            queued.set()
            await acquiring
            got.set()

        asyncio.run(wait())

    async def scenario() -> None:
        holder = manager.lock(name, ttl=30)
        assert await holder.aacquire(blocking=False)
        thread = threading.Thread(target=other_loop)
        thread.start()
        try:
            await _until(queued.is_set, "the other loop's waiter queued")
            # A waiter of this loop too, behind it: this loop's release is sent with
            # its channel, and the grant to the other loop's waiter is published all
            # the same.
            mine = manager.lock(name, ttl=30)
            waiting = asyncio.ensure_future(_acquire(mine))
            await _queued(manager, name, 2)
            published = _publishes(redis_client)
            await holder.arelease()
            await _until(got.is_set, "the other loop's waiter woken")
            # Then the other loop releases, and hands it to ours: each hand-off crossed
            # from one loop to the other, and each was published.
            assert await asyncio.wait_for(waiting, WAIT)
            assert _publishes(redis_client) == published + 2
        finally:
            thread.join(WAIT)
        assert not thread.is_alive()

    run(scenario)


def test_a_release_cancelled_in_flight_still_wakes_the_waiter(
    manager: LockManager, name: str
) -> None:
    async def scenario() -> None:
        holder, waiting = await _held_with_a_waiter(manager, name)
        releasing = asyncio.ensure_future(holder.arelease())
        await asyncio.sleep(0)  # the release is on its way: its reply is abandoned
        releasing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await releasing
        # Python 3.10 can drop a cancellation inside redis-py's wait_for (CPython
        # gh-86296), and nothing tells the drivers there: the release then simply
        # finished. From 3.11 it is raised.
        assert releasing.cancelled() or sys.version_info < (3, 11)
        # Finished in the background with the same nonce: the release went through
        # once, and the waiter, whose wake-up was in the abandoned reply, gets it.
        assert await asyncio.wait_for(waiting, WAIT)
        assert await manager.aget(name) is None

    run(scenario)


def test_a_repeated_release_sent_with_the_channel_asks_for_a_poke(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    """The script's side of the case above: the first reply is the wake-up message, a
    repeat (same nonce) cannot tell whether it arrived, so it answers ``*``."""

    async def scenario() -> None:
        holder, waiting = await _held_with_a_waiter(manager, name)
        backend = holder._source.abackend()
        here = backend.local_channel()
        assert here == backend.hub().channel_arg
        owner, _ = holder._caller()
        call = holder._release_call(backend, owner, "n-1", False, here=here)
        published = _publishes(redis_client)
        first = await backend.run(call)
        assert isinstance(first, bytes) and first.startswith(waiter_nonce(backend))
        assert await backend.run(call) == b"*"
        assert _publishes(redis_client) == published
        # Delivered as a Lock's release would: the waiter holds it.
        assert release_outcome(first, backend.hub) == 0
        assert await asyncio.wait_for(waiting, WAIT)

    def waiter_nonce(backend: Any) -> bytes:
        (nonce,) = backend.hub()._waiters
        return f"{nonce} ".encode()

    run(scenario)


def test_without_waiters_of_its_own_a_release_sends_no_channel(
    manager: LockManager, name: str
) -> None:
    async def scenario() -> None:
        lock = manager.lock(name, ttl=30)
        assert await lock.aacquire(blocking=False)
        backend = lock._source.abackend()
        assert backend.local_channel() is None
        await lock.arelease()
        assert await manager.aget(name) is None

    run(scenario)


class _Hub:
    def __init__(self) -> None:
        self.delivered: list[bytes | str] = []
        self.poked = 0

    def deliver(self, data: bytes | str) -> None:
        self.delivered.append(data)

    def poke_all(self) -> None:
        self.poked += 1


@pytest.mark.parametrize(
    ("reply", "remaining", "delivered", "poked"),
    [
        (2, 2, [], 0),
        (0, 0, [], 0),
        (-1, -1, [], 0),
        (b"abc 17", 0, [b"abc 17"], 0),
        ("abc", 0, ["abc"], 0),
        (b"*", 0, [], 1),
    ],
)
def test_release_outcome_reads_every_reply(
    reply: Any, remaining: int, delivered: list[Any], poked: int
) -> None:
    hub = _Hub()
    assert release_outcome(reply, lambda: hub) == remaining
    assert hub.delivered == delivered and hub.poked == poked
