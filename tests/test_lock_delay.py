"""``lock_delay``: a lock whose holder vanished without releasing stays taken for the
delay after the holder's own lease ran out, so the holder's in-flight writes land
before anyone else holds it; a release frees it at once; the history shows it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_redislock import LockError, LockManager, locks
from tests.test_multiprocess import _expect_line

ROOT = Path(__file__).resolve().parent.parent
TTL = 1.0


def _taken_over_after_kill(name: str, lock_delay: str) -> float:
    """Seconds from SIGKILLing a renewing holder (lease TTL) to another holder's grant."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.deadlock_proc", "hold", name, str(TTL), lock_delay],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _expect_line(child, "acquired", 60)
        time.sleep(0.5)  # a renewal or so
        killed = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        waiter = locks.lock(name, ttl=30)
        assert waiter.acquire(timeout=15)
        took = time.monotonic() - killed
        waiter.release()
        return took
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.slow
def test_a_vanished_holders_lock_stays_taken_for_the_delay(name: str) -> None:
    delay = 2.0
    plain = _taken_over_after_kill(f"{name}:plain", "-")
    delayed = _taken_over_after_kill(f"{name}:delayed", str(delay))
    # The key outlives the last renewal (at most TTL/3 before the kill) by TTL (+ delay).
    assert plain < TTL + 0.8, plain
    assert 2 / 3 * TTL + delay - 0.1 <= delayed < TTL + delay + 0.8, delayed
    expired = [e for e in locks.history(f"{name}:delayed") if e.event == "expired"]
    assert expired and expired[0].holder_meta.get("lock_delay") == delay


def test_a_release_frees_the_lock_at_once(name: str) -> None:
    with locks.lock(name, ttl=TTL, lock_delay=5):
        pass
    assert locks.lock(name, owner="next").acquire(blocking=False)


def test_the_holder_counts_itself_lost_by_its_ttl_not_the_delay(name: str) -> None:
    lock = locks.lock(name, ttl=3, lock_delay=7)
    with lock:
        info = locks.get(name)
        assert info is not None and info.ttl is not None and 9.5 < info.ttl <= 10.0
        hold = lock._holds.get(lock.owner)
        assert hold is not None and hold.watch is not None
        entry = hold.watch
        assert entry.lost_at - entry.confirmed_at <= 3.0  # the ttl, less a margin
        assert entry.call.args[1] == 10_000  # each renewal sets ttl + delay in Redis
        assert lock.reacquire() and locks.get(name).ttl > 9.5  # type: ignore[union-attr]


def test_misuse_is_refused_with_a_named_error(name: str) -> None:
    with pytest.raises(ValueError, match="mutexes"):
        locks.semaphore(name, limit=2, lock_delay=1)
    with pytest.raises(ValueError, match="with a ttl"):
        locks.lock(name, ttl=None, no_expiry=True, lock_delay=1)
    with pytest.raises(ValueError):
        locks.lock(name, lock_delay=-1)
    from tests.redis_server import RedisServer

    servers = [RedisServer() for _ in range(3)]
    try:
        m = LockManager(redlock_caches=[f"{s.url}?socket_timeout=5" for s in servers])
        with pytest.raises(LockError, match="lock_delay needs one Redis"):
            m.lock(name, lock_delay=1).acquire()
    finally:
        for server in servers:
            server.stop()
