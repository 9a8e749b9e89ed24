"""fair=True (hand-off, FIFO) against fair=False (barging) on a real Redis.

A queued waiter in a child process is stopped with SIGSTOP (a real fault: the
process is alive, its queue entry too, but it cannot act), which shows what a
release does with the lock by itself: a fair release hands it to that waiter, a
barging release frees it so that the releasing process can take it straight back.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from django_redislock import locks
from django_redislock.engine import flows
from tests.holding import queued, queued_waiter
from tests.test_multiprocess import _expect_line, _spawn

pytestmark = pytest.mark.slow


@pytest.fixture
def stopped_waiter(name: str, redis_client) -> Iterator[None]:
    """*name* held by this test's thread, with a child process queued for it and stopped."""
    child = _spawn("wait_for", name, "10")
    try:
        _expect_line(child, "waiting")
        deadline = time.monotonic() + 10
        while queued(redis_client, name) != 1:
            assert time.monotonic() < deadline, "the child never queued"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGSTOP)
        yield
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "barging"])
def test_what_a_release_does_with_a_queued_waiter(
    fair: bool, name: str, redis_client, request: pytest.FixtureRequest
) -> None:
    lock = locks.lock(name, ttl=10, fair=fair)
    assert lock.acquire(blocking=False)
    request.getfixturevalue("stopped_waiter")
    lock.release()
    info = locks.get(name)
    if fair:
        # Handed to the (stopped) waiter, leased for the claim window until it claims it.
        assert info is not None and info.owner != lock.owner
        assert not lock.acquire(blocking=False)
    else:
        # Freed, and the waiter was only woken: the releasing thread takes it straight back.
        assert info is None and queued(redis_client, name) == 1
        assert lock.acquire(blocking=False)
        lock.release()


def test_a_barging_release_wakes_the_waiter_rather_than_letting_it_poll(
    name: str, monkeypatch: pytest.MonkeyPatch, redis_client
) -> None:
    # Without a wake-up, a waiter would only look again at its fallback poll:
    # lengthened here to a minute, so only the release's poke can wake it in time.
    monkeypatch.setattr(flows, "POLL_SLICE", 60.0)
    lock = locks.lock(name, ttl=60, fair=False)
    assert lock.acquire(blocking=False)
    t, got = queued_waiter(redis_client, name, ttl=10, timeout=30, fair=False)
    lock.release()
    assert got.wait(5)
    t.join(5)


def test_barging_threads_lose_no_update(name: str) -> None:
    lock = locks.lock(name, ttl=10, fair=False, timeout=30)
    counter = 0
    inside = 0
    overlaps = 0

    def work() -> None:
        nonlocal counter, inside, overlaps
        for _ in range(150):
            with lock:
                inside += 1
                overlaps += inside != 1
                value = counter
                time.sleep(0)
                counter = value + 1
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert counter == 600 and overlaps == 0
    assert locks.get(name) is None


def test_fair_must_be_a_bool(name: str) -> None:
    with pytest.raises(TypeError, match="fair must be True or False"):
        locks.lock(name, fair="no")  # type: ignore[arg-type]
