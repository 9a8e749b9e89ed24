"""Auto-renewal: leases outlive their TTL while held, losses are reported, forks are safe."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

from django_redislock import LockLost, LockManager, signals
from django_redislock.engine.watchdog import watchdog
from tests.redis_server import RedisServer


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_held_lock_is_renewed_past_its_ttl(manager: LockManager, name: str) -> None:
    lock = manager.lock(name, ttl=0.3)
    with lock:
        # Wait for several renewals (each at ~ttl/3) by watching the lease refresh.
        renewals = 0
        last = lock.ttl()
        deadline = time.monotonic() + 5
        while renewals < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
            now = lock.ttl()
            assert now is not None, "lease expired although the watchdog should renew it"
            renewals += now > last + 0.02
            last = now
        assert renewals >= 4
        assert lock.owned() and not lock.lost


def test_without_auto_renew_the_lease_expires(manager: LockManager, name: str) -> None:
    lock = manager.lock(name, ttl=0.2, auto_renew=False)
    lock.acquire()
    _wait_until(lambda: not lock.locked(), 5, "lease expiry")
    with pytest.raises(LockLost):
        lock.__exit__(None, None, None)


def test_renewal_that_finds_lock_gone_marks_it_lost(manager: LockManager, name: str) -> None:
    lost = threading.Event()
    reasons: list[str] = []

    def on_lost(**kwargs) -> None:
        reasons.append(kwargs["reason"])
        lost.set()

    signals.lock_lost.connect(on_lost)
    try:
        with pytest.raises(LockLost):
            with manager.lock(name, ttl=0.3) as lock:
                manager.force_release(name)
                manager.lock(name, owner="intruder").acquire()
                assert lost.wait(5), "lock_lost was not sent"
                assert lock.lost
    finally:
        signals.lock_lost.disconnect(on_lost)
    assert "no longer held" in reasons[0]
    # The intruder's lock was not touched by our exit.
    assert manager.get(name).owner == "intruder"
    manager.lock(name, owner="intruder").release()


def _watching(name: str) -> bool:
    """Whether the watchdog renews a hold of the lock *name* (other tests' holds, in
    this process, may be renewed meanwhile: the count of all of them says nothing)."""
    return any(entry.name == name for entry in watchdog.entries())


def test_garbage_collected_lock_is_no_longer_renewed(manager: LockManager, name: str) -> None:
    lock = manager.lock(name, ttl=0.3)
    lock.acquire()
    assert _watching(name)
    del lock
    _wait_until(lambda: not _watching(name), 5, "the orphaned entry to be dropped")
    _wait_until(lambda: manager.get(name) is None, 5, "the orphaned lease to expire")


@pytest.mark.parametrize("scripts", ["known", "flushed"])
def test_a_lock_dropped_while_held_is_freed_at_once(
    manager: LockManager, name: str, redis_client, scripts: str
) -> None:
    """No reference cycle keeps a dropped Lock alive (and renewed) until the cyclic
    garbage collector runs: not its calls, and not the error reply (NOSCRIPT) its first
    script meets on a server that has not seen the script (a restart, a failover).
    (An asyncio Lock was not kept by that cycle: a finished coroutine's frame does not
    link to its caller's.)"""
    with manager.lock(f"{name}:warm"):  # the scripts loaded, the connections made
        pass
    if scripts == "flushed":
        redis_client.script_flush()
    gc.disable()
    try:
        lock = manager.lock(name, ttl=0.3)
        assert lock.acquire(blocking=False)
        collected = weakref.ref(lock)
        del lock
        assert collected() is None
    finally:
        gc.enable()
    _wait_until(lambda: not _watching(name), 5, "the orphaned entry to be dropped")
    _wait_until(lambda: manager.get(name) is None, 5, "the orphaned lease to expire")


@pytest.mark.parametrize("fault", ["noscript", "a-master-down"])
def test_a_redlock_lock_dropped_while_held_is_freed_at_once(
    masters: list[RedisServer], name: str, fault: str
) -> None:
    """The same on Redlock: neither the error reply (NOSCRIPT) of masters that have
    not seen the script, nor the connection error of a master that is down, may keep
    the frames of the call -- and the Lock in them -- alive through its traceback."""
    manager = LockManager(redlock_caches=[f"{s.url}?socket_timeout=5" for s in masters])
    if fault == "a-master-down":
        with manager.lock(f"{name}:warm"):  # the scripts loaded, the connections made
            pass
        masters[2].stop()
    gc.disable()
    try:
        lock = manager.lock(name, ttl=0.3)
        assert lock.acquire(blocking=False)  # a quorum: two masters of three
        collected = weakref.ref(lock)
        del lock
        assert collected() is None, "the dropped Lock is kept alive (and renewed)"
    finally:
        gc.enable()
    _wait_until(lambda: not _watching(name), 5, "the orphaned entry to be dropped")


def test_watchdog_stops_when_nothing_is_held(manager: LockManager, name: str) -> None:
    with manager.lock(name, ttl=30):
        assert watchdog.running
    # Well before the next renewal would be due (10 s): the thread exits on its own.
    _wait_until(lambda: not watchdog.running, 5, "the watchdog thread to exit")
    assert watchdog.watched() == 0


def test_many_locks_are_renewed_together(manager: LockManager, name: str) -> None:
    held = [manager.lock(f"{name}:{i}", ttl=0.3) for i in range(50)]
    for lock in held:
        lock.acquire()
    time.sleep(0)  # let the watchdog run
    _wait_until(lambda: all(lock.ttl() > 0.25 for lock in held), 5, "renewal of all locks")
    # Hold past several leases; none may expire.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert all(lock.ttl() is not None for lock in held[:5])
        time.sleep(0.05)
    assert all(lock.owned() for lock in held)
    for lock in held:
        lock.release()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_neither_renews_nor_releases_parents_lock(
    manager: LockManager, name: str
) -> None:
    lock = manager.lock(name, ttl=0.6)
    lock.acquire()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        outcome = "?"
        try:
            os.close(read_fd)
            results = [
                "watchdog-idle"
                if not watchdog.running and watchdog.watched() == 0
                else "watchdog-busy",
                "owned" if lock.owned() else "not-owned",
            ]
            try:
                lock.release()
                results.append("released")
            except Exception as exc:
                results.append(type(exc).__name__)
            outcome = ",".join(results)
        finally:
            os.write(write_fd, outcome.encode())
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        outcome = pipe.read()
    os.waitpid(pid, 0)
    assert outcome == "watchdog-idle,not-owned,LockNotOwned"
    # The parent still holds and renews it past its lease.
    time.sleep(0.8)
    assert lock.owned()
    lock.release()


def test_a_held_lock_collected_mid_round_does_not_stop_the_watchdog(
    manager: LockManager, name: str
) -> None:
    # A Lock dropped while held is unwatched by its weakref callback, which marks
    # the entry inactive and then waits for the watchdog's condition. If the
    # watchdog's round runs first, it finds the entry's lock gone; when that was
    # the only entry, the round used to wait(inf) and the thread died
    # (OverflowError), so no lock of the process was renewed any more. The
    # callback's first step is replayed here, then the round is woken.
    import gc

    lock = manager.lock(f"{name}:dropped", ttl=30)
    lock.acquire()
    entry = lock._holds.get(lock.owner).watch
    entry.active = False  # the callback's first step: it will not unwatch now
    del lock
    gc.collect()
    with watchdog._cond:
        watchdog._cond.notify_all()
    time.sleep(0.2)  # the round runs
    assert watchdog.running
    # And it still renews.
    kept = manager.lock(name, ttl=0.3)
    with kept:
        time.sleep(0.6)
        assert kept.owned() and not kept.lost


#: A fresh process that takes an auto-renewed hold (kept by a global, as a script's
#: or a command's would be) and ends without releasing it.
_EXIT_HOLDING = """
import sys, django
django.setup()
from django_redislock import locks
name, kind = sys.argv[1], sys.argv[2]
if kind == "write":
    held = locks.rw_lock(name, ttl=60).write()
elif kind == "permit":
    held = locks.semaphore(name, 2, ttl=60)
else:
    held = locks.lock(name, ttl=60)
assert held.acquire(timeout=10)
"""


@pytest.mark.slow
def test_processes_that_exit_holding_a_renewed_lock_never_hang(name: str) -> None:
    """At interpreter exit the held Lock is collected and its entry unwatched, while
    the stopped daemon watchdog thread may hold the watchdog's condition for ever:
    the exit must not wait for it. 48 fresh processes, 4 at a time (2 cores), each
    bounded; one that has not exited in time has hung."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(root))
    kinds = ["mutex", "write", "permit"]
    for batch in range(12):
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _EXIT_HOLDING, f"{name}:{batch}:{i}", kinds[i % 3]],
                cwd=root,
                env=env,
            )
            for i in range(4)
        ]
        try:
            deadline = time.monotonic() + 30
            codes = [p.wait(max(0.1, deadline - time.monotonic())) for p in procs]
        except subprocess.TimeoutExpired:
            pytest.fail(f"a process holding a renewed lock hung at exit (batch {batch})")
        finally:
            for p in procs:
                p.kill()
                p.wait(5)
        assert codes == [0, 0, 0, 0]
