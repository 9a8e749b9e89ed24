"""Semaphores in one process (threads and asyncio tasks) on a real Redis: the limit,
FIFO hand-off, per-holder leases and renewal, re-entrancy, refusals, operator actions.

The multi-process invariants (SIGKILL, clock skew, many processes) are in
tests/test_primitives_procs.py.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_redislock import (
    LimitMismatch,
    LockError,
    LockManager,
    LockMismatch,
    LockNotAcquired,
    LockNotOwned,
    locks,
)
from tests.holding import Holder, queued, wait_until


def test_at_most_limit_holders_and_fifo_hand_off(
    manager: LockManager, name: str, redis_client
) -> None:
    sem = manager.semaphore(name, 2, ttl=10, timeout=10)
    order: list[str] = []
    holders = [Holder(sem, order, f"h{i}") for i in range(2)]
    for h in holders:
        h.start()
        assert h.holding.wait(5)
    waiters = [Holder(sem, order, f"w{i}") for i in range(3)]
    for i, w in enumerate(waiters):  # queued one by one: their order is known
        w.start()
        wait_until(lambda i=i: queued(redis_client, name) == i + 1)
    info = manager.get(name)
    assert info is not None and info.primitive == "semaphore" and info.limit == 2
    assert len(info.holders) == 2 and {h.mode for h in info.holders} == {"permit"}
    assert not any(w.holding.is_set() for w in waiters)

    holders[0].leave.set()  # one place frees: the first waiter, and only it, gets it
    assert waiters[0].holding.wait(5)
    time.sleep(0.2)
    assert not waiters[1].holding.is_set() and len(manager.get(name).holders) == 2
    # One place at a time, so that the log's order is the grants' order: two grants
    # made together would be logged in whichever order their threads woke.
    holders[1].leave.set()
    assert waiters[1].holding.wait(5)
    assert not waiters[2].holding.is_set()
    waiters[0].leave.set()
    assert waiters[2].holding.wait(5)
    for t in [holders[1], waiters[0], waiters[1], waiters[2]]:
        t.leave.set()
        t.join(10)
    assert [t.error for t in holders + waiters] == [None] * 5
    assert order == ["h0", "h1", "w0", "w1", "w2"]
    assert manager.get(name) is None


def test_threads_never_exceed_the_limit(name: str) -> None:
    sem = locks.semaphore(name, 3, ttl=10, timeout=30)
    inside, most, guard = 0, 0, threading.Lock()
    done = 0

    def work() -> None:
        nonlocal inside, most, done
        for _ in range(25):
            with sem:
                with guard:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.002)
                with guard:
                    inside -= 1
        with guard:
            done += 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert done == 8
    assert most == 3  # the limit, reached and never passed


def test_each_permit_has_its_own_lease_token_and_record(name: str) -> None:
    short = locks.semaphore(name, 3, ttl=0.4, auto_renew=False)
    long = locks.semaphore(name, 3, ttl=20)
    held = threading.Event()
    release = threading.Event()

    def hold_long() -> None:
        with long:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold_long)
    t.start()
    assert held.wait(5)
    assert short.acquire(blocking=False)
    info = locks.get(name)
    leases = sorted(h.lease for h in info.holders)
    assert leases == [0.4, 20.0]
    tokens = [h.fencing_token for h in info.holders]
    assert len(set(tokens)) == 2 and short.fencing_token in tokens
    # The short permit runs out by Redis's clock; the long one keeps its lease.
    wait_until(lambda: len(locks.get(name).holders) == 1, timeout=3)
    remaining = locks.get(name).holders[0]
    assert remaining.lease == 20.0 and remaining.ttl > 18
    with pytest.raises(LockNotOwned):
        short.release()
    release.set()
    t.join(5)


def test_the_watchdog_renews_each_permit(name: str) -> None:
    sem = locks.semaphore(name, 2, ttl=0.6)
    with sem:
        time.sleep(1.5)  # more than two leases
        assert sem.owned()
        (holder,) = locks.get(name).holders
        assert holder.owner == sem.owner and 0 < holder.ttl <= 0.6
    assert locks.get(name) is None


def test_a_permit_is_reentrant_per_owner(name: str) -> None:
    sem = locks.semaphore(name, 1, ttl=10)
    with sem:
        with sem:  # the same owner: one permit, two holds (limit 1 does not deadlock)
            (holder,) = locks.get(name).holders
            assert holder.hold_count == 2
        assert sem.owned()
    assert not sem.owned() and locks.get(name) is None


def test_misuse_is_refused_with_a_clear_error(name: str, redis_client) -> None:
    with pytest.raises(ValueError, match="between 1 and"):
        locks.semaphore(name, 0)
    with pytest.raises(TypeError, match="whole number"):
        locks.semaphore(name, 2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="whole number"):
        locks.semaphore(name, True)
    with pytest.raises(ValueError, match="own lease"):
        locks.semaphore(name, 2, ttl=None, no_expiry=True)
    with pytest.raises(ValueError, match="fair=False"):
        locks.semaphore(name, 2, fair=False)

    sem = locks.semaphore(name, 2, ttl=10)
    with sem:
        with pytest.raises(LimitMismatch, match="limit=2, not 3") as caught:
            locks.semaphore(name, 3).acquire(blocking=False)
        assert caught.value.limit == 3 and caught.value.existing_limit == 2
        with pytest.raises(LockMismatch, match="in use as a semaphore"):
            locks.lock(name).acquire(blocking=False)
        other = locks.semaphore(name, 2, owner="someone-else")
        with pytest.raises(LockNotOwned):
            other.release()  # a foreign release changes nothing
        assert len(locks.get(name).holders) == 1
    with pytest.raises(LockNotOwned):
        sem.release()  # a double release: nothing to give back, no permit inflation
    with locks.lock(name):
        with pytest.raises(LockMismatch, match="in use as a mutex"):
            sem.acquire(blocking=False)
    # Once nobody holds it, the limit may change.
    with locks.semaphore(name, 5):
        assert locks.get(name).limit == 5


def test_blocking_timeout_and_not_acquired(name: str) -> None:
    a = locks.semaphore(name, 1, ttl=10, owner="a")
    b = locks.semaphore(name, 1, ttl=10, owner="b", timeout=0.3)
    with a:
        started = time.monotonic()
        assert not b.acquire()
        assert 0.25 < time.monotonic() - started < 3
        with pytest.raises(LockNotAcquired):
            with b:
                pass
    assert b.acquire(blocking=False)
    b.release()
    assert locks.get(name) is None


def test_extend_and_operator_actions_act_on_one_holder(name: str, redis_client) -> None:
    a = locks.semaphore(name, 3, ttl=5, owner="a", auto_renew=False)
    b = locks.semaphore(name, 3, ttl=5, owner="b", auto_renew=False)
    assert a.acquire(blocking=False) and b.acquire(blocking=False)
    assert a.extend(10)
    holders = {h.owner: h for h in locks.get(name).holders}
    assert holders["a"].ttl > 13 and holders["b"].ttl <= 5

    assert not locks.force_release(name, owner="b", fencing_token=holders["a"].fencing_token)
    assert locks.force_release(name, owner="b", fencing_token=holders["b"].fencing_token)
    assert [h.owner for h in locks.get(name).holders] == ["a"]
    result = locks.force_extend(name, 30, owner="a")
    assert result.extended and result.ttl > 40
    with pytest.raises(LockNotOwned):
        b.release()
    assert locks.force_release(name)  # every holder
    assert locks.get(name) is None


def test_a_force_release_hands_the_place_to_the_first_waiter(name: str, redis_client) -> None:
    holder = locks.semaphore(name, 1, ttl=30, owner="stuck", auto_renew=False)
    assert holder.acquire(blocking=False)
    got = threading.Event()

    def wait() -> None:
        with locks.semaphore(name, 1, ttl=10, timeout=10):
            got.set()

    t = threading.Thread(target=wait)
    t.start()
    wait_until(lambda: queued(redis_client, name) == 1)
    assert locks.force_release(name, owner="stuck")
    assert got.wait(3)
    t.join(5)


def test_async_tasks_share_the_limit(name: str) -> None:
    async def main() -> int:
        sem = locks.semaphore(name, 2, ttl=10, timeout=20)
        inside = most = 0

        async def work() -> None:
            nonlocal inside, most
            for _ in range(10):
                async with sem:
                    inside += 1
                    most = max(most, inside)
                    await asyncio.sleep(0.005)
                    inside -= 1

        await asyncio.gather(*(work() for _ in range(6)))
        assert await locks.aget(name) is None
        return most

    assert asyncio.run(main()) == 2


def test_semaphores_are_refused_on_redlock(name: str) -> None:
    from tests.redlock_servers import shared_masters

    masters = shared_masters()
    manager = LockManager(redlock_caches=[m.url for m in masters])
    with pytest.raises(LockError, match="not available on Redlock"):
        manager.semaphore(name, 2).acquire(blocking=False)
    with pytest.raises(LockError, match="not available on Redlock"):
        manager.rw_lock(name).read().acquire(blocking=False)


def test_ttl_is_the_callers_own_lease(name: str, caplog: pytest.LogCaptureFixture) -> None:
    mine = locks.semaphore(name, 2, ttl=5, auto_renew=False)
    other = locks.semaphore(name, 2, ttl=30, owner="other", auto_renew=False)
    assert mine.ttl() is None
    assert mine.acquire(blocking=False) and other.acquire(blocking=False)
    assert 0 < mine.ttl() <= 5 and 25 < other.ttl() <= 30
    token = other.fencing_token
    with caplog.at_level("WARNING", logger="django_redislock"):
        assert locks.force_release(name, owner="other")
    assert f"permit owner other, fencing token {token}" in caplog.text
    assert mine.owned()
    mine.release()
