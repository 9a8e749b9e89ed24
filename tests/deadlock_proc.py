"""Children of tests/test_deadlock.py: ``python -m tests.deadlock_proc COMMAND ...``.

* ``cycle FIRST SECOND DEADLOCK_TIMEOUT``: hold *FIRST*, print ``holding``, wait for a
  line on stdin, then take *SECOND* (with ``deadlock_timeout``); print ``deadlock
  <seconds waited>`` or ``acquired <seconds waited>`` (or ``timeout``), then ``done``.
* ``nest PREFIX SECONDS SEED``: print ``ready``, wait for a line, then for *SECONDS*
  nest random pairs of ``PREFIX0`` .. ``PREFIX5`` in one global order (smaller name
  outside) with a short ``deadlock_timeout``; print ``done <nests> <refusals>``.
* ``hold NAME TTL LOCK_DELAY``: hold *NAME* (``-``: no lock_delay), print ``acquired``,
  then sleep until killed (for tests/test_lock_delay.py).
"""

from __future__ import annotations

import os
import random
import sys
import time


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def cycle(first: str, second: str, deadlock_timeout: str) -> None:
    """Run as described in the module docstring."""
    _setup()
    from django_redislock import LockDeadlock, LockNotAcquired, locks

    with locks.lock(first, ttl=30):
        print("holding", flush=True)
        sys.stdin.readline()
        started = time.monotonic()
        try:
            with locks.lock(second, ttl=30, timeout=30, deadlock_timeout=float(deadlock_timeout)):
                print("acquired", time.monotonic() - started, flush=True)
        except LockDeadlock:
            print("deadlock", time.monotonic() - started, flush=True)
        except LockNotAcquired:
            print("timeout", time.monotonic() - started, flush=True)
    print("done", flush=True)


def nest(prefix: str, seconds: str, seed: str) -> None:
    """Run as described in the module docstring."""
    _setup()
    from django_redislock import LockError, locks

    rng = random.Random(int(seed))
    names = [f"{prefix}{i}" for i in range(6)]
    print("ready", flush=True)
    sys.stdin.readline()
    nests = refusals = 0
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        outer, inner = sorted(rng.sample(names, 2))
        try:
            with locks.lock(outer, ttl=30, timeout=30, deadlock_timeout=0.05):
                with locks.lock(inner, ttl=30, timeout=30, deadlock_timeout=0.05):
                    time.sleep(rng.uniform(0, 0.01))
            nests += 1
        except LockError as error:
            refusals += 1
            print("refused", repr(error), file=sys.stderr, flush=True)
    print("done", nests, refusals, flush=True)


def hold(name: str, ttl: str, lock_delay: str) -> None:
    """Hold *name* (renewed; *lock_delay* seconds, "-" for none), print ``acquired``,
    then wait to be killed."""
    _setup()
    from django_redislock import locks

    delay = None if lock_delay == "-" else float(lock_delay)
    with locks.lock(name, ttl=float(ttl), lock_delay=delay):
        print("acquired", flush=True)
        time.sleep(600)


_COMMANDS = {"cycle": cycle, "nest": nest, "hold": hold}


if __name__ == "__main__":
    _COMMANDS[sys.argv[1]](*sys.argv[2:])
