"""``locks.lock_many``: several locks taken in one global order, all or none within the
timeout, with one ``with`` / ``async with``, on one Redis and on a Redis Cluster; and
real processes taking random overlapping sets: no deadlock, no overlap per name."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from django_redislock import (
    LockLost,
    LockManager,
    LockNotAcquired,
    locks,
)
from django_redislock.exceptions import BlockingCallInEventLoop
from tests.test_multiprocess import _expect_line

ROOT = Path(__file__).resolve().parent.parent


def test_takes_every_lock_in_sorted_order_and_releases_them_all(name: str) -> None:
    names = [f"{name}:c", f"{name}:a", f"{name}:b"]
    with locks.lock_many(names, ttl=30, timeout=5) as held:
        assert held.names == tuple(sorted(names))
        assert [lock.name for lock in held] == sorted(names)
        assert len(held) == 3
        infos = locks.get_many(names)
        assert len(infos) == 3
        tokens = held.fencing_tokens
        assert set(tokens) == set(names) and all(tokens.values())
        assert held[f"{name}:b"].fencing_token == tokens[f"{name}:b"]
        assert held[f"{name}:a"].check() == tokens[f"{name}:a"]
        with pytest.raises(KeyError):
            held["other"]
    assert locks.get_many(names) == []


def test_all_or_none_within_the_timeout(name: str) -> None:
    names = [f"{name}:1", f"{name}:2", f"{name}:3"]
    blocker = locks.lock(f"{name}:2", owner="other", ttl=30)
    assert blocker.acquire()
    started = time.monotonic()
    group = locks.lock_many(names, ttl=30, timeout=0.4)
    with pytest.raises(LockNotAcquired, match="none of them is held now") as refused:
        with group:
            pytest.fail("entered without every lock")
    took = time.monotonic() - started
    assert 0.35 < took < 3.0, took
    assert refused.value.name == f"{name}:2" and group.missed == f"{name}:2"
    assert "within 0.4 s" in str(refused.value)
    held = locks.get_many(names)
    assert [info.owner for info in held] == ["other"]  # the first was given back
    assert not group.acquire(blocking=False)
    assert not group.acquire(timeout=0)
    blocker.release()
    assert group.acquire(timeout=0)
    group.release()
    assert locks.get_many(names) == []


def test_waits_for_a_busy_lock_then_takes_the_set(name: str) -> None:
    names = [f"{name}:1", f"{name}:2"]
    blocker = locks.lock(f"{name}:2", owner="other", ttl=30)
    assert blocker.acquire()
    timer = threading.Timer(0.3, blocker.release)
    timer.start()
    try:
        with locks.lock_many(names, ttl=30, timeout=10):
            assert len(locks.get_many(names)) == 2
    finally:
        timer.join(10)


def _opposite_orders(manager: LockManager, names: list[str], rounds: int) -> list[str]:
    """Two threads taking the same names listed in opposite orders, *rounds* times each:
    what went wrong (nothing, without a deadlock)."""
    problems: list[str] = []
    inside = {n: 0 for n in names}
    guard = threading.Lock()

    def worker(order: list[str]) -> None:
        for _ in range(rounds):
            try:
                with manager.lock_many(order, ttl=10, timeout=10):
                    with guard:
                        for n in names:
                            inside[n] += 1
                            if inside[n] != 1:
                                problems.append(f"overlap on {n}")
                    with guard:
                        for n in names:
                            inside[n] -= 1
            except LockNotAcquired as error:
                problems.append(str(error))

    threads = [threading.Thread(target=worker, args=(order,)) for order in (names, names[::-1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a thread never finished (deadlock)"
    return problems


def test_opposite_orders_never_deadlock(name: str) -> None:
    assert _opposite_orders(locks, [f"{name}:a", f"{name}:b", f"{name}:c"], 40) == []


def test_a_lock_lost_meanwhile_raises_at_the_end_and_the_others_are_released(name: str) -> None:
    names = [f"{name}:1", f"{name}:2"]
    with pytest.raises(LockLost, match=f"{name}:1"):
        with locks.lock_many(names, ttl=30):
            locks.force_release(f"{name}:1")
    assert locks.get_many(names) == []


def test_async_with_and_a_cancelled_wait_gives_back_what_it_took(name: str) -> None:
    names = [f"{name}:1", f"{name}:2"]

    async def main() -> None:
        try:
            async with locks.lock_many(names, ttl=30, timeout=5) as held:
                assert len(await locks.aget_many(names)) == 2
                assert all(held.fencing_tokens.values())
            assert await locks.aget_many(names) == []
            blocker = locks.lock(f"{name}:2", owner="other", ttl=30)
            assert await blocker.aacquire()
            group = locks.lock_many(names, ttl=30)
            task = asyncio.ensure_future(group.aacquire())
            deadline = time.monotonic() + 10
            while not await locks.aget(f"{name}:1"):  # it took the first, waits for the second
                assert time.monotonic() < deadline, "lock_many never took the first lock"
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            infos = await locks.aget_many(names)
            assert [info.owner for info in infos] == ["other"]
            await blocker.arelease()
            again = locks.lock_many(names, ttl=30)
            assert await again.aacquire(blocking=False)
            await again.arelease()
        finally:
            await locks.source.abackend().aclose()

    asyncio.run(main())
    assert locks.get_many(names) == []


def test_misuse_is_refused_with_a_named_error(name: str) -> None:
    with pytest.raises(TypeError, match="not one name"):
        locks.lock_many(name)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one name"):
        locks.lock_many([])
    with pytest.raises(ValueError, match="same name twice"):
        locks.lock_many([f"{name}:1", f"{name}:2", f"{name}:1"])
    with pytest.raises(ValueError):
        locks.lock_many([f"{name}:1", ""])
    with pytest.raises(ValueError):
        locks.lock_many([f"{name}:1"], timeout=-1)

    async def blocking_in_a_loop() -> None:
        with locks.lock_many([f"{name}:1"]):
            pass

    with pytest.raises(BlockingCallInEventLoop):
        asyncio.run(blocking_in_a_loop())
    assert locks.get(f"{name}:1") is None


# -- Redis Cluster ------------------------------------------------------------------------


@pytest.mark.slow
def test_on_a_cluster_names_in_different_slots() -> None:
    from tests.redis_cluster import shared_cluster
    from tests.test_cluster import names_on_each_primary, primary_of

    m = LockManager(client=shared_cluster().client())
    names = names_on_each_primary(m, f"many{uuid.uuid4().hex[:6]}:")
    assert len({primary_of(m, n) for n in names}) == 3
    with m.lock_many(names, ttl=30, timeout=5) as held:
        assert len(m.get_many(names)) == 3
        assert all(lock.check() for lock in held)
    assert m.get_many(names) == []
    assert _opposite_orders(m, names, 20) == []

    async def main() -> None:
        try:
            async with m.lock_many(names[::-1], ttl=30, timeout=5) as held:
                assert held.names == tuple(sorted(names))
                assert len(await m.aget_many(names)) == 3
                assert all([await lock.acheck() for lock in held])
            assert await m.aget_many(names) == []
        finally:
            await m.source.abackend().aclose()

    asyncio.run(main())


# -- real processes -------------------------------------------------------------------------

#: Processes (the test machine has two cores) and how long each takes random sets.
PROCESSES, SECONDS = 4, 10.0


def _contend(prefix: str, redis_client: redis.Redis, cluster_url: str = "") -> None:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    extra = [cluster_url] if cluster_url else []
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.lock_many_proc", prefix, str(SECONDS), str(i), *extra],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(PROCESSES)
    ]
    try:
        for child in children:
            _expect_line(child, "ready", 60)
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        # Bounded: SECONDS of work, plus one set's timeout for the last set.
        results = [_expect_line(child, "done", SECONDS + 40)[1:] for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait(10)
    taken = [int(r[0]) for r in results]
    timed_out = [int(r[1]) for r in results]
    assert timed_out == [0] * PROCESSES, f"sets that timed out (a deadlock?): {timed_out}"
    assert all(t > 20 for t in taken), f"too few sets taken: {taken}"
    assert redis_client.get(f"{prefix}violations") is None, "two holders of one name at once"
    inside = [redis_client.get(f"{prefix}inside:{prefix}{i}") for i in range(10)]
    assert all(v in (None, b"0") for v in inside), f"left inside: {inside}"


@pytest.mark.slow
def test_processes_taking_random_sets_never_deadlock_nor_overlap(
    name: str, redis_client: redis.Redis
) -> None:
    _contend(f"{name}:", redis_client)


@pytest.mark.slow
def test_processes_taking_random_sets_on_a_cluster(name: str, redis_client: redis.Redis) -> None:
    from tests.redis_cluster import shared_cluster

    _contend(f"{name}:", redis_client, shared_cluster().url)
