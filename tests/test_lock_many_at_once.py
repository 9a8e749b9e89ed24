"""``lock_many`` in one round trip: a set whose locks are free is taken with one batch of
attempts and released with one batch of releases (primitives/at_once.py), on a real
Redis reached through a real TCP proxy that counts the request bursts a client sends
(a pipeline arrives as one; one call at a time, each waits for its reply first).

Around the common case: a busy lock keeps the order (the granted prefix is kept, what
was granted after it is given back before the set waits, and the set queues behind
earlier waiters); a refusal or a lost reply leaves nothing held and nothing counted
twice; an asyncio set cancelled mid-batch gives back what the batch got.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis

from django_redislock import LockManager, LockMismatch, LockNotAcquired, signals
from django_redislock.engine.lua.mutex import claim_script
from tests.holding import queued, wait_until
from tests.tcp_proxy import TcpProxy


def _sent(proxy: TcpProxy) -> int:
    return proxy.requests


def test_a_free_set_costs_one_round_trip_to_take_and_one_to_release(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    names = [f"{name}:{i}" for i in range(4)]
    with counted.lock_many(names, ttl=30):  # warm: connection made, scripts loaded
        pass
    before = _sent(counting_proxy)
    with counted.lock_many(names, ttl=30) as held:
        assert _sent(counting_proxy) - before == 1
        assert all(held.fencing_tokens.values())
        assert [info.owner for info in counted.get_many(names)] == [held[n].owner for n in names]
        inside = _sent(counting_proxy)
    assert _sent(counting_proxy) - inside == 1
    assert counted.get_many(names) == []
    # A lock at a time, as before: four round trips each way.
    before = _sent(counting_proxy)
    for n in names:
        with counted.lock(n, ttl=30):
            pass
    assert _sent(counting_proxy) - before == 8


def test_asyncio_a_free_set_costs_one_round_trip_each_way(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    names = [f"{name}:{i}" for i in range(3)]

    async def main() -> None:
        try:
            async with counted.lock_many(names, ttl=30):
                pass
            before = _sent(counting_proxy)
            async with counted.lock_many(names, ttl=30) as held:
                assert _sent(counting_proxy) - before == 1
                assert len(await counted.aget_many(names)) == 3
                assert all(held.fencing_tokens.values())
                inside = _sent(counting_proxy)
            assert _sent(counting_proxy) - inside == 1
            assert await counted.aget_many(names) == []
        finally:
            await counted.source.abackend().aclose()

    asyncio.run(main())


def test_a_busy_lock_keeps_the_prefix_gives_back_the_rest_and_waits_in_line(
    name: str, redis_client: redis.Redis
) -> None:
    from django_redislock import locks

    a, b, c = f"{name}:a", f"{name}:b", f"{name}:c"
    holder = locks.lock(b, owner="holder", ttl=30)
    assert holder.acquire()
    earlier = locks.lock(b, owner="earlier", ttl=30)
    before: list[bool] = []
    waiting = threading.Thread(target=lambda: before.append(earlier.acquire(timeout=10)))
    waiting.start()
    wait_until(lambda: queued(redis_client, b) == 1)

    group = locks.lock_many([c, b, a], ttl=30, timeout=10, owner="the set")
    result: list[Any] = []
    taker = threading.Thread(target=lambda: result.append(group.acquire()))
    taker.start()
    wait_until(lambda: queued(redis_client, b) == 2)
    # While it waits: the lock before the busy one is the set's, the one after is free.
    assert [info.name for info in locks.get_many([a, c])] == [a]
    assert locks.get_many([a])[0].owner == group[a].owner
    holder.release()  # the earlier waiter first (FIFO), then the set
    waiting.join(10)
    assert before == [True] and [i.owner for i in locks.get_many([b])] == ["earlier"]
    assert queued(redis_client, b) == 1 and not result
    earlier.release()
    taker.join(10)
    assert result == [True]
    assert {info.name: info.owner for info in locks.get_many([a, b, c])} == {
        n: group[n].owner for n in (a, b, c)
    }
    group.release()
    assert locks.get_many([a, b, c]) == []


def test_a_set_that_does_not_wait_makes_one_attempt_at_each_lock(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    names = [f"{name}:1", f"{name}:2", f"{name}:3"]
    with counted.lock_many(names, ttl=30):
        pass
    other = counted.lock(f"{name}:2", owner="other", ttl=30)
    assert other.acquire()
    group = counted.lock_many(names, ttl=30, blocking=False)
    before = _sent(counting_proxy)
    assert not group.acquire()
    # One batch of attempts, one batch giving back the two granted around the busy one.
    assert _sent(counting_proxy) - before == 2
    assert group.missed == f"{name}:2"
    assert [info.owner for info in counted.get_many(names)] == ["other"]
    with pytest.raises(LockNotAcquired, match=f"{name}:2"):
        with counted.lock_many(names, ttl=30, timeout=0):
            pytest.fail("entered without every lock")
    other.release()


def test_a_name_in_use_as_another_primitive_is_refused_and_nothing_is_held(name: str) -> None:
    from django_redislock import locks

    names = [f"{name}:1", f"{name}:2", f"{name}:3"]
    permit = locks.semaphore(f"{name}:2", 2, ttl=30)
    assert permit.acquire()
    try:
        with pytest.raises(LockMismatch, match="semaphore"):
            with locks.lock_many(names, ttl=30, timeout=1):
                pytest.fail("entered a set with a semaphore's name in it")
        infos = locks.get_many(names)
        assert [(info.name, info.primitive) for info in infos] == [(f"{name}:2", "semaphore")]
    finally:
        permit.release()


def test_signals_tell_each_lock_of_the_set_once(name: str, redis_client: redis.Redis) -> None:
    from django_redislock import locks

    names = [f"{name}:1", f"{name}:2"]
    busy = locks.lock(f"{name}:2", owner="busy", ttl=30)
    assert busy.acquire()
    acquired: list[str] = []
    refused: list[str] = []

    def on_acquired(sender: Any, name: str, owner: str, **_: Any) -> None:
        acquired.append(name)

    def on_refused(sender: Any, name: str, owner: str, **_: Any) -> None:
        refused.append(name)

    signals.lock_acquired.connect(on_acquired)
    signals.lock_not_acquired.connect(on_refused)
    try:
        group = locks.lock_many(names, ttl=30, timeout=10, owner="the set")
        done: list[bool] = []
        taker = threading.Thread(target=lambda: done.append(group.acquire()))
        taker.start()
        wait_until(lambda: queued(redis_client, f"{name}:2") == 1)
        busy.release()
        taker.join(10)
        assert done == [True]
        group.release()
    finally:
        signals.lock_acquired.disconnect(on_acquired)
        signals.lock_not_acquired.disconnect(on_refused)
    # The batch's refused attempt at the busy lock is no outcome of the set: its wait is.
    assert acquired == [f"{name}:1", f"{name}:2"]
    assert refused == []


def test_a_batch_whose_reply_was_lost_is_sent_again_and_counts_once(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    """A real fault: the counting_proxy swallows the batch's reply and cuts the connection; the
    batch is sent again with the same nonces, so each lock is held once."""
    names = [f"{name}:1", f"{name}:2", f"{name}:3"]
    with counted.lock_many(names, ttl=30):
        pass
    group = counted.lock_many(names, ttl=30, timeout=5)
    counting_proxy.drop_next_replies(1)
    assert group.acquire()
    assert counting_proxy.dropped == 1
    infos = counted.get_many(names)
    assert [info.hold_count for info in infos] == [1, 1, 1]
    group.release()
    assert counted.get_many(names) == []


def test_asyncio_a_set_cancelled_mid_batch_gives_back_what_it_got(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    """Cancelled while the batch's reply is held back by the counting_proxy (a slow network):
    whatever the batch was granted is found and given back in the background."""
    names = [f"{name}:1", f"{name}:2", f"{name}:3"]

    async def main() -> None:
        try:
            async with counted.lock_many(names, ttl=30):
                pass
            counting_proxy.reply_delay = 0.3
            sent = _sent(counting_proxy)
            task = asyncio.ensure_future(counted.lock_many(names, ttl=30).aacquire())
            deadline = time.monotonic() + 5
            while _sent(counting_proxy) == sent:  # the batch is on its way
                assert time.monotonic() < deadline, "the batch was never sent"
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            counting_proxy.reply_delay = 0.0
            deadline = time.monotonic() + 10
            while await counted.aget_many(names):
                assert time.monotonic() < deadline, "the batch's grants were never given back"
                await asyncio.sleep(0.02)
        finally:
            await counted.source.abackend().aclose()

    asyncio.run(main())


def test_redlock_and_wait_replicas_sets_go_one_lock_at_a_time(masters: list[Any]) -> None:
    """Not batched (a Redlock grant needs a majority; a grant waiting for replicas is
    settled call by call): the set still takes every lock and gives every one back."""
    from django_redislock.primitives import at_once
    from tests.replication import ReplicatedPair

    names = ["many:1", "many:2", "many:3"]
    redlock = LockManager(redlock_caches=[s.url for s in masters])
    group = redlock.lock_many(names, ttl=30, timeout=5)
    assert at_once.batch_backend(group.locks) is None
    with group as held:
        assert all(held.fencing_tokens.values())
        assert len(redlock.get_many(names)) == 3
    assert redlock.get_many(names) == []

    pair = ReplicatedPair(through_proxy=False)
    try:
        primary = LockManager(url=f"redis://127.0.0.1:{pair.primary.port}/0")
        group = primary.lock_many(names, ttl=30, timeout=5, wait_replicas=1)
        assert at_once.batch_backend(group.locks) is None
        with group:
            replica_keys = pair.replica_client.keys("redislock:{many:*}")
            assert len(replica_keys) == 3  # each grant reached the replica before returning
        assert primary.get_many(names) == []
    finally:
        pair.stop()


def test_after_waiting_for_a_busy_lock_the_locks_after_it_go_at_once(
    counted: LockManager, counting_proxy: TcpProxy, redis_client: redis.Redis, name: str
) -> None:
    from django_redislock import locks  # the blocker's calls do not go through the counting_proxy

    names = [f"{name}:{x}" for x in "abcd"]
    with counted.lock_many(names, ttl=30):
        pass
    counted.source.backend().hub().wait_ready()  # the wake-up subscription is made
    redis_client.script_load(claim_script.source)  # as after any earlier hand-off
    blocker = locks.lock(names[1], owner="blocker", ttl=30)
    assert blocker.acquire()
    group = counted.lock_many(names, ttl=30, timeout=10, owner="the set", auto_renew=False)
    done: list[bool] = []
    taker = threading.Thread(target=lambda: done.append(group.acquire()))
    taker.start()
    wait_until(lambda: queued(redis_client, names[1]) == 1)
    before = _sent(counting_proxy)
    blocker.release()  # handed to the set
    taker.join(10)
    assert done == [True]
    # The claim of the lock handed over, then one batch for the two locks after it.
    assert _sent(counting_proxy) - before == 2
    assert [info.owner for info in counted.get_many(names)] == ["the set"] * 4
    group.release()
    assert counted.get_many(names) == []


def test_a_set_that_does_not_wait_tells_the_missed_lock_s_receivers_once(name: str) -> None:
    """Its one attempt at the busy lock is that lock's one-attempt acquire: contended and
    not acquired, once each; the locks granted around it tell of their acquire."""
    from django_redislock import locks

    names = [f"{name}:1", f"{name}:2", f"{name}:3"]
    busy = locks.lock(f"{name}:2", owner="busy", ttl=30)
    assert busy.acquire()
    heard: list[tuple[str, str]] = []

    def listener(kind: str) -> Any:
        def receive(sender: Any, name: str, owner: str, **_: Any) -> None:
            if owner != "busy":
                heard.append((kind, name))

        return receive

    receivers = {
        signals.lock_acquired: listener("acquired"),
        signals.lock_not_acquired: listener("not acquired"),
        signals.lock_contended: listener("contended"),
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    try:
        assert not locks.lock_many(names, ttl=30, blocking=False).acquire()
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
        busy.release()
    assert sorted(heard) == sorted(
        [
            ("acquired", f"{name}:1"),
            ("acquired", f"{name}:3"),
            ("contended", f"{name}:2"),
            ("not acquired", f"{name}:2"),
        ]
    )


def test_a_receiver_that_raises_leaves_no_lock_of_the_set_held(name: str) -> None:
    """A ``lock_acquired`` receiver raising while the batch's grants are recorded: the
    error reaches the caller, and every lock the batch was granted is given back."""
    from django_redislock import locks

    names = [f"{name}:1", f"{name}:2", f"{name}:3"]

    class Refused(Exception):
        pass

    def receiver(sender: Any, name: str, **_: Any) -> None:
        if name.endswith(":2"):
            raise Refused(name)

    signals.lock_acquired.connect(receiver)
    try:
        with pytest.raises(Refused):
            with locks.lock_many(names, ttl=30, timeout=1):
                pytest.fail("entered although a receiver raised")
    finally:
        signals.lock_acquired.disconnect(receiver)
    assert locks.get_many(names) == []
