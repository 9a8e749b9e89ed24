"""Read-write locks in one process (threads and asyncio tasks) on a real Redis:
shared reads, exclusive writes, the phase-fair queue, re-entrancy, downgrade, the
refused upgrade, per-reader leases.

The multi-process invariants (overlap checker, fairness under load, SIGKILL,
clock skew) are in tests/test_primitives_procs.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from django_redislock import LockManager, LockNotOwned, LockUpgradeError, locks
from tests.holding import Holder, queued, wait_until


def test_many_readers_or_one_writer(manager: LockManager, name: str) -> None:
    rw = manager.rw_lock(name, ttl=10, timeout=10)
    log: list[str] = []
    readers = [Holder(rw.read(), log, f"r{i}") for i in range(3)]
    for r in readers:
        r.start()
    assert all(r.holding.wait(5) for r in readers)  # all three at once
    info = manager.get(name)
    assert info.primitive == "rwlock" and len(info.readers) == 3 and info.writer is None
    writer = Holder(rw.write(), log, "w")
    writer.start()
    time.sleep(0.2)
    assert not writer.holding.is_set()
    for r in readers[:2]:
        r.leave.set()
        r.join(5)
    time.sleep(0.2)
    assert not writer.holding.is_set()  # one reader still reads
    readers[2].leave.set()
    assert writer.holding.wait(5)
    info = manager.get(name)
    assert info.writer.owner == info.owner and info.readers == ()
    assert writer.token > max(r.token for r in readers)  # writers get later tokens
    writer.leave.set()
    writer.join(5)
    assert manager.get(name) is None


def test_a_write_release_admits_every_head_reader_at_once(name: str, redis_client) -> None:
    rw = locks.rw_lock(name, ttl=10, timeout=10)
    log: list[str] = []
    writer = Holder(rw.write(), log, "w1")
    writer.start()
    assert writer.holding.wait(5)
    readers = [Holder(rw.read(), log, f"r{i}") for i in range(4)]
    for i, r in enumerate(readers):
        r.start()
        wait_until(lambda i=i: queued(redis_client, name) == i + 1)
    second_writer = Holder(rw.write(), log, "w2")
    second_writer.start()
    wait_until(lambda: queued(redis_client, name) == 5)

    writer.leave.set()
    assert all(r.holding.wait(5) for r in readers)
    # The one release granted all four readers (still holding) and not the writer behind them.
    info = locks.get(name)
    assert len(info.readers) == 4 and info.writer is None
    assert queued(redis_client, name) == 1 and not second_writer.holding.is_set()
    for r in readers:
        r.leave.set()
        r.join(5)
    assert second_writer.holding.wait(5)
    second_writer.leave.set()
    second_writer.join(5)
    assert log[0] == "w1" and sorted(log[1:5]) == ["r0", "r1", "r2", "r3"] and log[5] == "w2"


def test_a_reader_arriving_behind_a_queued_writer_waits(name: str, redis_client) -> None:
    rw = locks.rw_lock(name, ttl=10, timeout=10)
    log: list[str] = []
    first = Holder(rw.read(), log, "r1")
    first.start()
    assert first.holding.wait(5)
    writer = Holder(rw.write(), log, "w")
    writer.start()
    wait_until(lambda: queued(redis_client, name) == 1)
    late = Holder(rw.read(), log, "r2")
    late.start()
    wait_until(lambda: queued(redis_client, name) == 2)
    assert not late.holding.is_set()  # phase-fair: it does not overtake the writer
    first.leave.set()
    assert writer.holding.wait(5)
    assert not late.holding.is_set()
    writer.leave.set()
    assert late.holding.wait(5)
    late.leave.set()
    for t in (first, writer, late):
        t.join(5)
    assert log == ["r1", "w", "r2"]


def test_reentrancy_downgrade_and_the_refused_upgrade(name: str, redis_client) -> None:
    rw = locks.rw_lock(name, ttl=10, timeout=5)
    read, write = rw.read(), rw.write()
    assert rw.read() is read and rw.write() is write
    with read:
        with read:
            assert locks.get(name).readers[0].hold_count == 2
            with pytest.raises(LockUpgradeError, match="release the read first"):
                write.acquire()
        assert read.owned()
    assert locks.get(name) is None

    with write:
        with write:
            assert locks.get(name).writer.hold_count == 2
        with read:  # a downgrade: the writer takes the read too
            assert {h.mode for h in locks.get(name).holders} == {"read", "write"}
        assert write.owned() and not read.owned()
    assert locks.get(name) is None

    # Downgrade then release the write: the owner keeps reading and others may read.
    write.acquire()
    read.acquire()
    write.release()
    other = locks.rw_lock(name, owner="other").read()
    assert other.acquire(blocking=False)
    assert len(locks.get(name).readers) == 2
    other.release()
    read.release()
    assert locks.get(name) is None


def test_a_reentrant_read_is_granted_while_a_writer_waits(name: str, redis_client) -> None:
    rw = locks.rw_lock(name, ttl=10, timeout=10)
    log: list[str] = []
    read = rw.read()
    read.acquire()
    writer = Holder(rw.write(), log, "w")
    writer.start()
    wait_until(lambda: queued(redis_client, name) == 1)
    assert read.acquire(timeout=2)  # no self-deadlock behind the waiting writer
    read.release()
    read.release()
    assert writer.holding.wait(5)
    writer.leave.set()
    writer.join(5)


def test_a_short_reader_never_shortens_a_long_one(name: str) -> None:
    long = locks.rw_lock(name, ttl=20, owner="long").read()
    short = locks.rw_lock(name, ttl=0.3, owner="short", auto_renew=False).read()
    writer = locks.rw_lock(name, ttl=5, owner="writer").write()
    assert long.acquire(blocking=False) and short.acquire(blocking=False)
    wait_until(lambda: len(locks.get(name).readers) == 1, timeout=3)
    (left,) = locks.get(name).readers
    assert left.owner == "long" and left.ttl > 18
    assert not writer.acquire(blocking=False)  # the long reader still reads
    with pytest.raises(LockNotOwned):
        short.release()
    long.release()
    assert writer.acquire(blocking=False)
    writer.release()


def test_an_expired_reader_frees_its_share(name: str) -> None:
    dead = locks.rw_lock(name, ttl=0.5, owner="crashed", auto_renew=False).read()
    assert dead.acquire(blocking=False)
    started = time.monotonic()
    with locks.rw_lock(name, ttl=5, timeout=5).write():
        waited = time.monotonic() - started
    assert waited < 2.5  # the reader's lease (0.5 s), and a fallback poll at most


def test_extend_a_read(name: str) -> None:
    read = locks.rw_lock(name, ttl=5, auto_renew=False).read()
    with read:
        assert read.extend(20)
        assert locks.get(name).readers[0].ttl > 20
        assert read.extend(3, replace_ttl=True)
        assert locks.get(name).readers[0].ttl <= 3


def test_async_readers_and_writers(name: str) -> None:
    async def main() -> tuple[int, int]:
        rw = locks.rw_lock(name, ttl=10, timeout=20)
        readers = writers = most_readers = 0
        bad = 0

        async def read() -> None:
            nonlocal readers, most_readers, bad
            for _ in range(8):
                async with rw.read():
                    readers += 1
                    most_readers = max(most_readers, readers)
                    bad += writers
                    await asyncio.sleep(0.003)
                    readers -= 1

        async def write() -> None:
            nonlocal writers, bad
            for _ in range(5):
                async with rw.write():
                    writers += 1
                    bad += readers + writers - 1
                    await asyncio.sleep(0.003)
                    writers -= 1

        await asyncio.gather(*(read() for _ in range(4)), *(write() for _ in range(2)))
        return most_readers, bad

    most_readers, bad = asyncio.run(main())
    assert bad == 0 and most_readers >= 2
