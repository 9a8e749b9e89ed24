"""A child of tests/test_lock_many.py:
``python -m tests.lock_many_proc PREFIX SECONDS SEED [CLUSTER_URL]``.

For *SECONDS* it takes random pairs and triples of the ten names ``PREFIX0`` ..
``PREFIX9`` with ``locks.lock_many`` (listed in random order), and inside each set
records its entry on the test Redis (not the one under test, when *CLUSTER_URL* names
a Redis Cluster to lock on): ``INCR`` of a counter per name, which must be 1 (else
``INCR`` of ``PREFIXviolations``), and ``DECR`` before leaving. Prints ``ready``,
waits for a line on stdin (so every child starts together), and at the end prints
``done <sets taken> <sets that timed out>``.
"""

from __future__ import annotations

import os
import random
import sys
import time

#: How long one lock_many may wait: a deadlock would show as sets timing out.
SET_TIMEOUT = 15.0


def main(prefix: str, seconds: str, seed: str, cluster_url: str = "") -> None:
    """Run as described in the module docstring."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import redis
    from django.conf import settings

    from django_redislock import LockManager, LockNotAcquired, locks

    manager = locks
    if cluster_url:
        manager = LockManager(client=redis.RedisCluster.from_url(cluster_url, socket_timeout=5))
    recorder = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)
    rng = random.Random(int(seed))
    names = [f"{prefix}{i}" for i in range(10)]
    print("ready", flush=True)
    sys.stdin.readline()
    taken = timed_out = 0
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        chosen = rng.sample(names, rng.choice((2, 3)))
        try:
            with manager.lock_many(chosen, ttl=10, timeout=SET_TIMEOUT):
                for name in chosen:
                    if recorder.incr(f"{prefix}inside:{name}") != 1:
                        recorder.incr(f"{prefix}violations")
                time.sleep(rng.uniform(0, 0.003))
                for name in chosen:
                    recorder.decr(f"{prefix}inside:{name}")
            taken += 1
        except LockNotAcquired:
            timed_out += 1
    print("done", taken, timed_out, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
