"""The same lock behaviour on every engine: one Redis, Sentinel with a replica the
grants wait for, Redis Cluster (3 primaries + 3 replicas), Redlock over
independent masters.

Each engine is started for real by its fixture (module scope, so once per run);
the tests take a ``LockManager`` on it and check what must hold everywhere. What
only some engines do (a FIFO hand-off, replica acknowledgements, quorum votes)
is tested in that engine's own module.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.sentinel
from django.conf import settings
from django.test import override_settings

from django_redislock import LockError, LockManager, LockNotAcquired
from tests.holding import wait_until
from tests.replication import SERVICE, SentinelSetup


def _plain() -> Iterator[LockManager]:
    yield LockManager(url=settings.REDIS_URL)


def _sentinel() -> Iterator[LockManager]:
    setup = SentinelSetup()
    try:
        sentinel = redis.sentinel.Sentinel(setup.sentinels, socket_timeout=2)
        client = sentinel.master_for(SERVICE, socket_timeout=2)
        with override_settings(REDISLOCK_WAIT_REPLICAS=1):
            yield LockManager(client=client)
    finally:
        setup.stop()


def _cluster() -> Iterator[LockManager]:
    from tests.redis_cluster import shared_cluster

    client = shared_cluster().client()
    # The cluster outlives the test (one per process), and so would its keys: every
    # fencing counter earlier tests left makes a SCAN page through more of them.
    client.flushall(target_nodes=client.PRIMARIES)
    yield LockManager(client=client)


def _cluster_wait() -> Iterator[LockManager]:
    with override_settings(REDISLOCK_WAIT_REPLICAS=1):  # each shard's replica confirms
        yield from _cluster()


def _redlock() -> Iterator[LockManager]:
    from tests.redlock_servers import shared_masters

    yield LockManager(redlock_caches=[m.url for m in shared_masters()])


def _redlock_monotonic() -> Iterator[LockManager]:
    with override_settings(REDISLOCK_REDLOCK_MONOTONIC_FENCING=True):
        yield from _redlock()


#: Engine name -> a generator of one LockManager on it (set-up before, tear-down after).
ENGINES: dict[str, Callable[[], Iterator[LockManager]]] = {
    "single": _plain,
    "sentinel-wait1": _sentinel,
    "cluster": _cluster,
    "cluster-wait1": _cluster_wait,
    "redlock": _redlock,
    "redlock-monotonic": _redlock_monotonic,
}


@pytest.fixture(scope="module", params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest) -> Iterator[LockManager]:
    yield from ENGINES[request.param]()


@pytest.fixture
def manager(engine: LockManager) -> LockManager:
    return engine


@pytest.fixture
def lock_name() -> str:
    return f"engines:{uuid.uuid4().hex[:12]}"


def test_acquire_release_and_inspect(manager: LockManager, lock_name: str) -> None:
    lock = manager.lock(lock_name, purpose="engine test", auto_renew=False)
    assert lock.acquire(blocking=False)
    assert lock.owned() and lock.locked()
    info = manager.get(lock_name)
    assert info is not None and info.owner == lock.owner and info.purpose == "engine test"
    assert lock_name in {i.name for i in manager.active()}
    assert lock.release() == 0
    assert not lock.locked()
    assert manager.get(lock_name) is None


def test_fencing_tokens_increase_across_holders(manager: LockManager, lock_name: str) -> None:
    tokens = []
    for i in range(5):
        with manager.lock(lock_name, owner=f"holder-{i}", auto_renew=False) as held:
            tokens.append(held.fencing_token)
    assert all(t is not None for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_reentry_and_contention(manager: LockManager, lock_name: str) -> None:
    mine = manager.lock(lock_name, owner="me", auto_renew=False)
    other = manager.lock(lock_name, owner="other", auto_renew=False)
    assert mine.acquire(blocking=False)
    assert mine.acquire(blocking=False)
    assert not other.acquire(blocking=False)
    with pytest.raises(LockNotAcquired):
        with manager.lock(lock_name, owner="other", blocking=False):
            pass
    assert mine.release() == 1
    assert not other.acquire(blocking=False)
    assert mine.release() == 0
    assert other.acquire(blocking=False)
    other.release()


def test_a_waiter_is_woken_by_the_release(manager: LockManager, lock_name: str) -> None:
    holder = manager.lock(lock_name, owner="holder", auto_renew=False)
    assert holder.acquire()
    outcome: list[tuple[bool, float]] = []
    started = threading.Event()

    def wait() -> None:
        started.set()
        got = manager.lock(lock_name, owner="waiter", auto_renew=False).acquire(timeout=10)
        outcome.append((got, time.monotonic()))

    thread = threading.Thread(target=wait)
    thread.start()
    started.wait(5)
    time.sleep(0.3)  # let it queue/park: a wake-up, not its first attempt, must get it
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert outcome and outcome[0][0]
    # Woken by the release, not by the ~1 s fallback poll.
    assert outcome[0][1] - released < 0.5
    manager.force_release(lock_name)


def test_a_timed_out_wait_gives_up(manager: LockManager, lock_name: str) -> None:
    holder = manager.lock(lock_name, owner="holder", auto_renew=False)
    assert holder.acquire()
    started = time.monotonic()
    assert not manager.lock(lock_name, owner="waiter").acquire(timeout=0.3)
    assert 0.25 <= time.monotonic() - started < 3
    holder.release()
    assert manager.lock(lock_name, owner="third", auto_renew=False).acquire(blocking=False)
    manager.force_release(lock_name)


def test_the_watchdog_keeps_a_short_lease_alive(manager: LockManager, lock_name: str) -> None:
    holder = manager.lock(lock_name, ttl=0.6, owner="holder")
    assert holder.acquire()
    deadline = time.monotonic() + 1.8  # three leases
    while time.monotonic() < deadline:
        assert not manager.lock(lock_name, owner="other").acquire(blocking=False)
        time.sleep(0.1)
    assert not holder.lost
    assert holder.release() == 0


def test_a_dead_holders_lease_runs_out(manager: LockManager, lock_name: str) -> None:
    assert manager.lock(lock_name, ttl=0.3, owner="dead", auto_renew=False).acquire()
    other = manager.lock(lock_name, owner="alive", auto_renew=False)
    assert other.acquire(timeout=5)
    other.release()


def test_force_release_and_paging(manager: LockManager, lock_name: str) -> None:
    names = [f"{lock_name}:{i}" for i in range(40)]
    held = [manager.lock(n, owner="pager", auto_renew=False) for n in names]
    for lock in held:
        assert lock.acquire(blocking=False)
    seen: list[str] = []
    cursor, pattern = "0", manager.backend().keyspace.match_pattern(lock_name)
    for _ in range(10_000):
        cursor, infos = manager.scan_page(cursor, pattern=pattern, count=7)
        seen += [i.name for i in infos if i.name.startswith(lock_name)]
        if cursor == "0":
            break
    assert sorted(seen) == sorted(names)
    assert manager.force_release(names[0])
    assert manager.get(names[0]) is None
    for lock in held[1:]:
        lock.release()


def test_async_with_between_tasks(manager: LockManager, lock_name: str) -> None:
    async def scenario() -> list[tuple[str, float, float]]:
        spans: list[tuple[str, float, float]] = []

        async def worker(i: int) -> None:
            for _ in range(5):
                async with manager.lock(lock_name, timeout=20, auto_renew=False):
                    start = time.monotonic()
                    await asyncio.sleep(0.005)
                    spans.append((f"task-{i}", start, time.monotonic()))

        await asyncio.gather(*(worker(i) for i in range(4)))
        return spans

    spans = sorted(asyncio.run(scenario()), key=lambda s: s[1])
    assert len(spans) == 20
    for before, after in zip(spans, spans[1:], strict=False):
        assert after[1] >= before[2], f"two holders at once: {before} {after}"


def test_no_lost_update_between_threads(manager: LockManager, lock_name: str) -> None:
    store = redis.Redis.from_url(settings.REDIS_URL)  # the data the lock guards
    counter, inside = f"{lock_name}:counter", f"{lock_name}:inside"
    overlaps: list[int] = []

    def work() -> None:
        lock = manager.lock(lock_name, timeout=30, auto_renew=False)
        for _ in range(20):
            with lock:
                if store.incr(inside) != 1:
                    overlaps.append(1)
                value = int(store.get(counter) or 0)
                time.sleep(0.001)
                store.set(counter, value + 1)
                store.decr(inside)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not overlaps
    assert int(store.get(counter) or 0) == 80


def _on_redlock(manager: LockManager) -> bool:
    from django_redislock.engine.backends.redlock import RedlockBase

    return isinstance(manager.backend(), RedlockBase)


def test_a_semaphore_admits_its_limit_and_hands_places_on(
    manager: LockManager, lock_name: str
) -> None:
    a = manager.semaphore(lock_name, 2, owner="a", ttl=10)
    if _on_redlock(manager):
        with pytest.raises(LockError, match="not available on Redlock"):
            a.acquire(blocking=False)
        return
    b = manager.semaphore(lock_name, 2, owner="b", ttl=10)
    assert a.acquire(blocking=False) and b.acquire(blocking=False)
    assert not manager.semaphore(lock_name, 2, owner="c").acquire(blocking=False)
    got = threading.Event()

    def wait() -> None:
        with manager.semaphore(lock_name, 2, owner="c", ttl=10, timeout=10):
            got.set()
            time.sleep(0.2)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.2)
    assert not got.is_set()
    a.release()
    assert got.wait(5)
    assert {h.owner for h in manager.get(lock_name).holders} == {"b", "c"}
    t.join(5)
    b.release()
    assert manager.get(lock_name) is None


def test_a_rw_lock_shares_reads_and_excludes_the_writer(
    manager: LockManager, lock_name: str
) -> None:
    if _on_redlock(manager):
        with pytest.raises(LockError, match="not available on Redlock"):
            manager.rw_lock(lock_name).write().acquire(blocking=False)
        return
    r1 = manager.rw_lock(lock_name, owner="r1", ttl=10).read()
    r2 = manager.rw_lock(lock_name, owner="r2", ttl=10).read()
    assert r1.acquire(blocking=False) and r2.acquire(blocking=False)
    wrote = threading.Event()

    def write() -> None:
        with manager.rw_lock(lock_name, ttl=10, timeout=10).write():
            wrote.set()

    t = threading.Thread(target=write)
    t.start()
    time.sleep(0.2)
    assert not wrote.is_set() and len(manager.get(lock_name).readers) == 2
    r1.release()
    r2.release()
    assert wrote.wait(5)
    t.join(5)
    assert manager.get(lock_name) is None


def test_a_barging_mutex_loses_no_update(manager: LockManager, lock_name: str) -> None:
    lock = manager.lock(lock_name, ttl=10, fair=False, timeout=30)
    counter = 0

    def work() -> None:
        nonlocal counter
        for _ in range(30):
            with lock:
                value = counter
                time.sleep(0.001)
                counter = value + 1

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert counter == 90 and manager.get(lock_name) is None


def test_waiters_are_listed_in_order(manager: LockManager, lock_name: str) -> None:
    holder = manager.lock(lock_name, owner="holder", auto_renew=False)
    assert holder.acquire()
    leave = threading.Event()
    threads = []

    def wait(owner: str, timeout: float | None) -> None:
        lock = manager.lock(lock_name, owner=owner, purpose=f"for {owner}", auto_renew=False)
        if lock.acquire(timeout=timeout):
            leave.wait(10)
            lock.release()

    try:
        for count, (owner, timeout) in enumerate((("first", None), ("second", 20.0)), 1):
            thread = threading.Thread(target=wait, args=(owner, timeout))
            thread.start()
            threads.append(thread)
            if not _on_redlock(manager):  # (no common queue there: nothing to wait for)
                wait_until(lambda n=count: len(_waiters(manager, lock_name)) == n)
        if _on_redlock(manager):
            info = manager.get(lock_name)
            assert info is not None and info.waiters == () and info.queue_length is None
            return
        first, second = _waiters(manager, lock_name)
        assert (first.owner, first.purpose, first.deadline) == ("first", "for first", None)
        assert (second.owner, second.purpose, second.mode) == ("second", "for second", "exclusive")
        assert first.waiting_since is not None and second.waiting_since is not None
        assert first.waiting_since <= second.waiting_since
        assert second.deadline is not None
        assert 19 < (second.deadline - second.waiting_since).total_seconds() <= 20.01
        assert manager.get(lock_name).queue_length == 2  # type: ignore[union-attr]
        holder.release()  # handed to "first": "second" is the whole queue now
        wait_until(lambda: [w.owner for w in _waiters(manager, lock_name)] == ["second"])
    finally:
        leave.set()
        if holder.owned():
            holder.release()
        for thread in threads:
            thread.join(15)
        manager.force_release(lock_name)


def _waiters(manager: LockManager, name: str) -> tuple[Any, ...]:
    info = manager.get(name)
    return () if info is None else info.waiters
