"""Child-process programs for the multi-process tests: ``python -m tests.proc COMMAND ...``.

Each child sets up Django with ``tests.settings`` (reusing the parent's Redis
through ``REDISLOCK_TEST_REDIS_URL``) and reports on stdout, one line per event.
"""

from __future__ import annotations

import os
import sys
import threading
import time


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def _say(*parts: object) -> None:
    print(*parts, flush=True)


def count(name: str, iterations: str, counter_key: str, inside_key: str) -> None:
    """Do *iterations* non-atomic read-modify-writes of *counter_key* under the lock."""
    import redis
    from django.conf import settings

    from django_redislock import locks

    r = redis.Redis.from_url(settings.REDIS_URL)
    lock = locks.lock(name, timeout=60)
    overlaps = 0
    for _ in range(int(iterations)):
        with lock:
            if r.incr(inside_key) != 1:
                overlaps += 1
            value = int(r.get(counter_key) or 0)
            r.set(counter_key, value + 1)
            r.decr(inside_key)
    _say("done", overlaps)


def hold(name: str, ttl: str, auto_renew: str) -> None:
    """Acquire *name*, report the fencing token, then wait to be killed."""
    from django_redislock import locks

    lock = locks.lock(name, ttl=float(ttl), auto_renew=auto_renew == "1")
    lock.acquire()
    _say("acquired", lock.fencing_token)
    time.sleep(600)


def hold_until_lost(name: str, ttl: str) -> None:
    """Hold *name* with auto-renew; report when the watchdog finds it lost, then exit the block."""
    from django_redislock import LockLost, locks, signals

    lost = threading.Event()
    signals.lock_lost.connect(lambda **kw: lost.set(), weak=False)
    try:
        with locks.lock(name, ttl=float(ttl)) as lock:
            _say("acquired", lock.fencing_token)
            if not lost.wait(60):
                _say("never-lost")
                return
            _say("lost", lock.fencing_token)
    except LockLost:
        _say("LockLost")


def wait_for(name: str, ttl: str) -> None:
    """Wait for *name* (blocking, lease *ttl*), report when acquired, then hold it."""
    from django_redislock import locks

    lock = locks.lock(name, ttl=float(ttl))
    _say("waiting")
    lock.acquire()
    _say("acquired", lock.fencing_token)
    time.sleep(600)


def wait_timed(kind: str, name: str, ttl: str) -> None:
    """Wait for the mutex (*kind* ``lock``) or one-permit semaphore (``semaphore``)
    *name*, after a first, short wait that subscribes this process's wake-up hub (as
    a worker that waited before); report ``acquired <token> <time.monotonic()>``
    (system-wide on Linux: the parent compares it), then hold it."""
    from django_redislock import locks

    if kind == "lock":
        lock = locks.lock(name, ttl=float(ttl))
    else:
        lock = locks.semaphore(name, 1, ttl=float(ttl))
    if lock.acquire(timeout=0.05):
        _say("unexpected", "the lock was free")
        return
    _say("waiting")
    lock.acquire()
    _say("acquired", lock.fencing_token, repr(time.monotonic()))
    time.sleep(600)


if __name__ == "__main__":
    _setup()
    command, *args = sys.argv[1:]
    programs = {"count": count, "hold": hold, "hold_until_lost": hold_until_lost}
    programs["wait_for"] = wait_for
    programs["wait_timed"] = wait_timed
    programs[command](*args)
