"""Blocked waiters: woken by the release, FIFO, deadlines kept, leases of dead holders noticed."""

from __future__ import annotations

import threading
import time

import pytest

from django_redislock import LockManager, signals

# Generous upper bounds: these tests check that a waiter is woken by an event
# rather than by a long poll (the poll slice is ~1 s); speed is in benchmarks/.
WAKE_BOUND = 0.5


def _start_waiter(
    manager: LockManager, name: str, results: list, **acquire_kwargs
) -> threading.Thread:
    def run() -> None:
        lock = manager.lock(name)
        started = time.monotonic()
        acquired = lock.acquire(**acquire_kwargs)
        results.append((acquired, time.monotonic(), time.monotonic() - started, lock.fencing_token))
        if acquired:
            lock.release()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_for_queue(manager: LockManager, name: str, length: int, timeout: float = 5.0) -> None:
    """Block until *length* waiters are queued on *name* (bounded)."""
    queue_key = manager.backend().keyspace.keys(name).queue
    deadline = time.monotonic() + timeout
    while manager.client.llen(queue_key) < length:
        assert time.monotonic() < deadline, f"fewer than {length} waiters queued on {name}"
        time.sleep(0.005)


def test_release_hands_lock_to_waiter_promptly(manager: LockManager, name: str) -> None:
    holder = manager.lock(name, owner="holder")
    holder.acquire()
    fence_before = holder.fencing_token
    results: list = []
    thread = _start_waiter(manager, name, results, timeout=10)
    _wait_for_queue(manager, name, 1)
    released_at = time.monotonic()
    holder.release()
    thread.join(10)
    acquired, at, _, fence = results[0]
    assert acquired
    assert at - released_at < WAKE_BOUND
    assert fence > fence_before


def test_waiters_are_served_first_come_first_served(manager: LockManager, name: str) -> None:
    holder = manager.lock(name, owner="holder")
    holder.acquire()
    order: list[int] = []
    threads = []
    for i in range(4):

        def run(i: int = i) -> None:
            with manager.lock(name, timeout=20):
                order.append(i)

        thread = threading.Thread(target=run)
        thread.start()
        threads.append(thread)
        _wait_for_queue(manager, name, i + 1)
    # A newcomer trying without waiting does not jump the queue.
    assert not manager.lock(name, owner="newcomer").acquire(blocking=False)
    holder.release()
    for thread in threads:
        thread.join(20)
    assert order == [0, 1, 2, 3]


def test_timeout_is_kept_and_leaves_no_queue_entry(
    manager: LockManager, name: str, redis_client
) -> None:
    holder = manager.lock(name, owner="holder")
    holder.acquire()
    results: list = []
    thread = _start_waiter(manager, name, results, timeout=0.3)
    thread.join(10)
    acquired, _, elapsed, _ = results[0]
    assert not acquired
    assert 0.3 <= elapsed < 0.3 + WAKE_BOUND
    keys = manager.backend().keyspace.keys(name)
    assert redis_client.llen(keys.queue) == 0
    assert redis_client.hlen(keys.waiters) == 0
    holder.release()
    assert not holder.locked()


def test_waiter_notices_expired_lease_of_dead_holder(manager: LockManager, name: str) -> None:
    # A holder that "crashed": acquired with a short lease and never released.
    dead = manager.lock(name, owner="crashed-holder", ttl=0.4, auto_renew=False)
    dead.acquire()
    results: list = []
    thread = _start_waiter(manager, name, results, timeout=10)
    thread.join(15)
    acquired, _, elapsed, _ = results[0]
    assert acquired
    # Woken by the lease it was told about, not by the ~1 s fallback poll.
    assert elapsed < 0.4 + WAKE_BOUND


def test_dead_waiter_in_queue_is_skipped(manager: LockManager, name: str, redis_client) -> None:
    holder = manager.lock(name, owner="holder")
    holder.acquire()
    keys = manager.backend().keyspace.keys(name)
    # A waiter whose process died: queued, but its entry expired long ago.
    redis_client.rpush(keys.queue, "ghost")
    redis_client.hset(keys.waiters, "ghost", "1|30000|nowhere|n0|{}")
    results: list = []
    thread = _start_waiter(manager, name, results, timeout=10)
    _wait_for_queue(manager, name, 2)
    holder.release()
    thread.join(10)
    assert results[0][0]
    assert redis_client.llen(keys.queue) == 0


