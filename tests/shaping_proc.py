"""A child process of the shaping tests: ``python -m tests.shaping_proc MODE NAME ...``.

It sets up Django with ``tests.settings`` (the parent's Redis, through
``REDISLOCK_TEST_REDIS_URL``), starts THREADS callers of one guarded function and,
once the parent pushes ``go`` to GATE, lets them call it for SECONDS. Each run of
the body appends ``start <µs> <µs before the call> <pid>`` and ``end <µs> <pid>``
(Redis's clock: the caller reads it just before the call, the body when it starts
and before it returns; a recorder outside the guard) to the list RECORDER. So the
start was admitted between the two times of its ``start`` entry, and its cooldown
set after its ``end``. A refused call (the rate, the cooldown, or the key held)
waits 10-40 ms and calls again.

``REDISLOCK_TEST_SHAPING_FAULT`` names deliberate faults of the guard to install
(tests/shaping_faults.py), for the tests that check their checkers fail.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time


def main(mode: str, name: str, spec: str, seconds: str, threads: str, recorder: str) -> None:
    """Call the function guarded by *mode* (``rate``: *spec* is the rate; ``cooldown``:
    *spec* is the cooldown in seconds) from *threads* threads for *seconds*."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import redis

    from tests import shaping_faults

    shaping_faults.install()  # a test's deliberately broken guard (none by default)
    from django.conf import settings

    from django_redislock import LockNotAcquired, single_instance

    probe = redis.Redis.from_url(settings.REDIS_URL)
    pid = os.getpid()
    options: dict[str, object] = {"ttl": 10}
    if mode == "rate":
        options["rate"] = spec
    else:
        options["cooldown"] = float(spec)

    def now_us() -> int:
        s, us = probe.time()
        return int(s) * 1_000_000 + int(us)

    @single_instance(name, **options)  # type: ignore[arg-type]
    def body(before: int) -> None:
        probe.rpush(recorder, f"start {now_us()} {before} {pid}")
        time.sleep(0.005)
        probe.rpush(recorder, f"end {now_us()} {pid}")

    runs = 0
    lock = threading.Lock()

    def caller() -> None:
        nonlocal runs
        deadline = time.monotonic() + float(seconds)
        while time.monotonic() < deadline:
            try:
                body(now_us())
            except LockNotAcquired:  # RunLimited too
                time.sleep(random.uniform(0.01, 0.04))
                continue
            with lock:
                runs += 1

    print("ready", flush=True)
    assert probe.blpop([f"{recorder}:go"], timeout=60) is not None, "no go"
    workers = [threading.Thread(target=caller) for _ in range(int(threads))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print("done", runs, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