def test_force_release_wakes_the_next_waiter(manager: LockManager, name: str) -> None:
    manager.lock(name, owner="stuck").acquire()
    results: list = []
    thread = _start_waiter(manager, name, results, timeout=10)
    _wait_for_queue(manager, name, 1)
    started = time.monotonic()
    assert manager.force_release(name)
    thread.join(10)
    assert results[0][0]
    assert results[0][1] - started < WAKE_BOUND


def test_contended_signal_fires_once_per_attempt(manager: LockManager, name: str) -> None:
    seen: list[dict] = []

    def receiver(**kwargs) -> None:
        seen.append(kwargs)

    signals.lock_contended.connect(receiver)
    try:
        holder = manager.lock(name, owner="holder", ttl=20)
        holder.acquire()
        assert not manager.lock(name).acquire(timeout=0.1)
        assert not manager.lock(name).acquire(blocking=False)
    finally:
        signals.lock_contended.disconnect(receiver)
    assert len(seen) == 2
    assert all(s["name"] == name and 0 < s["pttl"] <= 20 for s in seen)


def test_acquire_released_signals(manager: LockManager, name: str) -> None:
    events: list[tuple] = []

    def on_acquired(**kw) -> None:
        events.append(("acquired", kw["hold_count"], kw["fencing_token"]))

    def on_released(**kw) -> None:
        events.append(("released", kw["hold_count"]))

    signals.lock_acquired.connect(on_acquired)
    signals.lock_released.connect(on_released)
    try:
        with manager.lock(name) as lock:
            with manager.lock(name):
                assert manager.get(name).hold_count == 2
        assert lock.fencing_token is None
    finally:
        signals.lock_acquired.disconnect(on_acquired)
        signals.lock_released.disconnect(on_released)
    token = events[0][2]
    assert events == [
        ("acquired", 1, token),
        ("acquired", 2, token),
        ("released", 1),
        ("released", 0),
    ]


@pytest.mark.slow
def test_many_threads_no_two_holders(manager: LockManager, name: str, redis_client) -> None:
    inside = 0
    overlaps = 0
    guard = threading.Lock()
    counter_key = f"{name}:counter"

    def work() -> None:
        nonlocal inside, overlaps
        lock = manager.lock(name, timeout=30)
        for _ in range(40):
            with lock:
                with guard:
                    inside += 1
                    overlaps += inside > 1
                value = int(redis_client.get(counter_key) or 0)
                redis_client.set(counter_key, value + 1)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert overlaps == 0
    assert int(redis_client.get(counter_key)) == 240


def test_waiters_on_different_locks_in_one_process_are_all_woken(manager: LockManager) -> None:
    # One pub/sub connection per process, read by whichever waiter is reading:
    # every thread must still get its own hand-off promptly.
    names = [f"multi:{i}" for i in range(4)]
    holders = [manager.lock(n, owner=f"holder-{i}") for i, n in enumerate(names)]
    for holder in holders:
        holder.acquire()
    results: dict[str, list] = {n: [] for n in names}
    threads = [_start_waiter(manager, n, results[n], timeout=10) for n in names]
    for n in names:
        _wait_for_queue(manager, n, 1)
    for n, holder in reversed(list(zip(names, holders, strict=True))):
        released_at = time.monotonic()
        holder.release()
        deadline = time.monotonic() + 5
        while not results[n] and time.monotonic() < deadline:
            time.sleep(0.002)
        assert results[n] and results[n][0][0], f"{n} was not acquired"
        assert results[n][0][1] - released_at < WAKE_BOUND
    for thread in threads:
        thread.join(10)


def test_reader_that_gives_up_passes_reading_on(manager: LockManager) -> None:
    short, long_ = "reader:short", "reader:long"
    manager.lock(short, owner="h1").acquire()
    long_holder = manager.lock(long_, owner="h2")
    long_holder.acquire()
    quick: list = []
    patient: list = []
    t_quick = _start_waiter(manager, short, quick, timeout=0.3)
    _wait_for_queue(manager, short, 1)
    t_patient = _start_waiter(manager, long_, patient, timeout=10)
    _wait_for_queue(manager, long_, 1)
    t_quick.join(5)
    assert quick and not quick[0][0]
    # The waiter that read the subscription is gone; the other must read now,
    # or it would only notice its hand-off at its ~1 s fallback poll.
    released_at = time.monotonic()
    long_holder.release()
    t_patient.join(10)
    assert patient[0][0]
    assert patient[0][1] - released_at < WAKE_BOUND
